// NCCL on the emulated GPUs: the collectives, as the ranks' stream workers run them.
// A rank's operation is queued on its stream; when the worker reaches it, it meets the
// other ranks' in a Collective (nccl_internal.h): the last to arrive combines the send
// buffers in rank order (all-reduce, reduce-scatter) or lays them one after the other
// (all-gather), each copies its part into its own receive buffer. A rank that does not
// arrive within the timeout, or calls with other arguments or another collective, fails
// the collective for all, with a message naming the ranks.
#include <cstring>
#include <type_traits>

#include "nccl_internal.h"

namespace tlemu::detail::nccl {

namespace {

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

// Elements in each rank's send buffer.
std::size_t send_elements(const Call& c, std::size_t nranks) {
  return c.kind == Kind::ReduceScatter ? c.count * nranks : c.count;
}

// result := the calls' send buffers combined element by element in rank order, or,
// for an all-gather, laid one after the other in rank order.
template <typename T>
void combine(const std::vector<Call>& calls, std::vector<unsigned char>& result) {
  const Call& c0 = calls[0];
  const std::size_t n = send_elements(c0, calls.size());
  if (c0.kind == Kind::AllGather) {
    result.resize(n * calls.size() * sizeof(T));
    for (std::size_t r = 0; r < calls.size(); ++r) {
      std::memcpy(result.data() + r * n * sizeof(T), calls[r].send, n * sizeof(T));
    }
    return;
  }
  result.resize(n * sizeof(T));
  T* out = reinterpret_cast<T*>(result.data());
  std::memcpy(out, c0.send, n * sizeof(T));
  for (std::size_t r = 1; r < calls.size(); ++r) {
    const T* in = static_cast<const T*>(calls[r].send);
    for (std::size_t i = 0; i < n; ++i) out[i] = apply(c0.op, out[i], in[i]);
  }
  if (c0.op == ncclAvg) {
    const T count = static_cast<T>(calls.size());
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(out[i] / count);
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
    case ncclFloat16:
    case ncclBfloat16:  // gathered only (their reductions are refused when called)
      return combine<std::uint16_t>(calls, result);
    case ncclFloat32:
      return combine<float>(calls, result);
    case ncclFloat64:
      return combine<double>(calls, result);
    default:
      return;  // refused when called
  }
}

std::string describe(const Call& c) {
  std::string out = "count " + std::to_string(c.count) + ", " + type_name(c.type);
  if (c.kind != Kind::AllGather) out += std::string(", ") + op_name(c.op);
  return out;
}

// "count 10", "datatype ncclInt32, op ncclMax": what of `c` differs from `ref` (a
// call of the same kind).
std::string differences(const Call& c, const Call& ref) {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  if (c.count != ref.count) add("count " + std::to_string(c.count));
  if (c.type != ref.type) add(std::string("datatype ") + type_name(c.type));
  if (c.op != ref.op && c.kind != Kind::AllGather) add(std::string("op ") + op_name(c.op));
  return out;
}

// Why two ranks' calls cannot meet, naming the higher rank first: "" when they match.
std::string mismatch(int hi, const Call& hi_call, int lo, const Call& lo_call) {
  const std::string h = "rank " + std::to_string(hi), l = "rank " + std::to_string(lo);
  if (hi_call.kind != lo_call.kind) {
    return h + " called " + kind_name(hi_call.kind) + " (" + describe(hi_call) + "), " + l +
           " called " + kind_name(lo_call.kind) + " (" + describe(lo_call) + ")";
  }
  const std::string d = differences(hi_call, lo_call);
  if (d.empty()) return "";
  return h + " called " + kind_name(hi_call.kind) + " with " + d + ", " + l + " with " +
         differences(lo_call, hi_call);
}

// Where rank `rank`'s receive buffer takes its bytes from the result.
std::pair<std::size_t, std::size_t> received_part(const Call& c, int rank,
                                                  const std::vector<unsigned char>& result) {
  if (c.kind != Kind::ReduceScatter) return {0, result.size()};
  const std::size_t bytes = c.count * type_size(c.type);
  return {std::size_t(rank) * bytes, bytes};
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
void run_collective(const std::shared_ptr<ncclComm>& comm, std::uint64_t seq, const Call& call) {
  Clique& q = *comm->clique;
  const int rank = comm->rank;
  const std::string what = std::string(kind_name(call.kind)) + " #" + std::to_string(seq + 1) +
                           " (" + describe(call) + ") on " + q.label() + " of " +
                           std::to_string(q.nranks) + " ranks";
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
      // The higher rank first, whichever came first.
      const bool later = rank > coll->first;
      const std::string why =
          later ? mismatch(rank, call, coll->first, ref) : mismatch(coll->first, ref, rank, call);
      if (!why.empty()) {
        fail_collective(*coll, ncclInvalidUsage,
                        what + ": " + why + "; every rank must make the same calls");
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
    const auto [offset, bytes] = received_part(call, rank, coll->result);
    std::memcpy(call.recv, coll->result.data() + offset, bytes);
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

}  // namespace

// Queues comm's next collective on `stream` (checked by the caller).
ncclResult_t queue_collective(const std::shared_ptr<ncclComm>& comm, const Call& call,
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
      stream,
      {kind_name(call.kind), [comm, seq, call, token] { run_collective(comm, seq, call); }});
  if (previous != comm->device) cudaSetDevice(previous);
  if (e != cudaSuccess) {
    {
      Hidden hidden;
      std::lock_guard lock(table().m);
      --comm->issued;
    }
    return report(ncclUnhandledCudaError, comm.get(),
                  std::string(kind_name(call.kind)) + " (rank " + std::to_string(comm->rank) +
                      " on cuda:" + std::to_string(comm->device) +
                      "): queuing on the stream failed with " + cudaGetErrorName(e));
  }
  return ncclSuccess;
}

}  // namespace tlemu::detail::nccl
