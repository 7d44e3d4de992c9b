// CUDA ReLU (contracts in kernels/relu.h): grid-stride loops, float32.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/relu.h"

namespace towerlab::cuda {

namespace {

__global__ void relu_forward_kernel(std::int64_t n, float* y, const float* x) {
  for (const std::int64_t i : grid_stride(n)) {
    y[i] = x[i] < 0.0f ? 0.0f : x[i];  // not fmaxf, which drops a NaN
  }
}

__global__ void relu_backward_kernel(std::int64_t n, float* grad_x, const float* grad_y,
                                     const float* y, bool assign) {
  for (const std::int64_t i : grid_stride(n)) {
    const float g = y[i] > 0.0f ? grad_y[i] : 0.0f;
    grad_x[i] = assign ? g : grad_x[i] + g;
  }
}

}  // namespace

void relu_forward(const Tensor& y, const Tensor& x, const Stream& stream) {
  launch_grid_stride(relu_forward_kernel, y.numel(), stream, y.data<float>(), x.data<float>());
}

void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
                   const Stream& stream, GradWrite write) {
  launch_grid_stride(relu_backward_kernel, grad_x.numel(), stream, grad_x.data<float>(),
                     grad_y.data<float>(), y.data<float>(), write == GradWrite::Assign);
}

}  // namespace towerlab::cuda
