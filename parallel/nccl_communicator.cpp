#include "parallel/nccl_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "engine/clock.h"
#include "engine/error.h"
#include "parallel/process_group.h"

#if TOWERLAB_WITH_CUDA
#include "engine/cuda_check.h"
#endif
#if TOWERLAB_WITH_NCCL
#include "parallel/nccl_check.h"
#endif

namespace towerlab {

namespace {

const char* name(CrossProcessPath path) {
  switch (path) {
    case CrossProcessPath::Auto:
      return "Auto";
    case CrossProcessPath::HostStaged:
      return "HostStaged";
    case CrossProcessPath::Nccl:
      return "Nccl";
  }
  return "?";
}

std::string host_name() {
  std::array<char, 256> text{};
  if (gethostname(text.data(), text.size() - 1) != 0) return "(unknown host)";
  return text.data();
}

// A GPU's UUID ("GPU-1f2e...") names it across hosts and CUDA_VISIBLE_DEVICES
// renumberings, which cuda:N does not.
std::string gpu_uuid(Device device) {
#if TOWERLAB_WITH_CUDA
  cudaDeviceProp prop{};
  TL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
  std::string text = "GPU-";
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
    text += hex;
    if (i == 3 || i == 5 || i == 7 || i == 9) text += '-';
  }
  return text;
#else
  TL_THROW(NotSupported, "this build of towerlab has no CUDA backend (" << device.str() << ")");
#endif
}

}  // namespace

std::string encode_rank_placement(const NcclRankPlacement& p) {
  std::ostringstream os;
  os << int(p.request) << '\n'
     << (p.all_towers_on_gpus ? 1 : 0) << '\n'
     << p.host << '\n'
     << p.device << '\n'
     << p.gpu;
  return os.str();
}

NcclRankPlacement decode_rank_placement(std::string_view text) {
  std::vector<std::string> fields;
  std::size_t at = 0;
  for (std::size_t nl; (nl = text.find('\n', at)) != std::string_view::npos; at = nl + 1) {
    fields.emplace_back(text.substr(at, nl - at));
  }
  fields.emplace_back(text.substr(at));
  TL_CHECK(fields.size() == 5 && (fields[0] == "0" || fields[0] == "1" || fields[0] == "2") &&
               (fields[1] == "0" || fields[1] == "1"),
           InvalidArgument,
           "NCCL placement: malformed record '" << text << "' (expected 5 lines: request, "
                                                << "all towers on GPUs, host, device, GPU)");
  NcclRankPlacement p;
  p.request = CrossProcessPath(fields[0][0] - '0');
  p.all_towers_on_gpus = fields[1] == "1";
  p.host = fields[2];
  p.device = fields[3];
  p.gpu = fields[4];
  return p;
}

NcclChoice choose_cross_process_path(const std::vector<NcclRankPlacement>& ranks, bool nccl_built) {
  TL_CHECK(!ranks.empty(), InvalidArgument, "NCCL placement: no ranks");
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    TL_CHECK(ranks[r].request == ranks[0].request, InvalidArgument,
             "Trainer: the processes ask for different cross-process paths: rank 0 for "
                 << name(ranks[0].request) << ", rank " << r << " for " << name(ranks[r].request)
                 << "; every process must set TrainerOptions::cross_process alike");
  }
  const CrossProcessPath request = ranks[0].request;
  if (request == CrossProcessPath::HostStaged) {
    return {false, "host staging requested (CrossProcessPath::HostStaged)"};
  }
  const std::string why_not = [&]() -> std::string {
    if (!nccl_built) return "this build of towerlab has no NCCL";
    if (ranks.size() == 1 && request == CrossProcessPath::Auto) return "one process";
    std::map<std::string, std::size_t> owner;  // GPU -> the first rank on it
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const NcclRankPlacement& p = ranks[r];
      if (!p.all_towers_on_gpus || p.gpu.empty()) {
        return "rank " + std::to_string(r) + " on " + p.host +
               " does not train on GPUs only (tower 0 on " + p.device + ")";
      }
      const auto [it, fresh] = owner.emplace(p.gpu, r);
      if (!fresh) {
        const NcclRankPlacement& q = ranks[it->second];
        return "ranks " + std::to_string(it->second) + " and " + std::to_string(r) +
               " share one GPU (" + q.device + " and " + p.device + " on " + p.host + ", " + p.gpu +
               "); NCCL needs a GPU of its own for each rank";
      }
    }
    return "";
  }();
  if (why_not.empty()) {
    return {true, "NCCL on tower 0's device buffers: every rank's tower 0 has a GPU of its own"};
  }
  TL_CHECK(request != CrossProcessPath::Nccl, NotSupported,
           "Trainer: NCCL between processes (CrossProcessPath::Nccl) cannot be used: "
               << why_not
               << "; use CrossProcessPath::Auto or HostStaged to stage through the host");
  return {false, "host staging: " + why_not};
}

NcclChoice choose_cross_process_path(ProcessGroup& group, CrossProcessPath request,
                                     const std::vector<Device>& towers) {
  TL_CHECK(!towers.empty(), InvalidArgument, "NCCL placement: no towers");
  NcclRankPlacement mine;
  mine.request = request;
  mine.all_towers_on_gpus =
      std::all_of(towers.begin(), towers.end(), [](Device d) { return d.is_cuda(); });
  mine.host = host_name();
  mine.device = towers[0].str();
  if (towers[0].is_cuda()) mine.gpu = gpu_uuid(towers[0]);
  std::vector<NcclRankPlacement> ranks;
  for (const std::string& text :
       group.allgather(encode_rank_placement(mine), "trainer startup: GPU placement")) {
    ranks.push_back(decode_rank_placement(text));
  }
  return choose_cross_process_path(ranks, NcclCommunicator::available());
}

bool NcclCommunicator::available() {
  return TOWERLAB_WITH_NCCL != 0;
}

#if TOWERLAB_WITH_NCCL

namespace {

std::string seconds_text(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << double(d.count()) / 1000.0 << " s";
  return os.str();
}

// NCCL picks its algorithm and protocol per call from the message size and the
// topology, and each reduces in its own order; the ring with the Simple protocol
// reduces every element once on one rank (see the header). NCCL reads these when
// a communicator is made, so they are set before the first one; a user's own
// setting stays.
void pin_reduction_order() {
  static std::once_flag once;
  std::call_once(once, [] {
    setenv("NCCL_ALGO", "Ring", 0);
    setenv("NCCL_PROTO", "Simple", 0);
  });
}

// Calls done() until it returns true (then true) or the deadline passes (false):
// spins for the first thousand polls (a step's all-reduce usually finishes within
// them), then sleeps between polls so that a long wait costs no core.
template <typename Done>
bool poll_until(Clock::time_point until, Done done) {
  for (int polls = 0;; ++polls) {
    if (done()) return true;
    if (Clock::now() > until) return false;
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

}  // namespace

struct NcclCommunicator::Comm {
  ncclComm_t comm = nullptr;
  std::string broken;  // the first failure; every later call throws it again

  // Aborts the communicator (which ends its kernels and frees it) and throws `why`.
  [[noreturn]] void fail(const std::string& why) {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    broken = why;
    throw CommunicationError(why);
  }

  // A call's immediate result: ncclInProgress is how a non-blocking communicator
  // says "started"; anything else but success is a failure.
  void check(ncclResult_t result, const char* call, std::string_view what) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    fail(detail::nccl_error_text(what, call, result, comm, __FILE__, __LINE__));
  }

  // Waits until the communicator's operation in progress has completed and, with
  // `kernels`, until the stream has run past that event; fails on an error NCCL
  // reports or past `until`.
  void wait(const char* call, std::string_view what, Clock::time_point until,
            std::chrono::milliseconds deadline, const Event* kernels) {
    ncclResult_t state = ncclInProgress;
    std::string cuda_error;
    const bool done = poll_until(until, [&] {
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) state = r;
      if (state == ncclInProgress) return false;
      if (state != ncclSuccess || kernels == nullptr) return true;
      try {
        if (!kernels->query()) return false;
      } catch (const Error& e) {  // a CUDA error on the stream: abort, as for NCCL's
        cuda_error = e.what();
        return true;
      }
      // NCCL may have set its error between the first read and the kernels' end (a
      // failed collective ends its kernels): read it again, or the failure would
      // pass for a success.
      const ncclResult_t again = ncclCommGetAsyncError(comm, &state);
      if (again != ncclSuccess) state = again;
      return true;
    });
    if (!cuda_error.empty()) fail(std::string(what) + ": " + call + ": " + cuda_error);
    if (!done) {
      fail(std::string(what) + ": " + call + " did not complete within " + seconds_text(deadline) +
           ": another rank stopped, stalled or died inside it (NCCL cannot say which; the "
           "communicator was aborted)");
    }
    if (state != ncclSuccess) {
      fail(detail::nccl_error_text(what, call, state, comm, __FILE__, __LINE__));
    }
  }

  // One call of NCCL's (`launch` makes it on the stream it is given) on `device`'s
  // `stream`, in a group, waited for until its kernels have run (see the header).
  void collective(const char* call, Device device, std::chrono::milliseconds deadline,
                  const Stream& stream, std::string_view what,
                  const std::function<ncclResult_t(cudaStream_t)>& launch) {
    TL_CHECK(stream.device() == device, InvalidArgument,
             what << ": " << call << " on a stream of " << stream.device().str()
                  << " but the communicator is on " << device.str());
    TL_CHECK(broken.empty(), CommunicationError, broken);
    CudaDeviceGuard on_device(device.index);
    const auto until = Clock::now() + deadline;
    check(ncclGroupStart(), "ncclGroupStart", what);
    const ncclResult_t r = launch(static_cast<cudaStream_t>(stream.native_handle()));
    if (r != ncclSuccess && r != ncclInProgress) {
      (void)ncclGroupEnd();
      check(r, call, what);
    }
    check(ncclGroupEnd(), "ncclGroupEnd", what);
    // A non-blocking group may still be launching its kernels: the event goes on the
    // stream only after them.
    wait(call, what, until, deadline, nullptr);
    Event kernels(device);
    kernels.record(stream);
    wait(call, what, until, deadline, &kernels);
  }
};

void NcclCommunicator::connect(ProcessGroup& group) {
  const Device device = device_;
  TL_CHECK(device.is_cuda(), DeviceError,
           "NCCL between processes: rank " << rank_ << " gave " << device.str()
                                           << "; NCCL needs a GPU for each rank");
  check_available(device);
  pin_reduction_order();
  // Rank 0's id travels with a flag, so that a failure to make it stops every rank
  // at once instead of leaving them to initialize with garbage.
  std::array<std::byte, 1 + sizeof(ncclUniqueId)> message{};
  std::string failure;
  if (rank_ == 0) {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r == ncclSuccess) {
      message[0] = std::byte{1};
      std::memcpy(message.data() + 1, &id, sizeof id);
    } else {
      failure = detail::nccl_error_text("NCCL startup", "ncclGetUniqueId(&id)", r, nullptr,
                                        __FILE__, __LINE__);
    }
  }
  group.broadcast(message, 0, "NCCL startup: unique id");
  if (!failure.empty()) throw CommunicationError(failure);
  TL_CHECK(message[0] == std::byte{1}, CommunicationError,
           "NCCL startup: rank 0 could not make NCCL's unique id (rank 0's error says why)");
  ncclUniqueId id;
  std::memcpy(&id, message.data() + 1, sizeof id);

  const std::string what = "NCCL startup (rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_) + " on " + device.str() + ")";
  CudaDeviceGuard on_device(device.index);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "towerlab";
  comm_ = std::make_unique<Comm>();
  const auto until = Clock::now() + deadline_;
  comm_->check(ncclCommInitRankConfig(&comm_->comm, size_, id, rank_, &config),
               "ncclCommInitRankConfig", what);
  comm_->wait("ncclCommInitRankConfig", what, until, deadline_, nullptr);
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr || comm_->comm == nullptr) return;
  ncclComm_t comm = comm_->comm;
  ncclResult_t state = ncclInternalError;
  std::string why;
  try {
    CudaDeviceGuard on_device(device_.index);
    // Finalizing waits for the other ranks' outstanding work; polled, so that a
    // lost rank costs the deadline, not a hang.
    state = ncclCommFinalize(comm);
    if (state == ncclInProgress) {
      poll_until(Clock::now() + deadline_, [&] {
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
        return state != ncclInProgress;
      });
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm);
      return;
    }
    why = ncclGetErrorString(state);
  } catch (const Error& e) {
    why = e.what();
  }
  std::fprintf(stderr,
               "towerlab: NCCL: finalizing rank %d's communicator on %s ended with %s; aborting "
               "it (ignored in a destructor)\n",
               rank_, device_.str().c_str(), why.c_str());
  ncclCommAbort(comm);
}

void NcclCommunicator::allreduce_sum(const std::vector<Tensor>& buffers, const Stream& stream,
                                     std::string_view what) {
  for (std::size_t i = 0; i < buffers.size(); ++i) check_buffer(buffers[i], "all-reduce", what);
  comm_->collective("ncclAllReduce", device_, deadline_, stream, what, [&](cudaStream_t s) {
    for (const Tensor& b : buffers) {
      if (b.numel() == 0) continue;
      const ncclResult_t r = ncclAllReduce(b.raw_data(), b.raw_data(), std::size_t(b.numel()),
                                           ncclFloat, ncclSum, comm_->comm, s);
      if (r != ncclSuccess && r != ncclInProgress) return r;
    }
    return ncclSuccess;
  });
}

void NcclCommunicator::reduce_scatter_sum(const Tensor& blocks, const Stream& stream,
                                          std::string_view what) {
  const std::int64_t block = check_blocks(blocks, "reduce-scatter", what);
  if (block == 0) return;
  const Tensor mine = blocks.slice(rank_ * block, (rank_ + 1) * block);
  comm_->collective("ncclReduceScatter", device_, deadline_, stream, what, [&](cudaStream_t s) {
    return ncclReduceScatter(blocks.raw_data(), mine.raw_data(), std::size_t(block), ncclFloat,
                             ncclSum, comm_->comm, s);
  });
}

void NcclCommunicator::all_gather(const Tensor& blocks, const Stream& stream,
                                  std::string_view what) {
  const std::int64_t block = check_blocks(blocks, "all-gather", what, /*copies=*/true);
  if (block == 0) return;
  const Tensor mine = blocks.slice(rank_ * block, (rank_ + 1) * block);
  const ncclDataType_t type = blocks.dtype() == DType::BFloat16 ? ncclBfloat16 : ncclFloat;
  comm_->collective("ncclAllGather", device_, deadline_, stream, what, [&](cudaStream_t s) {
    return ncclAllGather(mine.raw_data(), blocks.raw_data(), std::size_t(block), type, comm_->comm,
                         s);
  });
}

#else  // no NCCL in this build

struct NcclCommunicator::Comm {};

void NcclCommunicator::connect(ProcessGroup&) {
  TL_THROW(NotSupported,
           "NCCL between processes: this build of towerlab has no NCCL (it needs the CUDA backend "
           "and TOWERLAB_NCCL=ON with a toolkit that ships NCCL); use "
           "CrossProcessPath::HostStaged or Auto");
}

NcclCommunicator::~NcclCommunicator() = default;

void NcclCommunicator::allreduce_sum(const std::vector<Tensor>&, const Stream&,
                                     std::string_view what) {
  TL_THROW(NotSupported, what << ": this build of towerlab has no NCCL");
}

void NcclCommunicator::reduce_scatter_sum(const Tensor&, const Stream&, std::string_view what) {
  TL_THROW(NotSupported, what << ": this build of towerlab has no NCCL");
}

void NcclCommunicator::all_gather(const Tensor&, const Stream&, std::string_view what) {
  TL_THROW(NotSupported, what << ": this build of towerlab has no NCCL");
}

#endif

void NcclCommunicator::check_buffer(const Tensor& buffer, const char* call, std::string_view what,
                                    bool copies) const {
  const bool dtype =
      buffer.dtype() == DType::Float32 || (copies && buffer.dtype() == DType::BFloat16);
  TL_CHECK(dtype && buffer.device() == device_, ShapeError,
           what << ": NCCL " << call << " buffer " << buffer.describe() << " is not a "
                << (copies ? "float32 or bfloat16" : "float32") << " buffer on " << device_.str()
                << ", the communicator's device");
}

std::int64_t NcclCommunicator::check_blocks(const Tensor& blocks, const char* call,
                                            std::string_view what, bool copies) const {
  check_buffer(blocks, call, what, copies);
  TL_CHECK(blocks.numel() % size_ == 0, ShapeError,
           what << ": NCCL " << call << " buffer " << blocks.describe() << " is not " << size_
                << " blocks of one size (one per rank)");
  return blocks.numel() / size_;
}

// Here Comm is complete in either build: a constructor that throws destroys comm_.
NcclCommunicator::NcclCommunicator(ProcessGroup& group, Device device,
                                   std::optional<std::chrono::milliseconds> deadline)
    : device_(device),
      rank_(group.rank()),
      size_(group.size()),
      deadline_(deadline ? *deadline : group.deadline()) {
  connect(group);
}

}  // namespace towerlab
