// CUDA residual add + ReLU (contracts in kernels/add_relu.h): grid-stride loops,
// float32. The forward's sum is one rounded addition and the backward adds the masked
// gradient with one rounded addition, as the CPU does; no product, so no contraction
// can make them differ.
#include "kernels/cuda/add_relu.h"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

__global__ void add_relu_forward_kernel(std::int64_t n, float* y, const float* a, const float* b) {
  for (const std::int64_t i : grid_stride(n)) {
    const float sum = a[i] + b[i];
    y[i] = sum < 0.0f ? 0.0f : sum;  // not fmaxf, which drops a NaN
  }
}

// grad_a or grad_b null: not computed; they may be one buffer (grad_a written first).
__global__ void add_relu_backward_kernel(std::int64_t n, float* grad_a, bool assign_a,
                                         float* grad_b, bool assign_b, const float* grad_y,
                                         const float* y) {
  for (const std::int64_t i : grid_stride(n)) {
    const float g = y[i] > 0.0f ? grad_y[i] : 0.0f;
    if (grad_a != nullptr) grad_a[i] = assign_a ? g : grad_a[i] + g;
    if (grad_b != nullptr) grad_b[i] = assign_b ? g : grad_b[i] + g;
  }
}

float* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}

}  // namespace

void add_relu_forward(const Tensor& y, const Tensor& a, const Tensor& b, const Stream& stream) {
  launch_grid_stride(add_relu_forward_kernel, y.numel(), stream, y.data<float>(), a.data<float>(),
                     b.data<float>());
}

void add_relu_backward(const AddReluBackward& args, const Stream& stream) {
  launch_grid_stride(add_relu_backward_kernel, args.grad_y.numel(), stream,
                     data_or_null(args.grad_a), args.grad_a_write == GradWrite::Assign,
                     data_or_null(args.grad_b), args.grad_b_write == GradWrite::Assign,
                     args.grad_y.data<float>(), args.y.data<float>());
}

}  // namespace towerlab::cuda
