// CUDA residual add + ReLU (contracts in kernels/add_relu.h): grid-stride loops, one
// kernel per direction templated on the storage type (float, bfloat16, float16), the
// values added in float32 and a 16-bit result rounded once as it is stored. The
// forward's sum is one rounded addition and the backward adds the masked gradient
// with one rounded addition, as the CPU does; no product, so no contraction can make
// them differ.
#include "kernels/cuda/add_relu.h"
#include "kernels/cuda/gpu_dtype.cuh"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

template <typename T>
__global__ void add_relu_forward_kernel(std::int64_t n, T* y, const T* a, const T* b) {
  for (const std::int64_t i : grid_stride(n)) {
    const float sum = static_cast<float>(a[i]) + static_cast<float>(b[i]);
    y[i] = T(sum < 0.0f ? 0.0f : sum);  // not fmaxf, which drops a NaN
  }
}

// grad_a or grad_b null: not computed; they may be one buffer (grad_a written first).
template <typename T>
__global__ void add_relu_backward_kernel(std::int64_t n, T* grad_a, bool assign_a, T* grad_b,
                                         bool assign_b, const T* grad_y, const T* y) {
  for (const std::int64_t i : grid_stride(n)) {
    const float g = static_cast<float>(y[i]) > 0.0f ? static_cast<float>(grad_y[i]) : 0.0f;
    if (grad_a != nullptr) grad_a[i] = T(assign_a ? g : static_cast<float>(grad_a[i]) + g);
    if (grad_b != nullptr) grad_b[i] = T(assign_b ? g : static_cast<float>(grad_b[i]) + g);
  }
}

template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

void add_relu_forward(const Tensor& y, const Tensor& a, const Tensor& b, const Stream& stream) {
  with_gpu_dtype("add_relu_forward", y, [&]<typename T>() {
    launch_grid_stride(add_relu_forward_kernel<T>, y.numel(), stream, y.data<T>(), a.data<T>(),
                       b.data<T>());
  });
}

void add_relu_backward(const AddReluBackward& args, const Stream& stream) {
  with_gpu_dtype("add_relu_backward", args.grad_y, [&]<typename T>() {
    launch_grid_stride(add_relu_backward_kernel<T>, args.grad_y.numel(), stream,
                       data_or_null<T>(args.grad_a), args.grad_a_write == GradWrite::Assign,
                       data_or_null<T>(args.grad_b), args.grad_b_write == GradWrite::Assign,
                       args.grad_y.data<T>(), args.y.data<T>());
  });
}

}  // namespace towerlab::cuda
