// CUDA depthwise conv2d, float32 (kernels/conv2d_depthwise.h has the formulas,
// kernels/conv2d.h the contract). The forward and the input gradient are grid-stride
// loops with one thread per value written, each gathering its taps in the header's
// order. The weight gradient is a sum over N*P*Q terms per filter tap: one block per
// (k, r, s) sums its terms with block_sum (launch.cuh), a fixed order, so the bits
// repeat run to run.
#include "kernels/conv2d_depthwise.h"
#include "kernels/cuda/conv2d.h"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

// y [N,K,P,Q] from x [N,C,H,W], weight [K,R,S] and bias [K] (nullptr: none).
__global__ void depthwise_forward_kernel(std::int64_t n, DepthwiseShape d, float* y,
                                         const float* __restrict__ x,
                                         const float* __restrict__ weight,
                                         const float* __restrict__ bias) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t q = i % d.Q, p = (i / d.Q) % d.P, k = (i / (d.P * d.Q)) % d.K;
    const std::int64_t image = i / (d.K * d.P * d.Q);
    const float base = bias != nullptr ? bias[k] : 0.0f;
    y[i] = base + depthwise_output<float>(d, x, weight, image, k, p, q);
  }
}

// grad_x [N,C,H,W] assigned or added, from grad_y [N,K,P,Q] and weight [K,R,S].
__global__ void depthwise_grad_input_kernel(std::int64_t n, DepthwiseShape d, float* grad_x,
                                            const float* __restrict__ grad_y,
                                            const float* __restrict__ weight, bool assign) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t w = i % d.W, h = (i / d.W) % d.H, c = (i / (d.H * d.W)) % d.C;
    const std::int64_t image = i / (d.C * d.H * d.W);
    const float sum = depthwise_grad_input<float>(d, grad_y, weight, image, c, h, w);
    grad_x[i] = assign ? sum : grad_x[i] + sum;
  }
}

// grad_weight [K,R,S] += the sums; block b computes tap b = (k*R + r)*S + s.
__global__ void __launch_bounds__(kBlockSize)
    depthwise_grad_weight_kernel(DepthwiseShape d, float* grad_weight,
                                 const float* __restrict__ grad_y, const float* __restrict__ x) {
  const std::int64_t tap = blockIdx.x;
  const std::int64_t s = tap % d.S, r = (tap / d.S) % d.R, k = tap / (d.R * d.S);
  float sum = 0.0f;
  for (std::int64_t i = threadIdx.x; i < d.N * d.P * d.Q; i += kBlockSize) {
    sum += depthwise_weight_term<float>(d, grad_y, x, k, r, s, i);
  }
  sum = block_sum<kBlockSize>(sum);
  if (threadIdx.x == 0) grad_weight[tap] += sum;
}

DepthwiseShape depthwise_of(const Conv2dShape& s) {
  return depthwise_shape(s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.P, s.Q, s.params);
}

}  // namespace

void conv2d_depthwise_forward(const Tensor& y, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, const Conv2dShape& shape, const Stream& stream) {
  launch_grid_stride(depthwise_forward_kernel, y.numel(), stream, depthwise_of(shape),
                     y.data<float>(), x.data<float>(), weight.data<float>(),
                     bias.defined() ? bias.data<float>() : nullptr);
}

void conv2d_depthwise_backward(const Tensor& grad_x, const Tensor& grad_weight,
                               const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                               const Conv2dShape& shape, GradWrite grad_x_write,
                               const Stream& stream) {
  const DepthwiseShape d = depthwise_of(shape);
  if (grad_x.defined()) {
    launch_grid_stride(depthwise_grad_input_kernel, grad_x.numel(), stream, d, grad_x.data<float>(),
                       grad_y.data<float>(), weight.data<float>(),
                       grad_x_write == GradWrite::Assign);
  }
  if (grad_weight.defined()) {
    CudaDeviceGuard guard(stream.device().index);
    depthwise_grad_weight_kernel<<<static_cast<unsigned>(d.K * d.R * d.S), kBlockSize, 0,
                                   native(stream)>>>(d, grad_weight.data<float>(),
                                                     grad_y.data<float>(), x.data<float>());
    TL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace towerlab::cuda
