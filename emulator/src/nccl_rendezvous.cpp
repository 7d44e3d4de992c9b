// NCCL on the emulated GPUs: the rendezvous. Unique ids, communicators created and
// joined (each rank's thread meets the others in this process's table, within the
// timeout) and left (abort, destroy); the timeout itself. nccl_internal.h says what
// the state is.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "nccl_internal.h"

namespace tlemu::detail::nccl {

namespace {

std::atomic<long long>& timeout_setting() {
  static std::atomic<long long> ms{-1};  // -1: the environment not read yet
  return ms;
}

// A unique id's contents: this process's stamp and the id's number in the table.
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

// The ranks of `q` that have not joined. Under table().m.
std::vector<int> missing_locked(const Clique& q) {
  std::vector<int> out;
  for (int r = 0; r < q.nranks; ++r)
    if (q.members[std::size_t(r)] == nullptr) out.push_back(r);
  return out;
}

}  // namespace

// --- the timeout --------------------------------------------------------------------------------

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

// --- initialization -----------------------------------------------------------------------------

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

std::string missing_message(const Clique& q, std::chrono::milliseconds waited) {
  const std::vector<int> missing = missing_locked(q);
  return "ncclCommInitRank on " + q.label() + " of " + std::to_string(q.nranks) + " ranks: rank" +
         (missing.size() > 1 ? "s " : " ") + rank_list(missing) + " did not join within " +
         seconds(waited) + " (TOWERLAB_EMULATED_NCCL_TIMEOUT_S); " +
         "every rank's thread must call ncclCommInitRank with the same unique id";
}

void new_unique_id(ncclUniqueId& id) {
  IdPayload p{};
  std::memcpy(p.magic, kIdMagic, sizeof kIdMagic);
  p.pid = static_cast<std::uint64_t>(getpid());
  p.nonce = process_nonce();
  {
    Hidden hidden;
    std::lock_guard lock(table().m);
    p.serial = ++table().issued_ids;
  }
  std::memset(id.internal, 0, sizeof id.internal);
  std::memcpy(id.internal, &p, sizeof p);
}

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

void init_all(const std::vector<int>& devices, ncclComm_t* comms) {
  const int ndev = static_cast<int>(devices.size());
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
}

// --- leaving ----------------------------------------------------------------------------------

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

}  // namespace tlemu::detail::nccl

namespace tlemu {

void set_nccl_timeout(std::chrono::milliseconds timeout) {
  detail::Hidden hidden;
  detail::nccl::timeout_setting() = std::max<long long>(1, timeout.count());
}

}  // namespace tlemu
