// The broadcasting kernels' index spaces (kernels/broadcast_plan.h).
#include "kernels/broadcast_plan.h"

namespace towerlab::kernels {

namespace {

// The row-major strides of `shape` aligned to `rank` dimensions, 0 where the size is 1.
void broadcast_strides(const Shape& shape, std::size_t rank, std::int64_t* strides) {
  std::int64_t stride = 1;
  for (std::size_t k = 0; k < rank; ++k) {
    const std::int64_t size = k < shape.size() ? shape[shape.size() - 1 - k] : 1;
    strides[rank - 1 - k] = size == 1 ? 0 : stride;
    stride *= size;
  }
}

// Builds a space from its last dimension to its first: each dimension is put in
// front of those already there, or merged into the front one when every operand
// walks on contiguously across it (its stride is the front one's times that one's
// size). Size-1 dimensions add nothing.
class Builder {
 public:
  void push_front(std::int64_t n, std::int64_t s0, std::int64_t s1) {
    if (n == 1) return;
    if (rank_ > 0 && s0 == stride_[0][0] * size_[0] && s1 == stride_[1][0] * size_[0]) {
      size_[0] *= n;
      return;
    }
    for (int d = rank_; d > 0; --d) {
      size_[d] = size_[d - 1];
      stride_[0][d] = stride_[0][d - 1];
      stride_[1][d] = stride_[1][d - 1];
    }
    size_[0] = n;
    stride_[0][0] = s0;
    stride_[1][0] = s1;
    ++rank_;
  }
  StridedDims dims() const {
    StridedDims d;
    d.rank = rank_;
    for (int k = 0; k < rank_; ++k) {
      d.size[k] = size_[k];
      d.stride[0][k] = stride_[0][k];
      d.stride[1][k] = stride_[1][k];
    }
    return d;
  }

 private:
  int rank_ = 0;
  std::int64_t size_[kMaxBroadcastRank] = {};
  std::int64_t stride_[2][kMaxBroadcastRank] = {};
};

}  // namespace

StridedDims binary_dims(const Shape& out, const Shape& a, const Shape& b) {
  const std::size_t rank = out.size();
  std::int64_t a_strides[kMaxBroadcastRank], b_strides[kMaxBroadcastRank];
  broadcast_strides(a, rank, a_strides);
  broadcast_strides(b, rank, b_strides);
  Builder space;
  for (std::size_t d = rank; d-- > 0;) space.push_front(out[d], a_strides[d], b_strides[d]);
  return space.dims();
}

SumDims sum_dims(const Shape& out, const Shape& x) {
  const std::size_t rank = x.size();
  std::int64_t x_strides[kMaxBroadcastRank], out_strides[kMaxBroadcastRank];
  broadcast_strides(x, rank, x_strides);
  broadcast_strides(out, rank, out_strides);
  Builder kept, reduced;
  for (std::size_t d = rank; d-- > 0;) {
    const bool repeated = out_strides[d] == 0 && x[d] != 1;
    (repeated ? reduced : kept).push_front(x[d], x_strides[d], 0);
  }
  SumDims plan{kept.dims(), reduced.dims(), numel_of(x) == 0 ? 0 : 1};
  for (int d = 0; d < plan.reduced.rank; ++d) plan.count *= plan.reduced.size[d];
  return plan;
}

}  // namespace towerlab::kernels
