// CUDA softmax and log-softmax (contracts in kernels/softmax.h), float32: one warp
// per row, kRowsPerBlock rows to a block, a grid-stride loop over rows when there
// are more rows than the grid has warps.
//
// A row takes three reads in the forward (its maximum, the sum of exp(x - max),
// the outputs; the second and third hit L1, the warp has just read the row) and two
// in the backward (the row's sum, the outputs). Lane l visits j = l, l + 32, ...,
// accumulating in that order, then the warp combines its lanes with warp_sum's
// fixed butterfly (kernels/cuda/launch.cuh) or the same butterfly of fmaxf: every
// lane ends with the same sum, and the same inputs give the same bits every run.
// No shared memory and no block barrier: the warp's shuffles are its only
// synchronization, and they also order a lane's reads of x before any lane writes
// y, so y may alias x.
//
// fmaxf drops a NaN, as the reference's `x > m` does: a NaN then reaches every
// output through the sum (kernels/softmax.h's NaN rule). A warp per row keeps a
// 4096-wide row at 128 values a lane; vocabulary-sized rows would want a block
// per row.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/softmax.h"

namespace towerlab::cuda {

namespace {

constexpr int kRowsPerBlock = kBlockSize / kWarpSize;

// The maximum of v over the warp, in every lane (warp_sum's butterfly).
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Kept values at the start of row r: every column, or r mod D + 1 under the mask.
__device__ __forceinline__ std::int64_t kept_in_row(std::int64_t row, std::int64_t cols,
                                                    bool causal) {
  return causal ? row % cols + 1 : cols;
}

__global__ void softmax_forward_kernel(std::int64_t rows, float* y, const float* x,
                                       std::int64_t cols, bool log, bool causal) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t first = std::int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  for (std::int64_t row = first; row < rows; row += std::int64_t{gridDim.x} * kRowsPerBlock) {
    const float* in = x + row * cols;  // [D]
    float* out = y + row * cols;       // [D]
    const std::int64_t kept = kept_in_row(row, cols, causal);
    float m = -INFINITY;
    for (std::int64_t j = lane; j < kept; j += kWarpSize) m = fmaxf(m, in[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (std::int64_t j = lane; j < kept; j += kWarpSize) sum += expf(in[j] - m);
    sum = warp_sum(sum);
    const float log_sum = logf(sum);
    for (std::int64_t j = lane; j < cols; j += kWarpSize) {
      if (j < kept) {
        const float shifted = in[j] - m;
        out[j] = log ? shifted - log_sum : expf(shifted) / sum;
      } else {
        out[j] = log ? -INFINITY : 0.0f;
      }
    }
  }
}

__global__ void softmax_backward_kernel(std::int64_t rows, float* grad_x, const float* grad_y,
                                        const float* y, std::int64_t cols, bool log, bool causal,
                                        bool assign) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t first = std::int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  for (std::int64_t row = first; row < rows; row += std::int64_t{gridDim.x} * kRowsPerBlock) {
    const float* gy = grad_y + row * cols;  // [D]
    const float* out = y + row * cols;      // [D]
    float* gx = grad_x + row * cols;        // [D]
    const std::int64_t kept = kept_in_row(row, cols, causal);
    float sum = 0.0f;  // log-softmax: sum grad_y; softmax: sum grad_y * y
    for (std::int64_t j = lane; j < kept; j += kWarpSize) sum += log ? gy[j] : gy[j] * out[j];
    sum = warp_sum(sum);
    for (std::int64_t j = lane; j < cols; j += kWarpSize) {
      float g = 0.0f;
      if (j < kept) g = log ? gy[j] - expf(out[j]) * sum : out[j] * (gy[j] - sum);
      gx[j] = assign ? g : gx[j] + g;
    }
  }
}

// Blocks for one warp per row: enough to fill the device, no more (grid_for).
unsigned row_grid(std::int64_t rows, const Stream& stream) {
  return grid_for(rows, stream, kRowsPerBlock);
}

}  // namespace

void softmax_forward(const Tensor& y, const Tensor& x, SoftmaxKind kind, SoftmaxMask mask,
                     const Stream& stream) {
  const std::int64_t cols = x.shape().back();
  const std::int64_t rows = x.numel() / cols;
  CudaDeviceGuard guard(stream.device().index);
  softmax_forward_kernel<<<row_grid(rows, stream), kBlockSize, 0, native(stream)>>>(
      rows, y.data<float>(), x.data<float>(), cols, kind == SoftmaxKind::LogSoftmax,
      mask == SoftmaxMask::Causal);
  TL_CUDA_CHECK_LAUNCH();
}

void softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, SoftmaxKind kind,
                      SoftmaxMask mask, const Stream& stream, GradWrite write) {
  const std::int64_t cols = y.shape().back();
  const std::int64_t rows = y.numel() / cols;
  CudaDeviceGuard guard(stream.device().index);
  softmax_backward_kernel<<<row_grid(rows, stream), kBlockSize, 0, native(stream)>>>(
      rows, grad_x.data<float>(), grad_y.data<float>(), y.data<float>(), cols,
      kind == SoftmaxKind::LogSoftmax, mask == SoftmaxMask::Causal, write == GradWrite::Assign);
  TL_CUDA_CHECK_LAUNCH();
}

}  // namespace towerlab::cuda
