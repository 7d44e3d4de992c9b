// CUDA peer_add (contract in kernels/peer_add.h): a grid-stride loop, float32. src
// may be a pointer into another GPU's memory; with peer access on, loads from it
// travel over the link (NVLink or PCIe), so the kernel reads src once and never
// writes it.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/peer_add.h"

namespace towerlab::cuda {

namespace {

// dst and src may be the same array (each thread reads element i before it writes
// it), so neither pointer is __restrict__.
__global__ void peer_add_kernel(float* dst, const float* src, std::int64_t n) {
  for (const std::int64_t i : grid_stride(n)) {
    dst[i] += src[i];
  }
}

}  // namespace

void peer_add(const Tensor& dst, const Tensor& src, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  peer_add_kernel<<<grid_for(dst.numel(), stream), kBlockSize, 0, native(stream)>>>(
      dst.data<float>(), src.data<float>(), dst.numel());
  TL_CUDA_CHECK_LAUNCH();
}

}  // namespace towerlab::cuda
