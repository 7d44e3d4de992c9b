// conv2d's implicit GEMM on tensor cores, for bfloat16 and float16 operands, and
// float32 ones rounded to TF32, with float32 sums (kernels/cuda/conv2d_tc.cu
// launches it for the three passes). It is the float32 kernels' GEMM
// (kernels/cuda/conv2d_implicit_gemm.cuh) with the inner product done by mma.sync
// (m16n8k16 for 16-bit values, m16n8k8 for TF32: kInput, as matmul_tc.cu's kernel)
// on fragments that ldmatrix reads from shared memory (kernels/cuda/tc_tile.cuh,
// shared with the tensor-core GEMM of matmul).
//
// The problem is one of kernels/cuda/conv2d_problems.cuh's (ForwardProblem,
// BackwardDataProblem, BackwardWeightProblem) over the operand type's Stored values
// (tc::TcValues: 16-bit bits, or float32): M, Ncols, Kred; Row row(m) and a(row, kk)
// gather A[m, kk]; Col col(n) and b(kk, col) gather B[kk, n]; out(m) and
// store(out, n, value, split) write the float32 result.
//
// Tiling. A block of WARPS_M x WARPS_N warps computes a BM x BN tile of the
// output, each warp FRAGS_M m16 x FRAGS_N n8 mma tiles, stepping through the
// reduction a line at a time (32 16-bit values or 16 float32: 64 bytes). Both
// operands lie k-major in shared memory (a line per row of A or column of B, 4
// swizzled 16-byte chunks), the layout whose ldmatrix gives the mma's row-major A
// and col-major B fragments directly, for either operand type (tc_tile.cuh).
//
// Gathers. The operands are gathered, not copied: each value of an im2col
// patch is at its own address (or is a zero of the padding, or of a stride's
// gap in the input gradient), so cp.async's 16-byte copies do not apply, and its
// 4-byte copies would move two 16-bit values of which one is wrong. Each thread
// owns whole chunks (8 or 4 consecutive kk of one line): it gathers their values
// into registers while the tensor cores multiply the previous step, then stores
// each chunk as one 16-byte word: a register-staged double buffer with one barrier
// per step, as implicit_gemm_kernel. The rows and columns a thread gathers are
// decoded once per block (decode_share). A float32 value is rounded to TF32 as it
// is gathered (to_tf32: cvt.rna, to nearest with ties away from zero, the rounding
// of matmul_tc.cu's TF32 path), so shared memory and the mma hold rounded values
// and nothing is rounded twice.
//
// Sums. Each block sums kk in ascending order, 16 (or 8) at a time by the mma
// (exact products added in float32), from its split's first kk to its last: values
// past Kred (or past the split) are zeros. The weight gradient's splits are added
// in split_weight_gemm's fixed tree (conv2d_problems.cuh). No atomics: the same
// bits every run.
#pragma once

#include <cstdint>

#include "kernels/cuda/conv2d_implicit_gemm.cuh"
#include "kernels/cuda/tc_tile.cuh"

namespace towerlab::cuda::conv2d_gemm {

template <int WARPS_M_, int WARPS_N_, int FRAGS_M_, int FRAGS_N_, int MIN_BLOCKS_ = 0>
struct TcTile {
  static constexpr int kWarpsM = WARPS_M_, kWarpsN = WARPS_N_;
  static constexpr int kFragsM = FRAGS_M_, kFragsN = FRAGS_N_;
  static constexpr int kWarpM = 16 * kFragsM, kWarpN = 8 * kFragsN;
  static constexpr int BM = kWarpsM * kWarpM, BN = kWarpsN * kWarpN;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMinBlocks = MIN_BLOCKS_;
};

// The values of one chunk, lowest kk first: 8 16-bit values, two a word, the lower
// kk in the low half; or 4 TF32 values, one a word. Aligned so that storing one is
// a single 16-byte store.
struct alignas(16) Chunk {
  std::uint32_t w[4];
};

// A[m, kk0 .. kk0 + kChunk - 1] (or B's column) through `gather`, which returns a
// Stored value; zero at and past k_end. A float32 is rounded to TF32 here.
template <TcInput kInput, class Gather>
__device__ __forceinline__ Chunk gather_chunk(bool valid, int kk0, int k_end, Gather gather) {
  using Values = tc::TcValues<kInput>;
  Chunk c{};
  if (!valid) return c;
#pragma unroll
  for (int j = 0; j < Values::kChunk; ++j) {
    const int kk = kk0 + j;
    if constexpr (Values::kTf32) {
      c.w[j] = kk < k_end ? to_tf32(gather(kk)) : 0u;
    } else {
      const std::uint32_t v = kk < k_end ? std::uint32_t{gather(kk)} : 0u;
      c.w[j / 2] |= v << (16 * (j % 2));
    }
  }
  return c;
}

// Block (x, y, z): rows [x BM, (x+1) BM), columns [y BN, (y+1) BN), the reduction's
// split z: kk in [z k_per_split, min(Kred, (z+1) k_per_split)).
template <class Problem, class T, TcInput kInput>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    tc_gemm_kernel(const Problem problem, int k_per_split) {
  using Values = tc::TcValues<kInput>;
  constexpr int BM = T::BM, BN = T::BN, kThreads = T::kThreads;
  constexpr int kStepK = Values::kStepK;  // kk per step: 32 16-bit values or 16 float32
  constexpr int kChunksPerLine = tc::kStepK / tc::kChunk;
  constexpr int kLinesApart = kThreads / kChunksPerLine;  // between a thread's lines
  constexpr int kAChunks = BM * kChunksPerLine / kThreads;
  constexpr int kBChunks = BN * kChunksPerLine / kThreads;
  static_assert(BM % kLinesApart == 0 && BN % kLinesApart == 0, "whole chunks per thread");

  __shared__ __align__(128) std::uint16_t tile_a[2][BM * tc::kStepK];
  __shared__ __align__(128) std::uint16_t tile_b[2][BN * tc::kStepK];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const int m0 = static_cast<int>(blockIdx.x) * BM, n0 = static_cast<int>(blockIdx.y) * BN;
  const int k_begin = static_cast<int>(blockIdx.z) * k_per_split;
  const int k_end = min(problem.Kred, k_begin + k_per_split);
  const int steps = max(0, k_end - k_begin + kStepK - 1) / kStepK;

  // This thread's chunks: chunk `part` of lines line0 + e * kLinesApart.
  const int part = tid % kChunksPerLine, line0 = tid / kChunksPerLine;
  typename Problem::Row a_rows[kAChunks];
  bool a_valid[kAChunks];
  decode_share(
      problem.M, [&](int e) { return m0 + line0 + e * kLinesApart; },
      [&](int m) { return problem.row(m); }, a_rows, a_valid);
  typename Problem::Col b_cols[kBChunks];
  bool b_valid[kBChunks];
  decode_share(
      problem.Ncols, [&](int e) { return n0 + line0 + e * kLinesApart; },
      [&](int n) { return problem.col(n); }, b_cols, b_valid);

  Chunk a_next[kAChunks], b_next[kBChunks];
  auto load_global = [&](int k0) {
    const int kk0 = k0 + part * Values::kChunk;
#pragma unroll
    for (int e = 0; e < kAChunks; ++e) {
      a_next[e] = gather_chunk<kInput>(a_valid[e], kk0, k_end,
                                       [&](int kk) { return problem.a(a_rows[e], kk); });
    }
#pragma unroll
    for (int e = 0; e < kBChunks; ++e) {
      b_next[e] = gather_chunk<kInput>(b_valid[e], kk0, k_end,
                                       [&](int kk) { return problem.b(kk, b_cols[e]); });
    }
  };
  auto store_shared = [&](int buffer) {
#pragma unroll
    for (int e = 0; e < kAChunks; ++e) {
      *reinterpret_cast<Chunk*>(tile_a[buffer] +
                                tc::swizzled<true, 0>(line0 + e * kLinesApart, part)) = a_next[e];
    }
#pragma unroll
    for (int e = 0; e < kBChunks; ++e) {
      *reinterpret_cast<Chunk*>(tile_b[buffer] +
                                tc::swizzled<true, 0>(line0 + e * kLinesApart, part)) = b_next[e];
    }
  };

  const int warp_row = (warp / T::kWarpsN) * T::kWarpM;
  const int warp_col = (warp % T::kWarpsN) * T::kWarpN;
  float acc[T::kFragsM][T::kFragsN][4] = {};
  if (steps > 0) {
    load_global(k_begin);
    store_shared(0);
    __syncthreads();
  }
  int buffer = 0;
  for (int step = 0; step < steps; ++step) {
    const bool has_next = step + 1 < steps;
    if (has_next) load_global(k_begin + (step + 1) * kStepK);
#pragma unroll
    for (int kk = 0; kk < kStepK / Values::kMmaK; ++kk) {
      std::uint32_t fa[T::kFragsM][4], fb[T::kFragsN][2];
      tc::load_a<true, 0>(fa, tile_a[buffer], warp_row, kk, lane);
      tc::load_b<true, 0>(fb, tile_b[buffer], warp_col, kk, lane);
      tc::mma_all<kInput>(acc, fa, fb);
    }
    if (has_next) {
      // The other buffer was last read in step - 1, before this step's barrier.
      store_shared(buffer ^ 1);
      __syncthreads();
      buffer ^= 1;
    }
  }

  // Accumulator e of mma tile (i, j): row 16 i + g + 8 (e / 2), column 8 j + 2 t + e % 2
  // of the warp's patch (g = lane / 4, t = lane % 4).
  const int g = lane / 4, t = lane % 4;
  const int split = static_cast<int>(blockIdx.z);
#pragma unroll
  for (int i = 0; i < T::kFragsM; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + warp_row + 16 * i + g + 8 * h;
      if (m >= problem.M) continue;
      const typename Problem::Out out = problem.out(m);
#pragma unroll
      for (int j = 0; j < T::kFragsN; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int n = n0 + warp_col + 8 * j + 2 * t + e;
          if (n < problem.Ncols) problem.store(out, n, acc[i][j][2 * h + e], split);
        }
      }
    }
  }
}

}  // namespace towerlab::cuda::conv2d_gemm
