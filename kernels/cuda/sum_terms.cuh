// The losses' sum on the device: loss[0] = scale * sum_i term(i), in two fixed
// stages. A grid of at most kMaxPartials blocks writes one partial sum per block
// into scratch memory (each thread a grid-stride share, then the block's tree of
// launch.cuh), then one block adds the partials in a fixed order, scales them and
// writes loss[0]. The grid depends only on n, so the same inputs give the same bits
// every run (no atomics), and nothing goes back to the host.
//
// kernels/cuda/loss.cu and kernels/cuda/pointwise_loss.cu include it; a `Term` is a
// small struct of pointers whose `__device__ float operator()(std::int64_t i)` is
// term i.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "engine/allocator.h"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda::losses {

// Internal linkage: each .cu that includes this gets its own kernels.
namespace {

constexpr unsigned kMaxPartials = 1024;  // the finishing block has one thread per partial

// partials[block] = sum of term(i) over the block's share of [0, n); kBlockSize threads.
template <typename Term>
__global__ void partial_sums_kernel(float* partials, std::int64_t n, Term term) {
  float sum = 0.0f;
  for (const std::int64_t i : grid_stride(n)) {
    sum += term(i);
  }
  sum = block_sum<kBlockSize>(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// loss[0] = scale * sum(partials[0..count)); one block of kMaxPartials threads.
__global__ void finish_sum_kernel(float* loss, const float* partials, unsigned count, float scale) {
  float sum = threadIdx.x < count ? partials[threadIdx.x] : 0.0f;
  sum = block_sum<kMaxPartials>(sum);
  if (threadIdx.x == 0) *loss = sum * scale;
}

// loss[0] = scale * sum over i < n of term(i), in the two stages above (0 for n == 0).
template <typename Term>
void sum_terms(float* loss, std::int64_t n, Term term, float scale, const Stream& stream) {
  cudaStream_t s = native(stream);
  if (n == 0) {
    TL_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(float), s));
    return;
  }
  const unsigned blocks = std::min(grid_for(n, stream), kMaxPartials);
  Scratch partials(stream, blocks * sizeof(float));
  partial_sums_kernel<<<blocks, kBlockSize, 0, s>>>(partials.as<float>(), n, term);
  TL_CUDA_CHECK_LAUNCH();
  finish_sum_kernel<<<1, kMaxPartials, 0, s>>>(loss, partials.as<float>(), blocks, scale);
  TL_CUDA_CHECK_LAUNCH();
}

}  // namespace

}  // namespace towerlab::cuda::losses
