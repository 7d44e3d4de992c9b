// CUDA dropout (contract in kernels/dropout.h), float32: one grid-stride kernel per
// direction, each element's mask from kernels/dropout_unit.h, the function the CPU
// reference calls, and the kept scale rounded once on the host, so the results are
// the CPU's bit for bit. Nothing is stored between the passes: the backward draws
// the mask again (ten Philox rounds per element are cheap beside the memory traffic).
#include <cstdint>

#include "kernels/cuda/dropout.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/dropout_unit.h"
#include "kernels/reference/dropout.h"

namespace towerlab::cuda {

namespace {

// m(e): `scale` where element e is kept, 0 where it is dropped.
__device__ __forceinline__ float multiplier(double p, float scale, std::uint64_t seed,
                                            std::uint64_t subsequence, std::uint64_t e) {
  return static_cast<double>(dropout_unit(seed, subsequence, e)) >= p ? scale : 0.0f;
}

__global__ void dropout_forward_kernel(std::int64_t n, float* y, const float* x, double p,
                                       float scale, std::uint64_t seed, std::uint64_t subsequence,
                                       std::uint64_t first_element) {
  for (const std::int64_t i : grid_stride(n)) {
    y[i] = x[i] *
           multiplier(p, scale, seed, subsequence, first_element + static_cast<std::uint64_t>(i));
  }
}

__global__ void dropout_backward_kernel(std::int64_t n, float* grad_x, const float* grad_y,
                                        double p, float scale, std::uint64_t seed,
                                        std::uint64_t subsequence, std::uint64_t first_element,
                                        bool assign) {
  for (const std::int64_t i : grid_stride(n)) {
    const float g = grad_y[i] * multiplier(p, scale, seed, subsequence,
                                           first_element + static_cast<std::uint64_t>(i));
    grad_x[i] = assign ? g : grad_x[i] + g;
  }
}

}  // namespace

void dropout_forward(const Tensor& y, const Tensor& x, double p, std::uint64_t seed,
                     std::uint64_t subsequence, std::uint64_t first_element, const Stream& stream) {
  launch_grid_stride(dropout_forward_kernel, x.numel(), stream, y.data<float>(), x.data<float>(), p,
                     reference::dropout_scale<float>(p), seed, subsequence, first_element);
}

void dropout_backward(const Tensor& grad_x, const Tensor& grad_y, double p, std::uint64_t seed,
                      std::uint64_t subsequence, std::uint64_t first_element, const Stream& stream,
                      GradWrite write) {
  launch_grid_stride(dropout_backward_kernel, grad_y.numel(), stream, grad_x.data<float>(),
                     grad_y.data<float>(), p, reference::dropout_scale<float>(p), seed, subsequence,
                     first_element, write == GradWrite::Assign);
}

}  // namespace towerlab::cuda
