// NCCL on the emulated GPUs (include/nccl.h): communicators whose ranks are threads
// of this process, and the all-reduce as a rendezvous of the ranks' stream workers.
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
//     last to arrive combines the send buffers into `result` and each copies it into
//     its own receive buffer.
// ThreadSanitizer: everything but a Collective's own mutex is bookkeeping, touched
// inside Hidden scopes under one process-wide mutex, so that host threads calling
// NCCL, and the ranks' workers looking things up, order nothing. A Collective's
// mutex is locked only by the workers of its participants (and, Hidden, by an abort):
// the acquire and release it makes between them are the ordering a real collective
// makes, each rank's result depending on every rank's input.
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <type_traits>

#include "internal.h"

namespace {

using tlemu::detail::Hidden;
using Clock = std::chrono::steady_clock;

// --- names ------------------------------------------------------------------------------------

const char* result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    case ncclNumResults:
      break;
  }
  return "an unknown ncclResult_t";
}

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return "ncclInt8";
    case ncclUint8:
      return "ncclUint8";
    case ncclInt32:
      return "ncclInt32";
    case ncclUint32:
      return "ncclUint32";
    case ncclInt64:
      return "ncclInt64";
    case ncclUint64:
      return "ncclUint64";
    case ncclFloat16:
      return "ncclFloat16";
    case ncclFloat32:
      return "ncclFloat32";
    case ncclFloat64:
      return "ncclFloat64";
    case ncclBfloat16:
      return "ncclBfloat16";
    case ncclNumTypes:
      break;
  }
  return "an unknown ncclDataType_t";
}

// Bytes per element of the emulated types; 0 for the others.
std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
      return "ncclSum";
    case ncclProd:
      return "ncclProd";
    case ncclMax:
      return "ncclMax";
    case ncclMin:
      return "ncclMin";
    case ncclAvg:
      return "ncclAvg";
    default:
      return "an unknown ncclRedOp_t";
  }
}

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream s;
  s << static_cast<double>(d.count()) / 1000.0 << " s";
  return s.str();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

// --- the timeout --------------------------------------------------------------------------------

std::atomic<long long>& timeout_setting() {
  static std::atomic<long long> ms{-1};  // -1: the environment not read yet
  return ms;
}

std::chrono::milliseconds timeout() {
  Hidden hidden;  // a test's setting orders nothing
  long long ms = timeout_setting().load();
  if (ms >= 0) return std::chrono::milliseconds(ms);
  long long from_env = 60'000;
  if (const char* s = std::getenv("TOWERLAB_EMULATED_NCCL_TIMEOUT_S")) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end == s || *end != '\0' || !(v > 0) || v > 1e6) {
      std::fprintf(stderr,
                   "emulated NCCL: TOWERLAB_EMULATED_NCCL_TIMEOUT_S=%s: expected seconds > 0 "
                   "(fractions allowed)\n",
                   s);
      std::exit(2);
    }
    from_env = static_cast<long long>(v * 1000.0 + 0.5);
    if (from_env < 1) from_env = 1;
  }
  timeout_setting().compare_exchange_strong(ms, from_env);
  return std::chrono::milliseconds(timeout_setting().load());
}

// --- state --------------------------------------------------------------------------------------

struct Call {
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
  }
};

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int nranks = 0;
  int device = 0;
  bool blocking = true;
  Clock::time_point init_deadline;
  std::uint64_t issued = 0;  // collectives queued so far
  int outstanding = 0;       // of those, the ones whose operation has not finished
  bool finalized = false;
  bool aborted = false;
  ncclResult_t async = ncclSuccess;
  std::string last;  // the last error's message
};

namespace {

struct Table {
  std::mutex m;  // Hidden only
  std::condition_variable cv;
  std::uint64_t issued_ids = 0;
  std::map<std::uint64_t, std::shared_ptr<Clique>> rendezvous;  // cliques still joining
  std::set<std::uint64_t> used;                                 // ids whose clique completed
  std::map<ncclComm*, std::shared_ptr<ncclComm>> comms;
};

// Never destroyed: stream workers may still finish operations while the process exits.
Table& table() {
  static Table* t = new Table;
  return *t;
}

std::uint64_t process_nonce() {
  static const std::uint64_t nonce = [] {
    std::random_device r;
    return (std::uint64_t{r()} << 32) ^ r() ^
           static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
  }();
  return nonce;
}

constexpr char kIdMagic[16] = "tlemu-nccl-id-1";
struct IdPayload {
  char magic[16];
  std::uint64_t pid;
  std::uint64_t nonce;
  std::uint64_t serial;
};
static_assert(sizeof(IdPayload) <= NCCL_UNIQUE_ID_BYTES);

// --- errors -------------------------------------------------------------------------------------

thread_local std::string t_last;      // the calling thread's last message
thread_local std::string t_returned;  // what ncclGetLastError returned, kept alive

void print(ncclResult_t r, const std::string& message) {
  std::fprintf(stderr, "emulated NCCL: %s: %s\n", result_name(r), message.c_str());
}

// A call's own error: printed, kept as the thread's last message and the comm's.
ncclResult_t report(ncclResult_t r, ncclComm* comm, const std::string& message) {
  print(r, message);
  t_last = message;
  if (comm != nullptr) {
    Hidden hidden;
    std::lock_guard lock(table().m);
    comm->last = message;
  }
  return r;
}

// An asynchronous error: the communicator keeps the first. Under table().m.
void set_async_locked(ncclComm& comm, ncclResult_t r, const std::string& message) {
  if (comm.async != ncclSuccess) return;
  comm.async = r;
  comm.last = message;
}

void set_async(ncclComm& comm, ncclResult_t r, const std::string& message) {
  Hidden hidden;
  std::lock_guard lock(table().m);
  set_async_locked(comm, r, message);
}

std::shared_ptr<ncclComm> live(const ncclComm* comm) {
  Hidden hidden;
  Table& t = table();
  std::lock_guard lock(t.m);
  auto it = t.comms.find(const_cast<ncclComm*>(comm));
  return it == t.comms.end() ? nullptr : it->second;
}

// Initialization fails for every rank of `q`. Under table().m.
void fail_clique_locked(Clique& q, ncclResult_t r, const std::string& message) {
  if (q.failed) return;
  q.failed = true;
  q.error = r;
  q.message = message;
  print(r, message);
  for (ncclComm* m : q.members)
    if (m != nullptr) set_async_locked(*m, r, message);
  table().cv.notify_all();
}

// The ranks of `q` that have not joined. Under table().m.
std::vector<int> missing_locked(const Clique& q) {
  std::vector<int> out;
  for (int r = 0; r < q.nranks; ++r)
    if (q.members[std::size_t(r)] == nullptr) out.push_back(r);
  return out;
}

std::string missing_message(const Clique& q, std::chrono::milliseconds waited) {
  const std::vector<int> missing = missing_locked(q);
  return "ncclCommInitRank on " + q.label() + " of " + std::to_string(q.nranks) + " ranks: rank" +
         (missing.size() > 1 ? "s " : " ") + rank_list(missing) + " did not join within " +
         seconds(waited) + " (TOWERLAB_EMULATED_NCCL_TIMEOUT_S); " +
         "every rank's thread must call ncclCommInitRank with the same unique id";
}

// --- groups -------------------------------------------------------------------------------------

struct Group {
  int depth = 0;
  ncclResult_t error = ncclSuccess;
  std::vector<std::function<ncclResult_t()>> deferred;  // collectives, queued at the end
  std::vector<std::shared_ptr<ncclComm>> inits;         // blocking inits to wait for at the end
  bool nonblocking_init = false;                        // ncclGroupEnd says ncclInProgress
};
thread_local Group t_group;

// A call's result, kept as the group's error when the call is inside one.
ncclResult_t in_group(ncclResult_t r) {
  if (t_group.depth > 0 && r != ncclSuccess && r != ncclInProgress &&
      t_group.error == ncclSuccess) {
    t_group.error = r;
  }
  return r;
}

// --- initialization -----------------------------------------------------------------------------

// Waits until every rank of comm's clique has joined; on failure (here or seen)
// removes comm and returns the error.
ncclResult_t wait_joined(const std::shared_ptr<ncclComm>& comm) {
  Hidden hidden;
  Table& t = table();
  std::unique_lock lock(t.m);
  Clique& q = *comm->clique;
  const bool done =
      t.cv.wait_until(lock, comm->init_deadline, [&] { return q.failed || q.joined == q.nranks; });
  if (!done) fail_clique_locked(q, ncclSystemError, missing_message(q, timeout()));
  if (!q.failed) return ncclSuccess;
  q.members[std::size_t(comm->rank)] = nullptr;
  t.comms.erase(comm.get());
  t_last = q.message;
  return q.error;
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                       const ncclConfig_t* config, const char* call) {
  if (out == nullptr)
    return report(ncclInvalidArgument, nullptr, std::string(call) + ": comm is null");
  *out = nullptr;
  bool blocking = true;
  std::string name;
  if (config != nullptr) {
    if (config->magic != 0xcafebeef) {
      return report(ncclInvalidArgument, nullptr,
                    std::string(call) + ": the config was not set up with NCCL_CONFIG_INITIALIZER");
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
        config->blocking != 1) {
      return report(ncclInvalidArgument, nullptr,
                    std::string(call) + ": config.blocking is " + std::to_string(config->blocking) +
                        " (0 or 1)");
    }
    blocking = config->blocking != 0;
    if (config->commName != nullptr) name = config->commName;
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return report(ncclInvalidArgument, nullptr,
                  std::string(call) + ": rank " + std::to_string(rank) + " of nranks " +
                      std::to_string(nranks) + " (0 <= rank < nranks)");
  }
  const int device = tlemu::detail::current_device();
  if (const cudaError_t e = tlemu::detail::sticky(device); e != cudaSuccess) {
    return report(ncclUnhandledCudaError, nullptr,
                  std::string(call) + ": cuda:" + std::to_string(device) + " has the error " +
                      cudaGetErrorName(e));
  }
  IdPayload p;
  std::memcpy(&p, id.internal, sizeof p);
  if (std::memcmp(p.magic, kIdMagic, sizeof kIdMagic) != 0) {
    return report(ncclInvalidArgument, nullptr,
                  std::string(call) + ": the unique id was not made by ncclGetUniqueId");
  }
  if (p.pid != static_cast<std::uint64_t>(getpid()) || p.nonce != process_nonce()) {
    return report(ncclInvalidUsage, nullptr,
                  std::string(call) + ": the unique id was made by another process (pid " +
                      std::to_string(p.pid) + "; this is pid " + std::to_string(getpid()) +
                      "): the emulated NCCL's ranks must be threads of one process");
  }

  std::shared_ptr<ncclComm> comm;
  {
    Hidden hidden;
    Table& t = table();
    std::lock_guard lock(t.m);
    if (p.serial == 0 || p.serial > t.issued_ids) {
      return report(ncclInvalidArgument, nullptr,
                    std::string(call) + ": the unique id was not made by ncclGetUniqueId");
    }
    if (t.used.count(p.serial) != 0) {
      t_last = std::string(call) + ": rank " + std::to_string(rank) +
               ": this unique id's communicator is already complete; each communicator needs "
               "a unique id of its own (ncclGetUniqueId)";
      print(ncclInvalidUsage, t_last);
      return ncclInvalidUsage;
    }
    std::shared_ptr<Clique>& slot = t.rendezvous[p.serial];
    if (!slot) {
      slot = std::make_shared<Clique>();
      slot->serial = p.serial;
      slot->nranks = nranks;
      slot->name = name;
      slot->members.assign(std::size_t(nranks), nullptr);
      slot->gone.assign(std::size_t(nranks), "");
      slot->first = rank;
    }
    Clique& q = *slot;
    auto refuse = [&](ncclResult_t r, const std::string& why) {
      fail_clique_locked(q, r, why);
      t_last = why;
      return r;
    };
    if (q.failed) {
      t_last = std::string(call) + ": rank " + std::to_string(rank) +
               " joined a communicator whose initialization had failed: " + q.message;
      print(q.error, t_last);
      return q.error;
    }
    const std::string head = std::string(call) + " on " + q.label() + ": ";
    if (q.nranks != nranks) {
      // The higher rank first, whichever came first.
      const bool later = rank > q.first;
      const int hi = later ? rank : q.first, lo = later ? q.first : rank;
      const int hi_n = later ? nranks : q.nranks, lo_n = later ? q.nranks : nranks;
      return refuse(ncclInvalidUsage, head + "rank " + std::to_string(hi) + " called " + call +
                                          " with nranks " + std::to_string(hi_n) + ", rank " +
                                          std::to_string(lo) + " with nranks " +
                                          std::to_string(lo_n));
    }
    if (q.members[std::size_t(rank)] != nullptr) {
      return refuse(ncclInvalidUsage, head + "rank " + std::to_string(rank) + " joined twice");
    }
    for (ncclComm* m : q.members) {
      if (m != nullptr && m->device == device) {
        return refuse(
            ncclInvalidUsage,
            head + "ranks " + std::to_string(std::min(m->rank, rank)) + " and " +
                std::to_string(std::max(m->rank, rank)) +
                " are both on cuda:" + std::to_string(device) +
                " (Duplicate GPU detected): NCCL needs a device of its own for each rank");
      }
    }
    comm = std::make_shared<ncclComm>();
    comm->clique = slot;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->device = device;
    comm->blocking = blocking;
    comm->init_deadline = Clock::now() + timeout();
    q.members[std::size_t(rank)] = comm.get();
    t.comms[comm.get()] = comm;
    if (++q.joined == q.nranks) {
      t.used.insert(p.serial);
      t.rendezvous.erase(p.serial);  // `q` lives on in its members
      t.cv.notify_all();
    }
  }
  *out = comm.get();
  if (!blocking) {
    t_group.nonblocking_init = t_group.nonblocking_init || t_group.depth > 0;
    return ncclInProgress;
  }
  if (t_group.depth > 0) {
    t_group.inits.push_back(comm);
    return ncclSuccess;
  }
  const ncclResult_t r = wait_joined(comm);
  if (r != ncclSuccess) *out = nullptr;
  return r;
}

// --- the all-reduce ------------------------------------------------------------------------------

template <typename T>
T apply(ncclRedOp_t op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // wraps, as the device's integers do
    switch (op) {
      case ncclSum:
      case ncclAvg:
        return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ncclProd:
        return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      default:
        break;
    }
  } else {
    switch (op) {
      case ncclSum:
      case ncclAvg:
        return a + b;
      case ncclProd:
        return a * b;
      default:
        break;
    }
  }
  return op == ncclMax ? (a < b ? b : a) : (b < a ? b : a);
}

// result := the calls' send buffers combined element by element in rank order.
template <typename T>
void combine(const std::vector<Call>& calls, std::vector<unsigned char>& result) {
  const Call& c0 = calls[0];
  result.resize(c0.count * sizeof(T));
  T* out = reinterpret_cast<T*>(result.data());
  std::memcpy(out, c0.send, c0.count * sizeof(T));
  for (std::size_t r = 1; r < calls.size(); ++r) {
    const T* in = static_cast<const T*>(calls[r].send);
    for (std::size_t i = 0; i < c0.count; ++i) out[i] = apply(c0.op, out[i], in[i]);
  }
  if (c0.op == ncclAvg) {
    const T n = static_cast<T>(calls.size());
    for (std::size_t i = 0; i < c0.count; ++i) out[i] = static_cast<T>(out[i] / n);
  }
}

void combine(const std::vector<Call>& calls, std::vector<unsigned char>& result) {
  switch (calls[0].type) {
    case ncclInt8:
      return combine<std::int8_t>(calls, result);
    case ncclUint8:
      return combine<std::uint8_t>(calls, result);
    case ncclInt32:
      return combine<std::int32_t>(calls, result);
    case ncclUint32:
      return combine<std::uint32_t>(calls, result);
    case ncclInt64:
      return combine<std::int64_t>(calls, result);
    case ncclUint64:
      return combine<std::uint64_t>(calls, result);
    case ncclFloat32:
      return combine<float>(calls, result);
    case ncclFloat64:
      return combine<double>(calls, result);
    default:
      return;  // refused when called
  }
}

std::string describe(const Call& c) {
  return "count " + std::to_string(c.count) + ", " + type_name(c.type) + ", " + op_name(c.op);
}

// "count 10", "datatype ncclInt32, op ncclMax": what of `c` differs from `ref`.
std::string differences(const Call& c, const Call& ref) {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  if (c.count != ref.count) add("count " + std::to_string(c.count));
  if (c.type != ref.type) add(std::string("datatype ") + type_name(c.type));
  if (c.op != ref.op) add(std::string("op ") + op_name(c.op));
  return out;
}

// Fails `coll` unless it has already completed or failed. Under coll.m.
void fail_collective(Collective& coll, ncclResult_t r, const std::string& message) {
  if (coll.state != Collective::State::Gathering) return;
  coll.state = Collective::State::Failed;
  coll.error = r;
  coll.message = message;
  print(r, message);
  coll.cv.notify_all();
}

// Keeps the communicator's count of unfinished operations: made with the operation,
// destroyed with it, on the worker, whether the operation ran or was skipped after a
// CUDA error on the device.
struct Outstanding {
  std::shared_ptr<ncclComm> comm;
  explicit Outstanding(std::shared_ptr<ncclComm> c) : comm(std::move(c)) {
    Hidden hidden;
    std::lock_guard lock(table().m);
    ++comm->outstanding;
  }
  ~Outstanding() {
    Hidden hidden;
    std::lock_guard lock(table().m);
    --comm->outstanding;
    table().cv.notify_all();
  }
  Outstanding(const Outstanding&) = delete;
  Outstanding& operator=(const Outstanding&) = delete;
};

// What rank `comm->rank`'s stream worker runs for collective `seq`.
void run_all_reduce(const std::shared_ptr<ncclComm>& comm, std::uint64_t seq, const Call& call) {
  Clique& q = *comm->clique;
  const int rank = comm->rank;
  const std::string what = "ncclAllReduce #" + std::to_string(seq + 1) + " (" + describe(call) +
                           ") on " + q.label() + " of " + std::to_string(q.nranks) + " ranks";
  std::shared_ptr<Collective> coll;
  bool aborted;
  {
    Hidden hidden;
    std::lock_guard lock(table().m);
    std::shared_ptr<Collective>& slot = q.collectives[seq];
    if (!slot) slot = std::make_shared<Collective>(q.nranks);
    coll = slot;
    aborted = comm->aborted;
  }
  ncclResult_t outcome = ncclSuccess;
  std::string message;
  bool last_to_leave = false;
  {
    std::unique_lock lock(coll->m);
    if (aborted) {
      fail_collective(*coll, ncclRemoteError,
                      what + ": rank " + std::to_string(rank) +
                          " aborted its communicator (ncclCommAbort) before its operation ran");
    }
    if (coll->state == Collective::State::Gathering && coll->first >= 0) {
      const Call& ref = coll->calls[std::size_t(coll->first)];
      if (!differences(call, ref).empty()) {
        // The higher rank first, whichever came first.
        const bool later = rank > coll->first;
        const int hi = later ? rank : coll->first, lo = later ? coll->first : rank;
        const Call& hi_call = later ? call : ref;
        const Call& lo_call = later ? ref : call;
        fail_collective(*coll, ncclInvalidUsage,
                        what + ": rank " + std::to_string(hi) + " called ncclAllReduce with " +
                            differences(hi_call, lo_call) + ", rank " + std::to_string(lo) +
                            " with " + differences(lo_call, hi_call) +
                            "; every rank must make the same calls");
      }
    }
    if (coll->state == Collective::State::Gathering) {
      coll->calls[std::size_t(rank)] = call;
      coll->arrived[std::size_t(rank)] = true;
      if (coll->first < 0) coll->first = rank;
      if (++coll->arrivals == q.nranks) {
        combine(coll->calls, coll->result);
        coll->state = Collective::State::Done;
        coll->cv.notify_all();
      } else {
        const std::chrono::milliseconds patience = timeout();
        const bool ended = coll->cv.wait_until(lock, Clock::now() + patience, [&] {
          return coll->state != Collective::State::Gathering || coll->released[std::size_t(rank)];
        });
        if (coll->released[std::size_t(rank)]) {
          outcome = ncclRemoteError;
          message =
              what + ": rank " + std::to_string(rank) + " left its communicator while it waited";
        } else if (!ended) {
          std::vector<int> missing, present;
          for (int r = 0; r < q.nranks; ++r)
            (coll->arrived[std::size_t(r)] ? present : missing).push_back(r);
          fail_collective(*coll, ncclSystemError,
                          what + ": rank" + (missing.size() > 1 ? "s " : " ") + rank_list(missing) +
                              " did not arrive within " + seconds(patience) +
                              " (TOWERLAB_EMULATED_NCCL_TIMEOUT_S); rank" +
                              (present.size() > 1 ? "s " : " ") + rank_list(present) +
                              " waited. Is the call " +
                              "missing there, or a stream stuck behind other work?");
        }
      }
    }
    if (coll->state == Collective::State::Failed && outcome == ncclSuccess) {
      outcome = coll->error;
      message = coll->message;
    }
    last_to_leave = ++coll->departures == q.nranks;
  }
  if (outcome == ncclSuccess) {
    // The result is complete and no longer changes: copy it outside the lock.
    std::memcpy(call.recv, coll->result.data(), coll->result.size());
  } else {
    set_async(*comm, outcome, message);
  }
  // Dropping the references inside Hidden: a shared_ptr's count is an atomic whose
  // last decrement would order this worker after the others' (after their copies).
  Hidden hidden;
  if (last_to_leave) {
    std::lock_guard lock(table().m);
    q.collectives.erase(seq);
  }
  coll.reset();
}

// Queues comm's next collective on `stream` (checked by the caller).
ncclResult_t queue_all_reduce(const std::shared_ptr<ncclComm>& comm, const Call& call,
                              cudaStream_t stream) {
  // NCCL makes the communicator's device current before it launches: the default
  // stream is that device's.
  int previous = 0;
  cudaGetDevice(&previous);
  if (previous != comm->device) cudaSetDevice(comm->device);
  std::uint64_t seq;
  {
    Hidden hidden;
    std::lock_guard lock(table().m);
    seq = comm->issued++;
  }
  auto token = std::make_shared<Outstanding>(comm);
  const cudaError_t e = tlemu::detail::enqueue(
      stream, {"ncclAllReduce", [comm, seq, call, token] { run_all_reduce(comm, seq, call); }});
  if (previous != comm->device) cudaSetDevice(previous);
  if (e != cudaSuccess) {
    {
      Hidden hidden;
      std::lock_guard lock(table().m);
      --comm->issued;
    }
    return report(ncclUnhandledCudaError, comm.get(),
                  "ncclAllReduce (rank " + std::to_string(comm->rank) +
                      " on cuda:" + std::to_string(comm->device) +
                      "): queuing on the stream failed with " + cudaGetErrorName(e));
  }
  return ncclSuccess;
}

// Why `p` cannot be comm's `name` buffer of `bytes`; "" when it can.
std::string buffer_problem(const char* name, const void* p, std::size_t bytes, int device) {
  if (p == nullptr) return std::string(name) + " is null";
  auto a = tlemu::detail::find_allocation(p, bytes);
  if (!a) {
    if (tlemu::detail::find_allocation(p, 1)) {
      return std::string(name) + " (" + std::to_string(bytes) + " bytes) runs past the end of " +
             tlemu::detail::describe_pointer(p);
    }
    return std::string(name) + " is " + tlemu::detail::describe_pointer(p);
  }
  if (a->device >= 0 && a->device != device) {
    return std::string(name) + " is " + tlemu::detail::describe_pointer(p) +
           ", not memory of the communicator's device cuda:" + std::to_string(device);
  }
  return "";
}

// A rank's membership ends (abort or destroy). The other ranks are not told, as on
// hardware, where NCCL's peers cannot know either: a collective they wait in with
// this rank fails at its timeout (which names the rank and why it left), or, as
// towerlab's communicator does, at the caller's own deadline.
void leave(const std::shared_ptr<ncclComm>& comm, const std::string& why) {
  Clique& q = *comm->clique;
  Hidden hidden;
  Table& t = table();
  std::lock_guard lock(t.m);
  if (q.joined < q.nranks) {
    fail_clique_locked(q, ncclRemoteError,
                       "ncclCommInitRank on " + q.label() + ": rank " + std::to_string(comm->rank) +
                           " " + why + " before every rank joined");
  }
  q.gone[std::size_t(comm->rank)] = why;
  q.members[std::size_t(comm->rank)] = nullptr;
  t.comms.erase(comm.get());
  // Its own operations still waiting end now (an aborted NCCL ends its kernels);
  // its arrival is withdrawn, so the others keep waiting for it.
  const auto r = std::size_t(comm->rank);
  for (auto& [seq, coll] : q.collectives) {
    std::lock_guard coll_lock(coll->m);
    if (coll->state != Collective::State::Gathering || !coll->arrived[r]) continue;
    coll->arrived[r] = false;
    coll->released[r] = true;
    --coll->arrivals;
    if (coll->first == comm->rank) {
      coll->first = -1;
      for (int other = 0; other < q.nranks; ++other) {
        if (coll->arrived[std::size_t(other)]) {
          coll->first = other;
          break;
        }
      }
    }
    coll->cv.notify_all();
  }
}

}  // namespace

// --- the API
// ---------------------------------------------------------------------------------------

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr)
    return report(ncclInvalidArgument, nullptr, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr)
    return report(ncclInvalidArgument, nullptr, "ncclGetUniqueId: uniqueId is null");
  IdPayload p{};
  std::memcpy(p.magic, kIdMagic, sizeof kIdMagic);
  p.pid = static_cast<std::uint64_t>(getpid());
  p.nonce = process_nonce();
  {
    Hidden hidden;
    std::lock_guard lock(table().m);
    p.serial = ++table().issued_ids;
  }
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, &p, sizeof p);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return in_group(init_rank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank"));
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return in_group(init_rank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig"));
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) {
    return report(ncclInvalidArgument, nullptr,
                  "ncclCommInitAll: comms is null or ndev " + std::to_string(ndev) + " < 1");
  }
  std::vector<int> devices(static_cast<std::size_t>(ndev));
  for (int i = 0; i < ndev; ++i) {
    devices[std::size_t(i)] = devlist != nullptr ? devlist[i] : i;
    if (!tlemu::detail::valid_device(devices[std::size_t(i)])) {
      return report(ncclInvalidArgument, nullptr,
                    "ncclCommInitAll: rank " + std::to_string(i) + "'s device " +
                        std::to_string(devices[std::size_t(i)]) + " is not one of the " +
                        std::to_string(tlemu::detail::device_count()) + " devices");
    }
    for (int j = 0; j < i; ++j) {
      if (devices[std::size_t(j)] == devices[std::size_t(i)]) {
        return report(ncclInvalidUsage, nullptr,
                      "ncclCommInitAll: ranks " + std::to_string(j) + " and " + std::to_string(i) +
                          " are both on cuda:" + std::to_string(devices[std::size_t(i)]) +
                          " (Duplicate GPU detected): NCCL needs a device of its own for each "
                          "rank");
      }
    }
    if (const cudaError_t e = tlemu::detail::sticky(devices[std::size_t(i)]); e != cudaSuccess) {
      return report(ncclUnhandledCudaError, nullptr,
                    "ncclCommInitAll: cuda:" + std::to_string(devices[std::size_t(i)]) +
                        " has the error " + cudaGetErrorName(e));
    }
  }
  Hidden hidden;
  Table& t = table();
  std::lock_guard lock(t.m);
  auto q = std::make_shared<Clique>();
  q->serial = ++t.issued_ids;
  q->nranks = ndev;
  q->joined = ndev;
  q->first = 0;
  q->gone.assign(std::size_t(ndev), "");
  t.used.insert(q->serial);
  for (int i = 0; i < ndev; ++i) {
    auto comm = std::make_shared<ncclComm>();
    comm->clique = q;
    comm->rank = i;
    comm->nranks = ndev;
    comm->device = devices[std::size_t(i)];
    q->members.push_back(comm.get());
    t.comms[comm.get()] = comm;
    comms[i] = comm.get();
  }
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (asyncError == nullptr) {
    return report(ncclInvalidArgument, nullptr, "ncclCommGetAsyncError: asyncError is null");
  }
  const std::shared_ptr<ncclComm> c = live(comm);
  if (!c) {
    return report(ncclInvalidArgument, nullptr,
                  "ncclCommGetAsyncError: comm is not a live communicator (null, destroyed or "
                  "aborted)");
  }
  Hidden hidden;
  std::lock_guard lock(table().m);
  Clique& q = *c->clique;
  if (c->async == ncclSuccess && q.joined < q.nranks && Clock::now() > c->init_deadline) {
    fail_clique_locked(q, ncclSystemError, missing_message(q, timeout()));
  }
  if (c->async != ncclSuccess) {
    *asyncError = c->async;
  } else if (q.joined < q.nranks || (c->finalized && c->outstanding > 0)) {
    *asyncError = ncclInProgress;
  } else {
    *asyncError = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  const std::shared_ptr<ncclComm> c = live(comm);
  if (!c) {
    return report(ncclInvalidArgument, nullptr,
                  "ncclCommFinalize: comm is not a live communicator (null, destroyed or aborted)");
  }
  Hidden hidden;
  Table& t = table();
  std::unique_lock lock(t.m);
  if (c->finalized) {
    lock.unlock();
    return report(ncclInvalidUsage, c.get(), "ncclCommFinalize: called twice");
  }
  c->finalized = true;
  if (!c->blocking) return c->outstanding > 0 ? ncclInProgress : c->async;
  t.cv.wait(lock, [&] { return c->outstanding == 0; });
  return c->async;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  const std::shared_ptr<ncclComm> c = live(comm);
  if (!c) {
    return report(ncclInvalidArgument, nullptr,
                  "ncclCommDestroy: comm is not a live communicator (destroyed or aborted)");
  }
  {
    // Finalizes first when the caller did not: the queued operations finish (each
    // within the timeout once it reaches the front of its stream).
    Hidden hidden;
    std::unique_lock lock(table().m);
    table().cv.wait(lock, [&] { return c->outstanding == 0; });
  }
  leave(c, "destroyed its communicator (ncclCommDestroy)");
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  const std::shared_ptr<ncclComm> c = live(comm);
  if (!c) {
    return report(ncclInvalidArgument, nullptr,
                  "ncclCommAbort: comm is not a live communicator (destroyed or aborted)");
  }
  {
    Hidden hidden;
    std::lock_guard lock(table().m);
    c->aborted = true;
  }
  leave(c, "aborted its communicator (ncclCommAbort)");
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  const std::shared_ptr<ncclComm> c = live(comm);
  if (!c || count == nullptr)
    return report(ncclInvalidArgument, nullptr, "ncclCommCount: bad argument");
  *count = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  const std::shared_ptr<ncclComm> c = live(comm);
  if (!c || device == nullptr) {
    return report(ncclInvalidArgument, nullptr, "ncclCommCuDevice: bad argument");
  }
  *device = c->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  const std::shared_ptr<ncclComm> c = live(comm);
  if (!c || rank == nullptr)
    return report(ncclInvalidArgument, nullptr, "ncclCommUserRank: bad argument");
  *rank = c->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclNumResults:
      break;
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  std::string text;
  if (comm != nullptr) {
    if (const std::shared_ptr<ncclComm> c = live(comm)) {
      Hidden hidden;
      std::lock_guard lock(table().m);
      text = c->last;
    }
  }
  if (text.empty()) text = t_last;
  t_returned = std::move(text);
  return t_returned.c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  const std::shared_ptr<ncclComm> c = live(comm);
  if (!c) {
    return in_group(report(ncclInvalidArgument, nullptr,
                           "ncclAllReduce: comm is not a live communicator (null, destroyed or "
                           "aborted)"));
  }
  const std::string head = "ncclAllReduce (rank " + std::to_string(c->rank) +
                           " on cuda:" + std::to_string(c->device) + ")";
  {
    Hidden hidden;
    std::unique_lock lock(table().m);
    const Clique& q = *c->clique;
    if (c->async != ncclSuccess) {
      const ncclResult_t r = c->async;
      t_last = c->last;
      lock.unlock();
      print(r, head + ": the communicator has failed: " + t_last);
      return in_group(r);
    }
    if (q.joined < q.nranks) {
      lock.unlock();
      return in_group(report(ncclInvalidArgument, c.get(),
                             head + ": the communicator's initialization has not completed "
                                    "(ncclCommGetAsyncError says ncclInProgress)"));
    }
    if (c->finalized) {
      lock.unlock();
      return in_group(report(ncclInvalidUsage, c.get(), head + ": after ncclCommFinalize"));
    }
  }
  if (datatype == ncclFloat16 || datatype == ncclBfloat16) {
    return in_group(report(ncclInvalidArgument, c.get(),
                           head + ": " + type_name(datatype) +
                               " is a valid NCCL datatype the emulated NCCL does not implement"));
  }
  if (type_size(datatype) == 0) {
    return in_group(
        report(ncclInvalidArgument, c.get(),
               head + ": datatype " + std::to_string(int(datatype)) + " is not an ncclDataType_t"));
  }
  if (op < ncclSum || op >= ncclNumOps) {
    return in_group(report(ncclInvalidArgument, c.get(),
                           head + ": op " + std::to_string(int(op)) + " is not an ncclRedOp_t"));
  }
  if (count == 0) return ncclSuccess;  // NCCL queues nothing for an empty collective
  const std::size_t bytes = count * type_size(datatype);
  if (bytes / type_size(datatype) != count) {
    return in_group(report(ncclInvalidArgument, c.get(),
                           head + ": count " + std::to_string(count) + " overflows"));
  }
  std::string problem = buffer_problem("sendbuff", sendbuff, bytes, c->device);
  if (problem.empty()) problem = buffer_problem("recvbuff", recvbuff, bytes, c->device);
  if (!problem.empty())
    return in_group(report(ncclInvalidArgument, c.get(), head + ": " + problem));
  const bool default_stream =
      stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
  if (!default_stream) {
    const int stream_dev = tlemu::detail::stream_device(stream);
    if (stream_dev < 0) {
      return in_group(
          report(ncclUnhandledCudaError, c.get(),
                 head + ": the stream is not a live stream (cudaErrorInvalidResourceHandle)"));
    }
    if (stream_dev != c->device) {
      return in_group(report(ncclInvalidArgument, c.get(),
                             head + ": the stream belongs to cuda:" + std::to_string(stream_dev)));
    }
  }
  Call call;
  call.count = count;
  call.type = datatype;
  call.op = op;
  call.send = sendbuff;
  call.recv = recvbuff;
  if (t_group.depth > 0) {
    t_group.deferred.push_back([c, call, stream] { return queue_all_reduce(c, call, stream); });
    return ncclSuccess;
  }
  return queue_all_reduce(c, call, stream);
}

ncclResult_t ncclGroupStart() {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group.depth == 0) {
    return report(ncclInvalidUsage, nullptr, "ncclGroupEnd without a matching ncclGroupStart");
  }
  if (--t_group.depth > 0) return ncclSuccess;
  Group group = std::move(t_group);
  t_group = Group{};
  if (group.error != ncclSuccess) return group.error;  // nothing of the group is queued
  ncclResult_t result = ncclSuccess;
  for (auto& queue : group.deferred) {
    if (const ncclResult_t r = queue(); r != ncclSuccess && result == ncclSuccess) result = r;
  }
  for (auto& comm : group.inits) {
    if (const ncclResult_t r = wait_joined(comm); r != ncclSuccess && result == ncclSuccess) {
      result = r;
    }
  }
  if (result == ncclSuccess && group.nonblocking_init) result = ncclInProgress;
  return result;
}

namespace tlemu {

void set_nccl_timeout(std::chrono::milliseconds timeout) {
  Hidden hidden;
  timeout_setting() = std::max<long long>(1, timeout.count());
}

}  // namespace tlemu
