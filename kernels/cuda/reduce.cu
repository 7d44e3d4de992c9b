// CUDA reductions with CUB's DeviceReduce. The temporary storage CUB asks for
// comes from the device's caching allocator on the same stream, so a steady
// loop of reductions allocates nothing from the driver.
#include <cub/device/device_reduce.cuh>

#include "engine/allocator.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/sum_terms.cuh"

namespace towerlab::cuda {

namespace {

// Scales the single result (by 1/n for a mean) without a host round trip.
__global__ void scale_scalar_kernel(float* value, float scale) {
  *value *= scale;
}

struct Square {
  const float* x;
  __device__ float operator()(std::int64_t i) const { return x[i] * x[i]; }
};

struct NonFinite {
  const float* x;
  __device__ bool operator()(std::int64_t i) const { return !isfinite(x[i]); }
};

}  // namespace

void sum_squares(const Tensor& out, const Tensor& x, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  losses::sum_terms(out.data<float>(), x.numel(), Square{x.data<float>()}, 1.0f, stream);
}

std::int64_t first_nonfinite(const Tensor& x, const Stream& stream) {
  return first_index_where(x.numel(), NonFinite{x.data<float>()}, stream);
}

void sum(const Tensor& out, const Tensor& x, float scale, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  cudaStream_t s = native(stream);
  const float* in = x.data<float>();
  float* result = out.data<float>();
  if (x.numel() == 0) {
    TL_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(float), s));
    return;
  }
  Allocator& allocator = device_allocator(stream.device());
  std::size_t temp_bytes = 0;
  TL_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, temp_bytes, in, result, x.numel(), s));
  void* temp = allocator.allocate(temp_bytes, s);
  cudaError_t status = cub::DeviceReduce::Sum(temp, temp_bytes, in, result, x.numel(), s);
  allocator.deallocate(temp);  // stream-ordered: reused only by later work on s
  TL_CUDA_CHECK(status);
  if (scale != 1.0f) {
    scale_scalar_kernel<<<1, 1, 0, s>>>(result, scale);
    TL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace towerlab::cuda
