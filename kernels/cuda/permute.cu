// CUDA permute (contract in kernels/permute.h) on the merged layout
// (kernels/permute_plan.h), float32, bfloat16 and float16, two kernels:
//   - a batch of 2-D transposes (the last two dimensions swapped, the case
//     attention's K^T and head splits reach): transpose_tiles_kernel moves 32 x 32
//     tiles through shared memory, reading rows of x and writing rows of y, both
//     coalesced; the tile's odd pitch (33) keeps the transposed reads off one bank;
//   - any other permutation: permute_gather_kernel, a grid-stride loop over y that
//     finds each element's source from its index (writes coalesced, reads strided;
//     a permutation that keeps the last dimension reads rows, coalesced too).
// Each element is written by one thread, once: no ordering between threads, the
// same bits every run.
// The files an op takes, in order: the top of kernels/relu.h.
#include <algorithm>

#include "kernels/cuda/gpu_dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/permute.h"
#include "kernels/move_element.h"

namespace towerlab::cuda {

namespace {

constexpr int kTile = 32, kTileRows = 8;  // a tile, and the threads' rows: 32 x 8 threads

// y [batch, cols, rows] = (or +=) x [batch, rows, cols] transposed. blockIdx.x runs
// over x's column tiles, blockIdx.y over its row tiles, blockIdx.z over the batch
// (a grid-stride loop past 65535 entries).
template <typename T>
__global__ void transpose_tiles_kernel(T* __restrict__ y, const T* __restrict__ x,
                                       std::int64_t batch, std::int64_t rows, std::int64_t cols,
                                       bool accumulate) {
  __shared__ T tile[kTile][kTile + 1];
  const std::int64_t r0 = std::int64_t{blockIdx.y} * kTile, c0 = std::int64_t{blockIdx.x} * kTile;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (std::int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const T* in = x + b * rows * cols;  // [rows, cols]
    T* out = y + b * rows * cols;       // [cols, rows]
    for (int j = ty; j < kTile; j += kTileRows) {
      const std::int64_t r = r0 + j, c = c0 + tx;
      if (r < rows && c < cols) tile[j][tx] = in[r * cols + c];
    }
    __syncthreads();
    for (int j = ty; j < kTile; j += kTileRows) {
      const std::int64_t c = c0 + j, r = r0 + tx;
      if (r < rows && c < cols) move_element(out[c * rows + r], tile[tx][j], accumulate);
    }
    __syncthreads();  // the tile is refilled for the next batch entry
  }
}

// y[e] = (or +=) x[the element y's index e maps to], for each of y's n elements.
template <typename T>
__global__ void permute_gather_kernel(std::int64_t n, T* __restrict__ y, const T* __restrict__ x,
                                      PermutePlan plan, bool accumulate) {
  for (const std::int64_t e : grid_stride(n)) {
    std::int64_t rest = e, at = 0;
    for (int k = plan.rank - 1; k >= 0; --k) {
      at += rest % plan.shape[k] * plan.x_stride[k];
      rest /= plan.shape[k];
    }
    move_element(y[e], x[at], accumulate);
  }
}

}  // namespace

void permute(const Tensor& y, const Tensor& x, const PermutePlan& plan, GradWrite write,
             const Stream& stream) {
  const bool accumulate = write == GradWrite::Accumulate;
  with_gpu_dtype("permute", y, [&]<typename T>() {
    if (plan.is_batched_transpose()) {
      const int last = plan.rank - 1;
      const std::int64_t batch = plan.rank == 3 ? plan.shape[0] : 1;
      const std::int64_t cols = plan.shape[last - 1], rows = plan.shape[last];  // of x
      const std::int64_t row_tiles = (rows + kTile - 1) / kTile;
      if (row_tiles <= 65535) {
        const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                        static_cast<unsigned>(row_tiles),
                        static_cast<unsigned>(std::min<std::int64_t>(batch, 65535)));
        CudaDeviceGuard guard(stream.device().index);
        transpose_tiles_kernel<T><<<grid, dim3(kTile, kTileRows), 0, native(stream)>>>(
            y.data<T>(), x.data<T>(), batch, rows, cols, accumulate);
        TL_CUDA_CHECK_LAUNCH();
        return;
      }
    }
    launch_grid_stride(permute_gather_kernel<T>, plan.numel, stream, y.data<T>(), x.data<T>(), plan,
                       accumulate);
  });
}

}  // namespace towerlab::cuda
