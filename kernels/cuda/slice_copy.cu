// CUDA slice copy (contract in kernels/slice_copy.h), float32, bfloat16 and float16:
// one grid-stride loop over the block's outer x run elements, consecutive threads on
// consecutive elements of a run, so that reads and writes are coalesced. Each
// element is written by one thread, once.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cuda/gpu_dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/slice_copy.h"
#include "kernels/move_element.h"

namespace towerlab::cuda {

namespace {

template <typename T>
__global__ void slice_copy_kernel(std::int64_t n, T* __restrict__ dst, const T* __restrict__ src,
                                  SliceCopyPlan plan, bool accumulate) {
  for (const std::int64_t e : grid_stride(n)) {
    const std::int64_t o = e / plan.run, j = e % plan.run;
    move_element(dst[o * plan.dst_pitch + plan.dst_offset + j],
                 src[o * plan.src_pitch + plan.src_offset + j], accumulate);
  }
}

}  // namespace

void slice_copy(const Tensor& dst, const Tensor& src, const SliceCopyPlan& plan, GradWrite write,
                const Stream& stream) {
  with_gpu_dtype("slice_copy", dst, [&]<typename T>() {
    launch_grid_stride(slice_copy_kernel<T>, plan.outer * plan.run, stream, dst.data<T>(),
                       src.data<T>(), plan, write == GradWrite::Accumulate);
  });
}

}  // namespace towerlab::cuda
