// CUDA elementwise kernels (contracts in kernels/elementwise.h). Memory-bound:
// one grid-stride loop per op, float32 only, each element read and written once.
#include "kernels/cuda/launch.cuh"
#include "kernels/elementwise.h"

namespace towerlab::cuda {

namespace {

__global__ void fill_kernel(float* x, float value, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    x[i] = value;
  }
}

__global__ void copy_kernel(float* __restrict__ dst, const float* __restrict__ src,
                            std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    dst[i] = src[i];
  }
}

// No __restrict__: out may alias a or b, and each element is read before it is written.
template <BinaryOp Op>
__global__ void binary_kernel(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    if constexpr (Op == BinaryOp::Add) {
      out[i] = a[i] + b[i];
    } else if constexpr (Op == BinaryOp::Sub) {
      out[i] = a[i] - b[i];
    } else {
      out[i] = a[i] * b[i];
    }
  }
}

__global__ void scale_kernel(float* out, const float* x, float alpha, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    out[i] = alpha * x[i];
  }
}

__global__ void axpy_kernel(float* y, float alpha, const float* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    y[i] += alpha * x[i];
  }
}

// s is read by every thread (one cached load), never copied to the host.
__global__ void axpy_scalar_kernel(float* y, float alpha, const float* s, std::int64_t n) {
  const float v = alpha * *s;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    y[i] += v;
  }
}

}  // namespace

void fill(const Tensor& x, float value, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  fill_kernel<<<grid_for(x.numel()), kBlockSize, 0, native(stream)>>>(x.data<float>(), value,
                                                                      x.numel());
  TL_CUDA_CHECK_LAUNCH();
}

void copy(const Tensor& dst, const Tensor& src, const Stream& stream) {
  TL_CHECK(dst.dtype() == DType::Float32 && src.dtype() == DType::Float32, NotSupported,
           "copy: CUDA tensors are float32");
  CudaDeviceGuard guard(stream.device().index);
  copy_kernel<<<grid_for(dst.numel()), kBlockSize, 0, native(stream)>>>(
      dst.data<float>(), src.data<float>(), dst.numel());
  TL_CUDA_CHECK_LAUNCH();
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
            const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const unsigned grid = grid_for(out.numel());
  auto* o = out.data<float>();
  const auto* x = a.data<float>();
  const auto* y = b.data<float>();
  switch (op) {
    case BinaryOp::Add:
      binary_kernel<BinaryOp::Add><<<grid, kBlockSize, 0, native(stream)>>>(o, x, y, out.numel());
      break;
    case BinaryOp::Sub:
      binary_kernel<BinaryOp::Sub><<<grid, kBlockSize, 0, native(stream)>>>(o, x, y, out.numel());
      break;
    case BinaryOp::Mul:
      binary_kernel<BinaryOp::Mul><<<grid, kBlockSize, 0, native(stream)>>>(o, x, y, out.numel());
      break;
  }
  TL_CUDA_CHECK_LAUNCH();
}

void scale(const Tensor& out, const Tensor& x, float alpha, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  scale_kernel<<<grid_for(out.numel()), kBlockSize, 0, native(stream)>>>(
      out.data<float>(), x.data<float>(), alpha, out.numel());
  TL_CUDA_CHECK_LAUNCH();
}

void axpy(const Tensor& y, float alpha, const Tensor& x, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  axpy_kernel<<<grid_for(y.numel()), kBlockSize, 0, native(stream)>>>(y.data<float>(), alpha,
                                                                      x.data<float>(), y.numel());
  TL_CUDA_CHECK_LAUNCH();
}

void axpy_scalar(const Tensor& y, float alpha, const Tensor& s, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  axpy_scalar_kernel<<<grid_for(y.numel()), kBlockSize, 0, native(stream)>>>(
      y.data<float>(), alpha, s.data<float>(), y.numel());
  TL_CUDA_CHECK_LAUNCH();
}

}  // namespace towerlab::cuda
