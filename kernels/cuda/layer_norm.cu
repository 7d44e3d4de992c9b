// CUDA layer normalization (contracts in kernels/layer_norm.h), float32.
//
// The forward and grad_x give each row to one warp, kRowsPerBlock rows to a block,
// as softmax does (kernels/cuda/softmax.cu): lane l visits d = l, l + 32, ... in
// order and warp_sum's fixed butterfly (kernels/cuda/launch.cuh) combines the
// lanes, so every lane holds the row's sums and the same inputs give the same bits
// every run. The forward sums x - K with K the row's first value (a sample of the
// row, so the sum stays near the size of the deviations even for a row around
// 1e4; batch norm's shift, kernels/batchnorm.h), then the squared deviations from
// the mean in a second pass; the second and third reads of a row hit L1.
//
// grad_weight and grad_bias are sums over rows, in two stages without atomics:
//   1. the rows are cut into S = min(ceil(R / kRowsPerSplit), kMaxSplits) blocks
//      of consecutive rows; thread (column d, block s) sums its rows in row order
//      into partial[s, d] (the reads of a row are coalesced across the threads);
//   2. split_reduce (kernels/cuda/split_reduce.cuh) adds the S partials of each
//      column in its pairwise tree and adds the sum into the gradient.
// S depends on R only (not on the device's SM count), so a shape gives the same
// bits on every GPU.
// The files an op takes, in order: the top of kernels/relu.h.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/split_reduce.cuh"

namespace towerlab::cuda {

namespace {

constexpr int kRowsPerBlock = kBlockSize / kWarpSize;
constexpr std::int64_t kRowsPerSplit = 32;

__global__ void layer_norm_forward_kernel(std::int64_t rows, float* y, float* mean, float* rstd,
                                          const float* x, const float* weight, const float* bias,
                                          std::int64_t cols, float eps) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t first = std::int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  for (std::int64_t row = first; row < rows; row += std::int64_t{gridDim.x} * kRowsPerBlock) {
    const float* in = x + row * cols;  // [D]
    float* out = y + row * cols;       // [D]
    const float shift = in[0];
    float sum = 0.0f;
    for (std::int64_t j = lane; j < cols; j += kWarpSize) sum += in[j] - shift;
    // mean = shift + delta; deviations are (x - shift) - delta, never x - (shift +
    // delta), whose rounding to float would lose delta's digits below the ulp of a
    // large shift.
    const float delta = warp_sum(sum) / static_cast<float>(cols);
    const float mu = shift + delta;
    float m2 = 0.0f;
    for (std::int64_t j = lane; j < cols; j += kWarpSize) {
      const float dev = (in[j] - shift) - delta;
      m2 += dev * dev;
    }
    const float r = 1.0f / sqrtf(warp_sum(m2) / static_cast<float>(cols) + eps);
    if (lane == 0) {
      mean[row] = mu;
      rstd[row] = r;
    }
    for (std::int64_t j = lane; j < cols; j += kWarpSize) {
      float v = ((in[j] - shift) - delta) * r;
      if (weight != nullptr) v *= weight[j];
      if (bias != nullptr) v += bias[j];
      out[j] = v;
    }
  }
}

__global__ void layer_norm_backward_x_kernel(std::int64_t rows, float* grad_x, const float* grad_y,
                                             const float* x, const float* weight, const float* mean,
                                             const float* rstd, std::int64_t cols, bool assign) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t first = std::int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  for (std::int64_t row = first; row < rows; row += std::int64_t{gridDim.x} * kRowsPerBlock) {
    const float* in = x + row * cols;       // [D]
    const float* gy = grad_y + row * cols;  // [D]
    float* gx = grad_x + row * cols;        // [D]
    const float mu = mean[row], r = rstd[row];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;  // g = grad_y * weight
    for (std::int64_t j = lane; j < cols; j += kWarpSize) {
      const float g = weight != nullptr ? gy[j] * weight[j] : gy[j];
      sum_g += g;
      sum_g_xhat += g * ((in[j] - mu) * r);
    }
    const float mean_g = warp_sum(sum_g) / static_cast<float>(cols);
    const float mean_g_xhat = warp_sum(sum_g_xhat) / static_cast<float>(cols);
    for (std::int64_t j = lane; j < cols; j += kWarpSize) {
      const float g = weight != nullptr ? gy[j] * weight[j] : gy[j];
      const float v = r * (g - mean_g - (in[j] - mu) * r * mean_g_xhat);
      gx[j] = assign ? v : gx[j] + v;
    }
  }
}

// Stage 1 of the weight and bias gradients: partial_w[s, d] = sum over the rows of
// block s (row order) of grad_y * x_hat, partial_b[s, d] of grad_y. Grid: (column
// blocks, S).
__global__ void layer_norm_params_partial_kernel(float* partial_w, float* partial_b,
                                                 const float* grad_y, const float* x,
                                                 const float* mean, const float* rstd,
                                                 std::int64_t rows, std::int64_t cols,
                                                 std::int64_t rows_per_split) {
  const std::int64_t d = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (d >= cols) return;
  const std::int64_t s = blockIdx.y;
  const std::int64_t end = std::min(rows, (s + 1) * rows_per_split);
  float sum_w = 0.0f, sum_b = 0.0f;
  for (std::int64_t row = s * rows_per_split; row < end; ++row) {
    const float g = grad_y[row * cols + d];
    sum_w += g * ((x[row * cols + d] - mean[row]) * rstd[row]);
    sum_b += g;
  }
  partial_w[s * cols + d] = sum_w;
  partial_b[s * cols + d] = sum_b;
}

// Blocks for one warp per row: enough to fill the device, no more (grid_for).
unsigned row_grid(std::int64_t rows, const Stream& stream) {
  return grid_for(rows, stream, kRowsPerBlock);
}

const float* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}

// The weight and bias gradients, in the two stages above.
void params_backward(const LayerNormBackward& args, std::int64_t rows, std::int64_t cols,
                     const Stream& stream) {
  const int splits = static_cast<int>(
      std::clamp<std::int64_t>((rows + kRowsPerSplit - 1) / kRowsPerSplit, 1, kMaxSplits));
  const std::int64_t rows_per_split = (rows + splits - 1) / splits;
  Scratch partial(stream, 2 * static_cast<std::size_t>(splits * cols) * sizeof(float));
  float* partial_w = partial.as<float>();        // [S, D]
  float* partial_b = partial_w + splits * cols;  // [S, D]
  const dim3 grid(static_cast<unsigned>((cols + kBlockSize - 1) / kBlockSize),
                  static_cast<unsigned>(splits));
  layer_norm_params_partial_kernel<<<grid, kBlockSize, 0, native(stream)>>>(
      partial_w, partial_b, args.grad_y.data<float>(), args.x.data<float>(),
      args.mean.data<float>(), args.rstd.data<float>(), rows, cols, rows_per_split);
  TL_CUDA_CHECK_LAUNCH();
  if (args.grad_weight.defined()) {
    split_reduce(partial_w, cols, splits, AccumulateInto{args.grad_weight.data<float>()}, stream);
  }
  if (args.grad_bias.defined()) {
    split_reduce(partial_b, cols, splits, AccumulateInto{args.grad_bias.data<float>()}, stream);
  }
}

}  // namespace

void layer_norm_forward(const LayerNormForward& args, const Stream& stream) {
  const std::int64_t cols = args.x.shape().back();
  const std::int64_t rows = args.x.numel() / cols;
  CudaDeviceGuard guard(stream.device().index);
  layer_norm_forward_kernel<<<row_grid(rows, stream), kBlockSize, 0, native(stream)>>>(
      rows, args.y.data<float>(), args.mean.data<float>(), args.rstd.data<float>(),
      args.x.data<float>(), data_or_null(args.weight), data_or_null(args.bias), cols,
      static_cast<float>(args.eps));
  TL_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward(const LayerNormBackward& args, const Stream& stream) {
  const std::int64_t cols = args.x.shape().back();
  const std::int64_t rows = args.x.numel() / cols;
  CudaDeviceGuard guard(stream.device().index);
  if (args.grad_x.defined()) {
    layer_norm_backward_x_kernel<<<row_grid(rows, stream), kBlockSize, 0, native(stream)>>>(
        rows, args.grad_x.data<float>(), args.grad_y.data<float>(), args.x.data<float>(),
        data_or_null(args.weight), args.mean.data<float>(), args.rstd.data<float>(), cols,
        args.grad_x_write == GradWrite::Assign);
    TL_CUDA_CHECK_LAUNCH();
  }
  if (args.grad_weight.defined() || args.grad_bias.defined()) {
    params_backward(args, rows, cols, stream);
  }
}

}  // namespace towerlab::cuda
