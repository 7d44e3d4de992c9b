// CUDA cast (contracts in kernels/cast.h): one grid-stride kernel per pair of
// float32, bfloat16 and float16. Each value goes through float32, which holds
// every value of the three exactly, and is rounded once by engine/half.h's
// conversions, the functions the CPU reference uses.
#include "engine/half.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/gpu_dtype.cuh"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

template <typename D, typename S>
__global__ void cast_kernel(std::int64_t n, D* __restrict__ dst, const S* __restrict__ src) {
  for (const std::int64_t i : grid_stride(n)) {
    dst[i] = static_cast<D>(static_cast<float>(src[i]));
  }
}

}  // namespace

void cast(const Tensor& dst, const Tensor& src, const Stream& stream) {
  with_gpu_dtype("cast", dst, [&]<typename D>() {
    with_gpu_dtype("cast", src, [&]<typename S>() {
      launch_grid_stride(cast_kernel<D, S>, dst.numel(), stream, dst.data<D>(), src.data<S>());
    });
  });
}

}  // namespace towerlab::cuda
