// What the emulated NCCL's three parts share (internal to emulator/src): the state of
// communicators and collectives, the process-wide table that holds it, and the way a
// call reports an error. nccl.cpp is the API (the nccl* entry points: arguments checked,
// errors reported, groups); nccl_rendezvous.cpp is how ranks meet (unique ids,
// communicators created, joined and left, the timeout); nccl_collectives.cpp is what
// the ranks' stream workers run (all-reduce, reduce-scatter, all-gather).
//
// Ranks must be threads of ONE process: a unique id is a number in this process's
// rendezvous table, stamped with the process id and a random number drawn at
// start-up; ncclCommInitRank refuses an id stamped by another process.
//
// Shapes of the state:
//   - a Clique is one communicator as a whole: its ranks (the ncclComm of each), the
//     ranks that left (aborted or destroyed), and the collectives under way, by their
//     sequence number (the k-th collective each rank queues is the same collective);
//   - a Collective is where the ranks' operations meet: each records its call, the
//     last to arrive combines the send buffers into `result` (the whole combined
//     buffer; the all-gather's: the send buffers one after the other) and each copies
//     its part (the whole, or its block of a reduce-scatter) into its receive buffer.
// ThreadSanitizer: everything but a Collective's own mutex is bookkeeping, touched
// inside Hidden scopes under one process-wide mutex, so that host threads calling
// NCCL, and the ranks' workers looking things up, order nothing. A Collective's
// mutex is locked only by the workers of its participants (and, Hidden, by an abort):
// the acquire and release it makes between them are the ordering a real collective
// makes, each rank's result depending on every rank's input.
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "internal.h"

namespace tlemu::detail::nccl {

using Clock = std::chrono::steady_clock;

// --- names (nccl.cpp) -----------------------------------------------------------------------

const char* result_name(ncclResult_t r);
const char* type_name(ncclDataType_t t);
// Bytes per element of the emulated types; 0 for the others.
std::size_t type_size(ncclDataType_t t);
const char* op_name(ncclRedOp_t op);
std::string seconds(std::chrono::milliseconds d);
std::string rank_list(const std::vector<int>& ranks);  // "0, 2 and 3"

// How long a rank waits for the others (TOWERLAB_EMULATED_NCCL_TIMEOUT_S, or
// tlemu::set_nccl_timeout); nccl_rendezvous.cpp.
std::chrono::milliseconds timeout();

// --- state --------------------------------------------------------------------------------------

// Which collective a call is; the k-th call of every rank must be the same kind.
enum class Kind { AllReduce, ReduceScatter, AllGather };
const char* kind_name(Kind kind);  // "ncclAllReduce", ...

// One rank's call. `count` is NCCL's: the all-reduce's length, the reduce-scatter's
// recvcount (sendbuff holds nranks * count), the all-gather's sendcount (recvbuff
// holds nranks * count). An all-gather has no operation (op is left ncclSum).
struct Call {
  Kind kind = Kind::AllReduce;
  std::size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  const void* send = nullptr;
  void* recv = nullptr;
};

struct Collective {
  explicit Collective(int nranks)
      : arrived(std::size_t(nranks)), released(std::size_t(nranks)), calls(std::size_t(nranks)) {}
  // The participants' meeting point; not Hidden (see the top).
  std::mutex m;
  std::condition_variable cv;
  enum class State { Gathering, Done, Failed } state = State::Gathering;
  std::vector<bool> arrived;
  std::vector<bool> released;  // ranks that left (abort, destroy) while they waited in it
  std::vector<Call> calls;
  int arrivals = 0;
  int first = -1;      // the first rank to arrive: the others' calls are compared with its
  int departures = 0;  // ranks whose operation has finished with it
  ncclResult_t error = ncclSuccess;
  std::string message;
  std::vector<unsigned char> result;
};

struct Clique {
  std::uint64_t serial = 0;
  int nranks = 0;
  std::string name;                // commName, for messages
  std::vector<ncclComm*> members;  // by rank; null until joined
  std::vector<std::string> gone;   // by rank: why it left ("" while it has not)
  int joined = 0;
  int first = -1;       // the first rank to join
  bool failed = false;  // initialization failed for every rank
  ncclResult_t error = ncclSuccess;
  std::string message;
  std::map<std::uint64_t, std::shared_ptr<Collective>> collectives;

  std::string label() const {
    return name.empty() ? "communicator #" + std::to_string(serial) : "communicator '" + name + "'";
    return name.empty() ? "communicator #" + std::to_string(serial) : "communicator '" + name + "'";
  }
};

}  // namespace tlemu::detail::nccl

struct ncclComm {
  std::shared_ptr<tlemu::detail::nccl::Clique> clique;
  int rank = 0;
  int nranks = 0;
  int device = 0;
  bool blocking = true;
  std::chrono::steady_clock::time_point init_deadline;
  std::uint64_t issued = 0;  // collectives queued so far
  int outstanding = 0;       // of those, the ones whose operation has not finished
  bool finalized = false;
  bool aborted = false;
  ncclResult_t async = ncclSuccess;
  std::string last;  // the last error's message
};

namespace tlemu::detail::nccl {

struct Table {
  std::mutex m;  // Hidden only
  std::condition_variable cv;
  std::uint64_t issued_ids = 0;
  std::map<std::uint64_t, std::shared_ptr<Clique>> rendezvous;  // cliques still joining
  std::set<std::uint64_t> used;                                 // ids whose clique completed
  std::map<ncclComm*, std::shared_ptr<ncclComm>> comms;
};

// Never destroyed: stream workers may still finish operations while the process exits.
inline Table& table() {
  static Table* t = new Table;
  return *t;
}

// --- errors (nccl.cpp) ----------------------------------------------------------------------

extern thread_local std::string t_last;  // the calling thread's last message

void print(ncclResult_t r, const std::string& message);
// A call's own error: printed, kept as the thread's last message and the comm's.
ncclResult_t report(ncclResult_t r, ncclComm* comm, const std::string& message);
// An asynchronous error: the communicator keeps the first. Under table().m.
void set_async_locked(ncclComm& comm, ncclResult_t r, const std::string& message);
void set_async(ncclComm& comm, ncclResult_t r, const std::string& message);
// The communicator `comm` points to; null when it is not a live one.
std::shared_ptr<ncclComm> live(const ncclComm* comm);

// --- groups (nccl.cpp) ----------------------------------------------------------------------

struct Group {
  int depth = 0;
  ncclResult_t error = ncclSuccess;
  std::vector<std::function<ncclResult_t()>> deferred;  // collectives, queued at the end
  std::vector<std::shared_ptr<ncclComm>> inits;         // blocking inits to wait for at the end
  bool nonblocking_init = false;                        // ncclGroupEnd says ncclInProgress
};
extern thread_local Group t_group;

// A call's result, kept as the group's error when the call is inside one.
ncclResult_t in_group(ncclResult_t r);

// --- the rendezvous (nccl_rendezvous.cpp) ---------------------------------------------------

// A new unique id, stamped with this process.
void new_unique_id(ncclUniqueId& id);
// ncclCommInitRank and ncclCommInitRankConfig (`call` names which, for messages).
ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                       const ncclConfig_t* config, const char* call);
// ncclCommInitAll's communicators, once its arguments are checked: rank i on devices[i].
void init_all(const std::vector<int>& devices, ncclComm_t* comms);
// Waits until every rank of comm's clique has joined; on failure (here or seen)
// removes comm and returns the error.
ncclResult_t wait_joined(const std::shared_ptr<ncclComm>& comm);
// Initialization fails for every rank of `q`. Under table().m.
void fail_clique_locked(Clique& q, ncclResult_t r, const std::string& message);
std::string missing_message(const Clique& q, std::chrono::milliseconds waited);
// A rank's membership ends (abort or destroy). The other ranks are not told, as on
// hardware, where NCCL's peers cannot know either: a collective they wait in with
// this rank fails at its timeout (which names the rank and why it left), or, as
// towerlab's communicator does, at the caller's own deadline.
void leave(const std::shared_ptr<ncclComm>& comm, const std::string& why);

// --- the collectives (nccl_collectives.cpp) -------------------------------------------------

// Queues comm's next collective (call.kind) on `stream` (checked by the caller).
ncclResult_t queue_collective(const std::shared_ptr<ncclComm>& comm, const Call& call,
                              cudaStream_t stream);

}  // namespace tlemu::detail::nccl
