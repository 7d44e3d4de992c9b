// CUDA bias add (contracts in kernels/bias.h), float32. The forward is a
// grid-stride loop that tracks each element's channel; the backward is the
// two-level per-channel sum of kernels/cuda/per_channel.cuh (block partials, then
// one thread per channel adding them in double and into grad_bias), so the
// result does not depend on scheduling. The fused bias + ReLU kernels are the same
// two patterns, the backward's blocks also adding the masked gradient into grad_x
// as they read it.
#include "kernels/cuda/bias.h"
#include "kernels/cuda/per_channel.cuh"

namespace towerlab::cuda {

namespace {

// y may alias x (in-place bias add).
__global__ void bias_add_forward_kernel(std::int64_t n, float* y, const float* x,
                                        const float* __restrict__ bias, std::int64_t C,
                                        std::int64_t S) {
  for_each_with_channel(
      n, C, S, [&](std::int64_t i) { return x[i]; },
      [&](std::int64_t i, float v, std::int64_t c) { y[i] = v + bias[c]; });
}

// y may alias x. "v < 0 ? 0 : v", not fmaxf, which drops a NaN (kernels/relu.h).
__global__ void bias_add_relu_forward_kernel(std::int64_t n, float* y, const float* x,
                                             const float* __restrict__ bias, std::int64_t C,
                                             std::int64_t S) {
  for_each_with_channel(
      n, C, S, [&](std::int64_t i) { return x[i]; },
      [&](std::int64_t i, float v, std::int64_t c) {
        const float z = v + bias[c];
        y[i] = z < 0.0f ? 0.0f : z;
      });
}

// partial: [C, splits]; block (c, j) sums range j of channel c (ChannelSplit).
__global__ void bias_backward_partial_kernel(ChannelSplit split, float* partial,
                                             const float* __restrict__ grad_y) {
  float sum = 0.0f;
  for_each_in_split(
      split, [&](std::int64_t offset) { return grad_y[offset]; }, [&](float v) { sum += v; });
  sum = block_sum<kReduceBlock>(sum);
  if (threadIdx.x == 0) partial[split.partial_index()] = sum;
}

// A masked gradient value and where it goes in grad_x.
struct MaskedGrad {
  std::int64_t offset;
  float g;
};

// As bias_backward_partial_kernel on g = grad_y * (y > 0), adding each g into
// grad_x (when not null): every element belongs to exactly one block's range.
__global__ void bias_relu_backward_partial_kernel(ChannelSplit split, float* partial, float* grad_x,
                                                  const float* __restrict__ grad_y,
                                                  const float* __restrict__ y) {
  float sum = 0.0f;
  for_each_in_split(
      split,
      [&](std::int64_t offset) {
        return MaskedGrad{offset, y[offset] > 0.0f ? grad_y[offset] : 0.0f};
      },
      [&](MaskedGrad m) {
        if (grad_x != nullptr) grad_x[m.offset] += m.g;
        sum += m.g;
      });
  sum = block_sum<kReduceBlock>(sum);
  if (threadIdx.x == 0) partial[split.partial_index()] = sum;
}

__global__ void bias_backward_finish_kernel(std::int64_t C, float* grad_bias, const float* partial,
                                            std::int64_t splits) {
  for (const std::int64_t c : grid_stride(C)) {
    double sum = 0.0;
    for (std::int64_t j = 0; j < splits; ++j) sum += partial[c * splits + j];
    grad_bias[c] = static_cast<float>(grad_bias[c] + sum);
  }
}

// The per-channel sum of grad_y (masked by y > 0 when y is not null, then also
// added into grad_x when that is not null) added into grad_bias.
void bias_backward(float* grad_bias, float* grad_x, const float* grad_y, const float* y,
                   std::int64_t N, std::int64_t C, std::int64_t S, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const ChannelSplit split = channel_split(N, C, S, stream);
  Scratch partial(stream, C * split.splits * sizeof(float));
  if (y == nullptr) {
    launch_channel_split(bias_backward_partial_kernel, split, stream, partial.as<float>(), grad_y);
  } else {
    launch_channel_split(bias_relu_backward_partial_kernel, split, stream, partial.as<float>(),
                         grad_x, grad_y, y);
  }
  launch_grid_stride(bias_backward_finish_kernel, C, stream, grad_bias, partial.as<float>(),
                     split.splits);
}

}  // namespace

void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                      std::int64_t C, std::int64_t S, const Stream& stream) {
  launch_grid_stride(bias_add_forward_kernel, N * C * S, stream, y.data<float>(), x.data<float>(),
                     bias.data<float>(), C, S);
}

void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, std::int64_t N,
                       std::int64_t C, std::int64_t S, const Stream& stream) {
  bias_backward(grad_bias.data<float>(), nullptr, grad_y.data<float>(), nullptr, N, C, S, stream);
}

void bias_add_relu_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                           std::int64_t C, std::int64_t S, const Stream& stream) {
  launch_grid_stride(bias_add_relu_forward_kernel, N * C * S, stream, y.data<float>(),
                     x.data<float>(), bias.data<float>(), C, S);
}

void bias_add_relu_backward(const Tensor& grad_x, const Tensor& grad_bias, const Tensor& grad_y,
                            const Tensor& y, std::int64_t N, std::int64_t C, std::int64_t S,
                            const Stream& stream) {
  bias_backward(grad_bias.data<float>(), grad_x.defined() ? grad_x.data<float>() : nullptr,
                grad_y.data<float>(), y.data<float>(), N, C, S, stream);
}

}  // namespace towerlab::cuda
