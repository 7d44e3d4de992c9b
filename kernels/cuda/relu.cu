// CUDA ReLU (contracts in kernels/relu.h): grid-stride loops, one kernel per
// direction templated on the storage type (float, bfloat16, float16), the values
// compared and added in float32 and a 16-bit result rounded once as it is stored.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cuda/gpu_dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/relu.h"

namespace towerlab::cuda {

namespace {

template <typename T>
__global__ void relu_forward_kernel(std::int64_t n, T* y, const T* x) {
  for (const std::int64_t i : grid_stride(n)) {
    const T v = x[i];
    y[i] = static_cast<float>(v) < 0.0f ? T(0.0f) : v;  // not fmaxf, which drops a NaN
  }
}

template <typename T>
__global__ void relu_backward_kernel(std::int64_t n, T* grad_x, const T* grad_y, const T* y,
                                     bool assign) {
  for (const std::int64_t i : grid_stride(n)) {
    const float g = static_cast<float>(y[i]) > 0.0f ? static_cast<float>(grad_y[i]) : 0.0f;
    grad_x[i] = T(assign ? g : static_cast<float>(grad_x[i]) + g);
  }
}

}  // namespace

void relu_forward(const Tensor& y, const Tensor& x, const Stream& stream) {
  with_gpu_dtype("relu_forward", y, [&]<typename T>() {
    launch_grid_stride(relu_forward_kernel<T>, y.numel(), stream, y.data<T>(), x.data<T>());
  });
}

void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
                   const Stream& stream, GradWrite write) {
  with_gpu_dtype("relu_backward", grad_x, [&]<typename T>() {
    launch_grid_stride(relu_backward_kernel<T>, grad_x.numel(), stream, grad_x.data<T>(),
                       grad_y.data<T>(), y.data<T>(), write == GradWrite::Assign);
  });
}

}  // namespace towerlab::cuda
