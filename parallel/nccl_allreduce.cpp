#include "parallel/nccl_allreduce.h"

#include <set>
#include <sstream>

#include "engine/error.h"

#if TOWERLAB_WITH_NCCL
#include "parallel/nccl_check.h"
#endif

namespace towerlab {

#if TOWERLAB_WITH_NCCL
struct NcclAllReduce::Comms {
  std::vector<ncclComm_t> comms;
  ~Comms() {
    for (ncclComm_t c : comms) ncclCommDestroy(c);
  }
};
#else
struct NcclAllReduce::Comms {};
#endif

bool NcclAllReduce::available() {
  return TOWERLAB_WITH_NCCL != 0;
}

NcclAllReduce::NcclAllReduce(std::vector<const Stream*> streams) : streams_(std::move(streams)) {
  TL_CHECK(available(), NotSupported,
           "NCCL all-reduce: this build of towerlab has no NCCL (use the ring)");
  TL_CHECK(streams_.size() >= 2, InvalidArgument,
           "NCCL all-reduce needs two or more GPUs, got " << streams_.size() << " tower(s)");
  std::set<int> seen;
  for (const Stream* s : streams_) {
    TL_CHECK(s->device().is_cuda(), InvalidArgument,
             "NCCL all-reduce needs one tower per physical GPU; "
                 << s->device().str() << " is not a GPU (use the ring)");
    TL_CHECK(seen.insert(s->device().index).second, InvalidArgument,
             "NCCL all-reduce needs one tower per physical GPU; "
                 << s->device().str() << " appears twice (virtual devices use the ring)");
  }
#if TOWERLAB_WITH_NCCL
  comms_ = std::make_unique<Comms>();
  comms_->comms.resize(streams_.size());
  std::vector<int> devices(seen.begin(), seen.end());
  for (std::size_t i = 0; i < streams_.size(); ++i) devices[i] = streams_[i]->device().index;
  TL_NCCL_CHECK(ncclCommInitAll(comms_->comms.data(), int(devices.size()), devices.data()), nullptr,
                "NCCL all-reduce");
#endif
}

NcclAllReduce::~NcclAllReduce() = default;

void NcclAllReduce::allreduce(const std::vector<Tensor>& buffers) {
  TL_CHECK(
      buffers.size() == streams_.size(), InvalidArgument,
      "NCCL all-reduce: " << buffers.size() << " buffers for " << streams_.size() << " members");
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    TL_CHECK(buffers[i].numel() == buffers[0].numel() && buffers[i].dtype() == DType::Float32 &&
                 buffers[i].device() == streams_[i]->device(),
             ShapeError, "NCCL all-reduce: member " << i << " has " << buffers[i].describe());
  }
#if TOWERLAB_WITH_NCCL
  TL_NCCL_CHECK(ncclGroupStart(), nullptr, "NCCL all-reduce");
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    TL_NCCL_CHECK(
        ncclAllReduce(buffers[i].raw_data(), buffers[i].raw_data(), std::size_t(buffers[i].numel()),
                      ncclFloat, ncclSum, comms_->comms[i],
                      static_cast<cudaStream_t>(streams_[i]->native_handle())),
        comms_->comms[i], "NCCL all-reduce");
  }
  TL_NCCL_CHECK(ncclGroupEnd(), nullptr, "NCCL all-reduce");
#endif
}

}  // namespace towerlab
