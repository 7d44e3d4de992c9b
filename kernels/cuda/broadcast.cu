// CUDA broadcasting add and mul and sum_to_shape (contracts in kernels/broadcast.h),
// float32.
//
// Both walk an index space described as data (StridedDims): sizes, row-major with
// the last dimension fastest, and each operand's stride in each dimension (0 where
// it is repeated). The host builds it once per call with the dimensions of size 1
// dropped and neighbours that every operand walks contiguously merged ([N,C,H,W]
// plus [C,1,1] is three dimensions, [N,D] plus [D] two), so a thread's index costs
// a division per remaining dimension. Merging keeps the row-major order of the walk.
//
//   broadcast_binary_kernel   a grid-stride loop over out's values, one operation
//                             each in float: the reference's bits.
//   sum_to_shape_kernel       a grid-stride loop over out's values; each thread sums
//                             its value's x values alone, in double, in row-major
//                             order of x's index, and rounds once: the reference's
//                             order, so its bits, with no atomics and no tree.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cuda/broadcast.h"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

// An index space of `rank` dimensions and the strides of two operands in it.
struct StridedDims {
  int rank = 0;
  std::int64_t size[kMaxBroadcastRank];
  std::int64_t stride[2][kMaxBroadcastRank];

  // Appends a dimension in front of those already added (they are walked from the
  // last), merged with the one added before when both operands continue their walk
  // contiguously across it. Size-1 dimensions add nothing.
  void push_front(std::int64_t n, std::int64_t s0, std::int64_t s1) {
    if (n == 1) return;
    const int last = kMaxBroadcastRank - rank;  // the front dimension so far, stored at the end
    if (rank > 0 && s0 == stride[0][last] * size[last] && s1 == stride[1][last] * size[last]) {
      size[last] *= n;
      return;
    }
    ++rank;
    size[last - 1] = n;
    stride[0][last - 1] = s0;
    stride[1][last - 1] = s1;
  }
  // Moves the dimensions, built from the back of the arrays, to their front.
  StridedDims packed() const {
    StridedDims p;
    p.rank = rank;
    for (int d = 0; d < rank; ++d) {
      p.size[d] = size[kMaxBroadcastRank - rank + d];
      p.stride[0][d] = stride[0][kMaxBroadcastRank - rank + d];
      p.stride[1][d] = stride[1][kMaxBroadcastRank - rank + d];
    }
    return p;
  }
};

// The two operands' offsets of flat index i of the space.
struct Offsets {
  std::int64_t first = 0, second = 0;
};
__device__ Offsets offsets_of(std::int64_t i, const StridedDims& dims) {
  Offsets o;
  for (int d = dims.rank - 1; d >= 0; --d) {
    const std::int64_t coord = i % dims.size[d];
    i /= dims.size[d];
    o.first += coord * dims.stride[0][d];
    o.second += coord * dims.stride[1][d];
  }
  return o;
}

// The row-major strides of `shape` aligned to `rank` dimensions, 0 where the size is 1.
void broadcast_strides(const Shape& shape, std::size_t rank, std::int64_t* strides) {
  std::int64_t stride = 1;
  for (std::size_t k = 0; k < rank; ++k) {
    const std::int64_t size = k < shape.size() ? shape[shape.size() - 1 - k] : 1;
    strides[rank - 1 - k] = size == 1 ? 0 : stride;
    stride *= size;
  }
}

__global__ void broadcast_binary_kernel(std::int64_t n, float* out, const float* a, const float* b,
                                        StridedDims dims, bool mul) {
  for (const std::int64_t i : grid_stride(n)) {
    const Offsets o = offsets_of(i, dims);
    out[i] = mul ? a[o.first] * b[o.second] : a[o.first] + b[o.second];
  }
}

// out's space is `kept` (operand 0: x's stride); each out value sums x over
// `reduced` (operand 0: x's stride) from its base offset.
__global__ void sum_to_shape_kernel(std::int64_t n, float* __restrict__ out,
                                    const float* __restrict__ x, StridedDims kept,
                                    StridedDims reduced, std::int64_t count, bool assign) {
  for (const std::int64_t o : grid_stride(n)) {
    const std::int64_t base = offsets_of(o, kept).first;
    double sum = 0.0;
    for (std::int64_t r = 0; r < count; ++r) sum += double(x[base + offsets_of(r, reduced).first]);
    out[o] = assign ? static_cast<float>(sum) : static_cast<float>(double(out[o]) + sum);
  }
}

}  // namespace

void broadcast_binary(const Tensor& out, const Tensor& a, const Tensor& b, BroadcastOp op,
                      const Stream& stream) {
  const std::size_t rank = out.shape().size();
  std::int64_t a_strides[kMaxBroadcastRank], b_strides[kMaxBroadcastRank];
  broadcast_strides(a.shape(), rank, a_strides);
  broadcast_strides(b.shape(), rank, b_strides);
  StridedDims dims;
  for (std::size_t d = rank; d-- > 0;) dims.push_front(out.shape()[d], a_strides[d], b_strides[d]);
  launch_grid_stride(broadcast_binary_kernel, out.numel(), stream, out.data<float>(),
                     a.data<float>(), b.data<float>(), dims.packed(), op == BroadcastOp::Mul);
}

void sum_to_shape(const Tensor& out, const Tensor& x, GradWrite write, const Stream& stream) {
  const std::size_t rank = x.shape().size();
  std::int64_t x_strides[kMaxBroadcastRank], out_strides[kMaxBroadcastRank];
  broadcast_strides(x.shape(), rank, x_strides);
  broadcast_strides(out.shape(), rank, out_strides);
  StridedDims kept, reduced;  // operand 0: x's strides (operand 1 unused: 0)
  for (std::size_t d = rank; d-- > 0;) {
    const std::int64_t size = x.shape()[d];
    const bool repeated = out_strides[d] == 0 && size != 1;
    (repeated ? reduced : kept).push_front(size, x_strides[d], 0);
  }
  const StridedDims reduced_dims = reduced.packed();
  std::int64_t count = 1;
  for (int d = 0; d < reduced_dims.rank; ++d) count *= reduced_dims.size[d];
  if (x.numel() == 0) count = 0;  // a zero-size repeated dimension: every sum is empty
  launch_grid_stride(sum_to_shape_kernel, out.numel(), stream, out.data<float>(), x.data<float>(),
                     kept.packed(), reduced_dims, count, write == GradWrite::Assign);
}

}  // namespace towerlab::cuda
