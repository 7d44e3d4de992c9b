// CUDA elementwise kernels (contracts in kernels/elementwise.h). Memory-bound:
// one grid-stride loop per op, float32 only, each element read and written once.
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

__global__ void fill_kernel(std::int64_t n, float* x, float value) {
  for (const std::int64_t i : grid_stride(n)) {
    x[i] = value;
  }
}

__global__ void copy_kernel(std::int64_t n, float* __restrict__ dst,
                            const float* __restrict__ src) {
  for (const std::int64_t i : grid_stride(n)) {
    dst[i] = src[i];
  }
}

// No __restrict__: out may alias a or b, and each element is read before it is written.
template <BinaryOp Op>
__global__ void binary_kernel(std::int64_t n, float* out, const float* a, const float* b) {
  for (const std::int64_t i : grid_stride(n)) {
    if constexpr (Op == BinaryOp::Add) {
      out[i] = a[i] + b[i];
    } else if constexpr (Op == BinaryOp::Sub) {
      out[i] = a[i] - b[i];
    } else {
      out[i] = a[i] * b[i];
    }
  }
}

__global__ void scale_kernel(std::int64_t n, float* out, const float* x, float alpha) {
  for (const std::int64_t i : grid_stride(n)) {
    out[i] = alpha * x[i];
  }
}

__global__ void axpy_kernel(std::int64_t n, float* y, float alpha, const float* x) {
  for (const std::int64_t i : grid_stride(n)) {
    y[i] += alpha * x[i];
  }
}

// s is read by every thread (one cached load), never copied to the host.
__global__ void axpy_scalar_kernel(std::int64_t n, float* y, float alpha, const float* s) {
  const float v = alpha * *s;
  for (const std::int64_t i : grid_stride(n)) {
    y[i] += v;
  }
}

}  // namespace

void fill(const Tensor& x, float value, const Stream& stream) {
  launch_grid_stride(fill_kernel, x.numel(), stream, x.data<float>(), value);
}

void copy(const Tensor& dst, const Tensor& src, const Stream& stream) {
  TL_CHECK(dst.dtype() == DType::Float32 && src.dtype() == DType::Float32, NotSupported,
           "copy: CUDA tensors are float32");
  launch_grid_stride(copy_kernel, dst.numel(), stream, dst.data<float>(), src.data<float>());
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
            const Stream& stream) {
  const auto kernel = op == BinaryOp::Add   ? binary_kernel<BinaryOp::Add>
                      : op == BinaryOp::Sub ? binary_kernel<BinaryOp::Sub>
                                            : binary_kernel<BinaryOp::Mul>;
  launch_grid_stride(kernel, out.numel(), stream, out.data<float>(), a.data<float>(),
                     b.data<float>());
}

void scale(const Tensor& out, const Tensor& x, float alpha, const Stream& stream) {
  launch_grid_stride(scale_kernel, out.numel(), stream, out.data<float>(), x.data<float>(), alpha);
}

void axpy(const Tensor& y, float alpha, const Tensor& x, const Stream& stream) {
  launch_grid_stride(axpy_kernel, y.numel(), stream, y.data<float>(), alpha, x.data<float>());
}

void axpy_scalar(const Tensor& y, float alpha, const Tensor& s, const Stream& stream) {
  launch_grid_stride(axpy_scalar_kernel, y.numel(), stream, y.data<float>(), alpha,
                     s.data<float>());
}

}  // namespace towerlab::cuda
