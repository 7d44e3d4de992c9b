#include "parallel/sharded_nccl.h"

#include <algorithm>

#include "engine/error.h"
#include "parallel/nccl_communicator.h"
#include "parallel/sharded_master.h"

namespace towerlab {

std::vector<RingRange> process_slices(std::int64_t length, std::int64_t towers, int ranks,
                                      std::int64_t exchange_length) {
  std::vector<RingRange> owned;
  for (int q = 0; q < ranks; ++q) {
    const std::vector<RingRange> pieces = sharded_slices(length, towers, ranks, q, exchange_length);
    owned.push_back({pieces.front().begin, pieces.back().end});
  }
  return owned;
}

ShardedNccl::ShardedNccl(std::vector<RingRange> owned, int rank, const Stream& stream)
    : owned_(std::move(owned)), rank_(rank) {
  TL_CHECK(rank >= 0 && std::size_t(rank) < owned_.size(), InvalidArgument,
           "sharded master on NCCL: rank " << rank << " of " << owned_.size());
  for (const RingRange& r : owned_) block_ = std::max(block_, r.size());
  blocks_ = Tensor::zeros({std::int64_t(owned_.size()) * block_}, stream);
}

Tensor ShardedNccl::mine(RingRange slice) const {
  const RingRange& own = owned_[std::size_t(rank_)];
  TL_CHECK(slice.begin >= own.begin && slice.end <= own.end, InvalidArgument,
           "sharded master on NCCL: slice [" << slice.begin << ", " << slice.end
                                             << ") outside rank " << rank_ << "'s [" << own.begin
                                             << ", " << own.end << ")");
  const std::int64_t at = rank_ * block_ + slice.begin - own.begin;
  return blocks_.slice(at, at + slice.size());
}

void ShardedNccl::reduce_scatter(NcclCommunicator& nccl, const Tensor& flat, const Stream& stream,
                                 std::string_view what) {
  for (std::size_t q = 0; q < owned_.size(); ++q) {
    const RingRange& r = owned_[q];
    const std::int64_t at = std::int64_t(q) * block_;
    copy_tensor(blocks_.slice(at, at + r.size()), flat.slice(r.begin, r.end), stream);
  }
  nccl.reduce_scatter_sum(blocks_, stream, what);
}

void ShardedNccl::all_gather(NcclCommunicator& nccl, const Tensor& flat, const Stream& stream,
                             std::string_view what) {
  nccl.all_gather(blocks_, stream, what);
  for (std::size_t q = 0; q < owned_.size(); ++q) {
    const RingRange& r = owned_[q];
    const std::int64_t at = std::int64_t(q) * block_;
    copy_tensor(flat.slice(r.begin, r.end), blocks_.slice(at, at + r.size()), stream);
  }
}

}  // namespace towerlab
