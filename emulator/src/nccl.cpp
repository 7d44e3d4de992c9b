// NCCL on the emulated GPUs (include/nccl.h), its API: each nccl* entry point checks
// its arguments and reports what is wrong as NCCL does (a result, a message printed and
// kept for ncclGetLastError), and groups defer their collectives to ncclGroupEnd. How
// ranks meet is nccl_rendezvous.cpp, what the collectives run is nccl_collectives.cpp;
// nccl_internal.h holds what they share.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "nccl_internal.h"

namespace tlemu::detail::nccl {

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

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
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

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::AllReduce:
      return "ncclAllReduce";
    case Kind::ReduceScatter:
      return "ncclReduceScatter";
    case Kind::AllGather:
      return "ncclAllGather";
  }
  return "an unknown collective";
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

// --- errors ---------------------------------------------------------------------------------

thread_local std::string t_last;

void print(ncclResult_t r, const std::string& message) {
  std::fprintf(stderr, "emulated NCCL: %s: %s\n", result_name(r), message.c_str());
}

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

// --- groups ---------------------------------------------------------------------------------

thread_local Group t_group;

ncclResult_t in_group(ncclResult_t r) {
  if (t_group.depth > 0 && r != ncclSuccess && r != ncclInProgress &&
      t_group.error == ncclSuccess) {
    t_group.error = r;
  }
  return r;
}

namespace {

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

thread_local std::string t_returned;  // what ncclGetLastError returned, kept alive

}  // namespace

}  // namespace tlemu::detail::nccl

using namespace tlemu::detail::nccl;
using tlemu::detail::Hidden;

// --- the API ---------------------------------------------------------------------------------

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr)
    return report(ncclInvalidArgument, nullptr, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr)
    return report(ncclInvalidArgument, nullptr, "ncclGetUniqueId: uniqueId is null");
  new_unique_id(*id);
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
  init_all(devices, comms);
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

namespace {

// The three collectives' common entry: the communicator, the arguments and the
// buffers checked (each error reported as ncclAllReduce's are), then the call queued,
// or deferred to ncclGroupEnd inside a group.
ncclResult_t collective(Kind kind, const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                        cudaStream_t stream) {
  const char* name = kind_name(kind);
  const std::shared_ptr<ncclComm> c = live(comm);
  if (!c) {
    return in_group(report(
        ncclInvalidArgument, nullptr,
        std::string(name) + ": comm is not a live communicator (null, destroyed or aborted)"));
  }
  const std::string head = std::string(name) + " (rank " + std::to_string(c->rank) +
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
  // 16-bit values are gathered (copies); their sums (real NCCL's partial sums in
  // the 16-bit type, in its own order) are not emulated.
  if ((datatype == ncclFloat16 || datatype == ncclBfloat16) && kind != Kind::AllGather) {
    return in_group(report(ncclInvalidArgument, c.get(),
                           head + ": " + type_name(datatype) +
                               " is a valid NCCL datatype whose reductions the emulated NCCL "
                               "does not implement (its all-gather copies them)"));
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
  // The per-rank block and the whole: the reduce-scatter sends nranks blocks and
  // receives one, the all-gather the reverse.
  const std::size_t block = count * type_size(datatype);
  const std::size_t ranks = std::size_t(c->nranks);
  if (block / type_size(datatype) != count || block * ranks / ranks != block) {
    return in_group(report(ncclInvalidArgument, c.get(),
                           head + ": count " + std::to_string(count) + " overflows"));
  }
  const std::size_t send_bytes = kind == Kind::ReduceScatter ? block * ranks : block;
  const std::size_t recv_bytes = kind == Kind::AllGather ? block * ranks : block;
  std::string problem = buffer_problem("sendbuff", sendbuff, send_bytes, c->device);
  if (problem.empty()) problem = buffer_problem("recvbuff", recvbuff, recv_bytes, c->device);
  if (problem.empty() && kind != Kind::AllReduce) {
    // NCCL's one in-place form: the rank's own block of the larger buffer. Any other
    // overlap reads values the collective has already overwritten.
    const auto* s = static_cast<const unsigned char*>(sendbuff);
    const auto* r = static_cast<const unsigned char*>(recvbuff);
    const bool overlap = s < r + recv_bytes && r < s + send_bytes;
    const std::size_t own = std::size_t(c->rank) * block;
    const bool in_place = kind == Kind::ReduceScatter ? r == s + own : s == r + own;
    if (overlap && !in_place) {
      problem = std::string("sendbuff and recvbuff overlap, but not in place (in place, ") +
                (kind == Kind::ReduceScatter ? "recvbuff is sendbuff" : "sendbuff is recvbuff") +
                " + rank * count elements)";
    }
  }
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
  call.kind = kind;
  call.count = count;
  call.type = datatype;
  call.op = op;
  call.send = sendbuff;
  call.recv = recvbuff;
  if (t_group.depth > 0) {
    t_group.deferred.push_back([c, call, stream] { return queue_collective(c, call, stream); });
    return ncclSuccess;
  }
  return queue_collective(c, call, stream);
}

}  // namespace

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(Kind::AllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return collective(Kind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::AllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, comm,
                    stream);
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
