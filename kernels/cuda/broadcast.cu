// CUDA broadcasting add, sub and mul and sum_to_shape (contracts in kernels/broadcast.h),
// float32.
//
// Both walk the index spaces of kernels/broadcast_plan.h (size-1 dimensions
// dropped, contiguous neighbours merged), so a thread's index costs a division per
// remaining dimension.
//
//   broadcast_binary_kernel   a grid-stride loop over out's values, one operation
//                             each in float: the reference's bits.
//   sum_to_shape_kernel       a grid-stride loop over out's values; each thread sums
//                             its value's x values alone, in double, in row-major
//                             order of x's index, and rounds once: the reference's
//                             order, so its bits, with no atomics and no tree.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/broadcast_plan.h"
#include "kernels/cuda/broadcast.h"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

using kernels::StridedDims;

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

__global__ void broadcast_binary_kernel(std::int64_t n, float* out, const float* a, const float* b,
                                        StridedDims dims, BroadcastOp op) {
  for (const std::int64_t i : grid_stride(n)) {
    const Offsets o = offsets_of(i, dims);
    const float va = a[o.first], vb = b[o.second];
    out[i] = op == BroadcastOp::Mul ? va * vb : op == BroadcastOp::Sub ? va - vb : va + vb;
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
  launch_grid_stride(broadcast_binary_kernel, out.numel(), stream, out.data<float>(),
                     a.data<float>(), b.data<float>(),
                     kernels::binary_dims(out.shape(), a.shape(), b.shape()), op);
}

void sum_to_shape(const Tensor& out, const Tensor& x, GradWrite write, const Stream& stream) {
  const kernels::SumDims plan = kernels::sum_dims(out.shape(), x.shape());
  launch_grid_stride(sum_to_shape_kernel, out.numel(), stream, out.data<float>(), x.data<float>(),
                     plan.kept, plan.reduced, plan.count, write == GradWrite::Assign);
}

}  // namespace towerlab::cuda
