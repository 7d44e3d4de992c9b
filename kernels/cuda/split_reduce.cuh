// The split reduction shared by the GEMM (split-K) and conv2d's backward-weight
// (split over images): when a product has too few output tiles to give every SM
// work, its reduction is cut into `splits` contiguous ranges, each block writes
// its range's sum of products into a partial buffer
//   partial: [splits, count]   (count = elements of the output)
// and a second kernel reduces the partials of each element and applies the
// caller's epilogue once (alpha/beta for the GEMM, += for a gradient).
//
// Determinism: no atomics. The partials of one element are added in a fixed
// pairwise tree that depends only on `splits`, so a given split plan gives the
// same bits every run. The plan itself depends on the SM count (split_count), so
// two GPU models may round differently.
//
// The tree: the partials are padded with zeros to the next power of two of
// slots (x + 0 is exact) and halved in place, slot s taking slot s + half, until
// one remains. Pairwise summation keeps the rounding error growing with
// log2(splits) rather than splits; at 2 splits it is the one serial addition.
// The slots live in registers (every index is a compile-time constant after
// unrolling), which caps the split count at kMaxSplits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

constexpr int kMaxSplits = 64;

// Splits of a reduction of `length` so that tiles x splits reaches about
// `wanted_blocks`: 1 when the tiles alone reach it, never more than kMaxSplits,
// and never so many that a split gets less than `min_length`. The caller rounds
// the per-split length to its unit (K-tiles, images) and recounts the splits.
inline int split_count(std::int64_t tiles, std::int64_t wanted_blocks, std::int64_t length,
                       std::int64_t min_length) {
  if (tiles >= wanted_blocks) return 1;
  const std::int64_t by_blocks = (wanted_blocks + tiles - 1) / tiles;
  const std::int64_t by_length = std::max<std::int64_t>(1, length / min_length);
  return static_cast<int>(std::min<std::int64_t>({by_blocks, by_length, kMaxSplits}));
}

// slot[0] = the tree's sum of slot[0 .. 2*kHalf): each level adds the upper half
// onto the lower. Recursion on the template keeps every index a constant, so
// the slots stay in registers.
template <int kHalf>
__device__ __forceinline__ void fold_slots(float* slot) {
#pragma unroll
  for (int s = 0; s < kHalf; ++s) slot[s] += slot[s + kHalf];
  if constexpr (kHalf > 1) fold_slots<kHalf / 2>(slot);
}

// epilogue(i, sum of partial[s, i] over s), for every i < count.
template <int kSlots, class Epilogue>
__global__ void split_reduce_kernel(const float* __restrict__ partial, std::int64_t count,
                                    int splits, Epilogue epilogue) {
  for (const std::int64_t i : grid_stride(count)) {
    float slot[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) slot[s] = s < splits ? partial[s * count + i] : 0.0f;
    fold_slots<kSlots / 2>(slot);
    epilogue(i, slot[0]);
  }
}

// Two epilogues: out[i] += sum (a gradient accumulates), out[i] = sum (a sum that a
// later kernel reads, e.g. the first stage of a two-stage reduction). `out` must not
// be the partials themselves.
struct AccumulateInto {
  float* out;
  __device__ void operator()(std::int64_t i, float sum) const { out[i] += sum; }
};
struct StoreInto {
  float* out;
  __device__ void operator()(std::int64_t i, float sum) const { out[i] = sum; }
};

// Reduces partial [splits, count] with the tree above and hands each element's
// sum to epilogue(i, sum) on the device, in one launch on `stream`.
template <class Epilogue>
void split_reduce(const float* partial, std::int64_t count, int splits, Epilogue epilogue,
                  const Stream& stream) {
  TL_CHECK(splits >= 1 && splits <= kMaxSplits, InvalidArgument,
           "split_reduce: " << splits << " splits; the tree holds 1 to " << kMaxSplits);
  if (count == 0) return;
  const unsigned grid = grid_for(count, stream);
  cudaStream_t s = native(stream);
  if (splits <= 2) {
    split_reduce_kernel<2, Epilogue><<<grid, kBlockSize, 0, s>>>(partial, count, splits, epilogue);
  } else if (splits <= 4) {
    split_reduce_kernel<4, Epilogue><<<grid, kBlockSize, 0, s>>>(partial, count, splits, epilogue);
  } else if (splits <= 8) {
    split_reduce_kernel<8, Epilogue><<<grid, kBlockSize, 0, s>>>(partial, count, splits, epilogue);
  } else if (splits <= 16) {
    split_reduce_kernel<16, Epilogue><<<grid, kBlockSize, 0, s>>>(partial, count, splits, epilogue);
  } else if (splits <= 32) {
    split_reduce_kernel<32, Epilogue><<<grid, kBlockSize, 0, s>>>(partial, count, splits, epilogue);
  } else {
    split_reduce_kernel<64, Epilogue><<<grid, kBlockSize, 0, s>>>(partial, count, splits, epilogue);
  }
  TL_CUDA_CHECK_LAUNCH();
}

}  // namespace towerlab::cuda
