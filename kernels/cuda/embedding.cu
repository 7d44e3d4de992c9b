// CUDA embedding (contracts in kernels/embedding.h), float32.
//
// Forward: a grid-stride loop over y's M*D values, each a copy of its id's table
// value (NaN for a bad id, which is never used as an index).
//
// Backward, deterministic without atomics: block b owns the table rows
// [b*R, (b+1)*R) and thread t of it the columns t, t + kBlockSize, ... of those
// rows. The block walks every id in index order, kBlockSize at a time through
// shared memory, and for each id in its range each thread adds that grad_y row's
// values at its columns into the table row. So every value of grad_table is
// written by one thread, in the order m = 0, 1, ...: the reference's additions in
// its order, bit for bit, whatever the grid. The cost is each block's walk over
// all M ids (a shared-memory read and a compare per id per thread), on top of
// the M*D additions; R is chosen so that the grid fills the device about twice.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

// Whether `id` names a row of a table of `rows` rows (reference::is_row_id).
__device__ __forceinline__ bool is_row_id(float id, std::int64_t rows) {
  return id >= 0.0f && id < static_cast<float>(rows) && floorf(id) == id;
}

__global__ void embedding_forward_kernel(std::int64_t n, float* __restrict__ y,
                                         const float* __restrict__ ids,
                                         const float* __restrict__ table, std::int64_t rows,
                                         std::int64_t cols) {
  for (const std::int64_t i : grid_stride(n)) {
    const float id = ids[i / cols];
    y[i] = is_row_id(id, rows) ? table[static_cast<std::int64_t>(id) * cols + i % cols] : NAN;
  }
}

// Block b: table rows [b * rows_per_block, (b + 1) * rows_per_block) (see the top).
__global__ void embedding_backward_kernel(float* __restrict__ grad_table,
                                          const float* __restrict__ grad_y,
                                          const float* __restrict__ ids, std::int64_t count,
                                          std::int64_t rows, std::int64_t cols,
                                          std::int64_t rows_per_block, bool assign) {
  __shared__ float chunk[kBlockSize];
  const std::int64_t first_row = std::int64_t{blockIdx.x} * rows_per_block;
  const std::int64_t last_row = min(rows, first_row + rows_per_block);
  if (assign) {
    for (std::int64_t v = first_row; v < last_row; ++v) {
      for (std::int64_t j = threadIdx.x; j < cols; j += kBlockSize) grad_table[v * cols + j] = 0.0f;
    }
  }
  for (std::int64_t base = 0; base < count; base += kBlockSize) {
    const std::int64_t mine = base + threadIdx.x;
    chunk[threadIdx.x] = mine < count ? ids[mine] : -1.0f;
    __syncthreads();
    const std::int64_t in_chunk = min(std::int64_t{kBlockSize}, count - base);
    for (std::int64_t k = 0; k < in_chunk; ++k) {
      const float id = chunk[k];
      if (!is_row_id(id, rows)) continue;  // poisoned in the forward; added nowhere
      const auto v = static_cast<std::int64_t>(id);
      if (v < first_row || v >= last_row) continue;
      float* row = grad_table + v * cols;            // [D]
      const float* gy = grad_y + (base + k) * cols;  // [D]
      for (std::int64_t j = threadIdx.x; j < cols; j += kBlockSize) row[j] += gy[j];
    }
    __syncthreads();  // the chunk is read whole before the next one is loaded
  }
}

struct InvalidId {
  const float* ids;
  std::int64_t rows;
  __device__ bool operator()(std::int64_t i) const { return !is_row_id(ids[i], rows); }
};

}  // namespace

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& table,
                       const Stream& stream) {
  launch_grid_stride(embedding_forward_kernel, y.numel(), stream, y.data<float>(),
                     ids.data<float>(), table.data<float>(), table.size(0), table.size(1));
}

void embedding_backward(const Tensor& grad_table, const Tensor& grad_y, const Tensor& ids,
                        const Stream& stream, GradWrite write) {
  const std::int64_t rows = grad_table.size(0);
  const std::int64_t cols = grad_table.size(1);
  // About two blocks per SM, each owning a contiguous range of rows.
  const std::int64_t wanted = 2 * std::int64_t{sm_count(stream.device().index)};
  const std::int64_t rows_per_block = (rows + wanted - 1) / wanted;
  const auto blocks = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  CudaDeviceGuard guard(stream.device().index);
  embedding_backward_kernel<<<blocks, kBlockSize, 0, native(stream)>>>(
      grad_table.data<float>(), grad_y.data<float>(), ids.data<float>(), ids.numel(), rows, cols,
      rows_per_block, write == GradWrite::Assign);
  TL_CUDA_CHECK_LAUNCH();
}

std::int64_t first_invalid_id(const Tensor& ids, std::int64_t rows, const Stream& stream) {
  return first_index_where(ids.numel(), InvalidId{ids.data<float>(), rows}, stream);
}

}  // namespace towerlab::cuda
