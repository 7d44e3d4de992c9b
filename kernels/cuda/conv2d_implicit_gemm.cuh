// The implicit-GEMM kernels of conv2d (kernels/cuda/conv2d.cu): templates over a
// "problem" (how one pass of the convolution gathers its GEMM operands and stores
// its result; the problems are in conv2d_problems.cuh, their launch plans in
// conv2d.cu) and a Tile.
//
// implicit_gemm_kernel: the natural reduction order, a register-staged double
// buffer (forward and backward-data when their channels are not a multiple of
// the step). pipelined_gemm_kernel: the channel-inner order of forward and
// backward-data; pipelined_pixel_kernel: backward-weight; both copy global ->
// shared by cp.async into a ring of stages.
//
// Each layer's speed on a GPU beside cuDNN: bench/results/gpu_h100.md.
#pragma once

#include <cuda_pipeline.h>

#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda::conv2d_gemm {

// Block tile BM x BN, reduction step BK, TM x TN outputs per thread (multiples of
// 4, read from shared memory as float4). MIN_BLOCKS: the blocks per SM that
// __launch_bounds__ asks registers for (the 8x8 tiles would otherwise take ~150
// to 190 registers, one block of 8 warps per SM, too few to hide the latency of
// the gathers and of the barrier; capped at 128 they fit two).
template <int BM_, int BN_, int BK_, int TM_, int TN_, int MIN_BLOCKS_ = 0>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_;
  static constexpr int kThreads = (BM / TM) * (BN / TN);
  static constexpr int kMinBlocks = MIN_BLOCKS_;
};

// acc += the outer products of one stage's BK columns of A ([BK][A_PITCH], A_PITCH
// >= BM) and rows of B ([BK][B_PITCH]). This thread's outputs: rows tm*4 + {0..3}
// in each of TM/4 groups spaced BM/(TM/4) apart (likewise columns), so that
// neighbouring threads store neighbouring m and a warp's float4 reads are
// conflict-free.
template <class T, int A_PITCH, int B_PITCH>
__device__ __forceinline__ void multiply_stage(float (&acc)[T::TM][T::TN],
                                               const float (*As)[A_PITCH],
                                               const float (*Bs)[B_PITCH], int tm, int tn) {
  static_assert(A_PITCH >= T::BM && B_PITCH >= T::BN && A_PITCH % 4 == 0 && B_PITCH % 4 == 0);
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, TM = T::TM, TN = T::TN;
#pragma unroll
  for (int kk = 0; kk < BK; ++kk) {
    float a_frag[TM], b_frag[TN];
#pragma unroll
    for (int g = 0; g < TM / 4; ++g) {
      const float4 v = *reinterpret_cast<const float4*>(&As[kk][g * (BM / (TM / 4)) + tm * 4]);
      a_frag[g * 4 + 0] = v.x, a_frag[g * 4 + 1] = v.y, a_frag[g * 4 + 2] = v.z,
                     a_frag[g * 4 + 3] = v.w;
    }
#pragma unroll
    for (int g = 0; g < TN / 4; ++g) {
      const float4 v = *reinterpret_cast<const float4*>(&Bs[kk][g * (BN / (TN / 4)) + tn * 4]);
      b_frag[g * 4 + 0] = v.x, b_frag[g * 4 + 1] = v.y, b_frag[g * 4 + 2] = v.z,
                     b_frag[g * 4 + 3] = v.w;
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a_frag[i], b_frag[j], acc[i][j]);
    }
  }
}

// Stores this thread's TM x TN outputs through the problem: rows four at a time
// with store4 where the problem's rows allow it, else one by one.
template <class T, class Problem>
__device__ __forceinline__ void store_tile(const Problem& problem, const float (&acc)[T::TM][T::TN],
                                           int m0, int n0, int tm, int tn, int split) {
  constexpr int BM = T::BM, BN = T::BN, TM = T::TM, TN = T::TN;
#pragma unroll
  for (int g = 0; g < TM / 4; ++g) {
    const int m4 = m0 + g * (BM / (TM / 4)) + tm * 4;  // rows m4..m4+3: acc[g*4 .. g*4+3]
    if (problem.vector_rows && m4 + 3 < problem.M) {
      const typename Problem::Out out = problem.out(m4);
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int n = n0 + (j / 4) * (BN / (TN / 4)) + tn * 4 + j % 4;
        const float4 v =
            make_float4(acc[g * 4][j], acc[g * 4 + 1][j], acc[g * 4 + 2][j], acc[g * 4 + 3][j]);
        if (n < problem.Ncols) problem.store4(out, n, v, split);
      }
      continue;
    }
#pragma unroll
    for (int i = g * 4; i < g * 4 + 4; ++i) {
      const int m = m4 + i % 4;
      if (m >= problem.M) continue;
      const typename Problem::Out out = problem.out(m);
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int n = n0 + (j / 4) * (BN / (TN / 4)) + tn * 4 + j % 4;
        if (n < problem.Ncols) problem.store(out, n, acc[i][j], split);
      }
    }
  }
}

// Element e of a thread's share of a step's tiles, in the two kernels that load
// them in flat order: flat index tid + e*threads, A laid out m-fastest
// (consecutive threads read consecutive pixels), B kk-fastest.
template <class T>
struct FlatShare {
  int tid;
  __device__ __forceinline__ int a_m(int e) const { return (tid + e * T::kThreads) % T::BM; }
  __device__ __forceinline__ int a_k(int e) const { return (tid + e * T::kThreads) / T::BM; }
  __device__ __forceinline__ int b_n(int e) const { return (tid + e * T::kThreads) / T::BK; }
  __device__ __forceinline__ int b_k(int e) const { return (tid + e * T::kThreads) % T::BK; }
};

// Decodes, once per block, the rows of A (or columns of B) a thread's elements
// read: index(e) for each, valid where it is below `extent`, decoded as index 0
// (a harmless address, never read as data) where it is not.
template <int N, class Index, class Decode, class Decoded>
__device__ __forceinline__ void decode_share(int extent, Index index, Decode decode,
                                             Decoded (&decoded)[N], bool (&valid)[N]) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int i = index(e);
    valid[e] = i < extent;
    decoded[e] = decode(valid[e] ? i : 0);
  }
}

// C[m,n] = sum over kk of A[m,kk] * B[kk,n] in the natural order kk = (channel,
// r, s), stored through the problem: forward and backward-data when their
// reduced channels are not a multiple of BK (RGB input layers). Every element
// is gathered on its own (the problem's a and b: two or four divisions and the
// bounds). Consecutive threads load consecutive m (A is contiguous along m: x
// and grad_y patches along q), B kk-fastest.
//
// Shared memory holds A as [BK][BM] and B as [BK][BN] so that each step of the
// reduction is an outer product of a column of A and a row of B; rows are padded
// by 4 floats so that kk-fastest stores do not all hit one bank and float4 reads
// stay aligned. Two buffers: the next tile's global loads are issued into
// registers before the current tile is multiplied, hiding their latency, with
// one barrier per step.
template <class Problem, class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    implicit_gemm_kernel(const Problem problem) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, TM = T::TM, TN = T::TN;
  constexpr int kThreads = T::kThreads;
  constexpr int kALoads = BM * BK / kThreads, kBLoads = BN * BK / kThreads;
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BM % TM == 0 && BN % TN == 0);
  static_assert(BM * BK % kThreads == 0 && BN * BK % kThreads == 0);
  static_assert(kThreads % BM == 0 || BM % kThreads == 0);
  constexpr int kARows = BM > kThreads ? BM / kThreads : 1;  // m fastest: rows repeat

  __shared__ __align__(16) float As[2][BK][BM + 4];
  __shared__ __align__(16) float Bs[2][BK][BN + 4];

  const int tid = static_cast<int>(threadIdx.x);
  const int m0 = static_cast<int>(blockIdx.x) * BM, n0 = static_cast<int>(blockIdx.y) * BN;
  const int k_end = problem.Kred;

  const FlatShare<T> share{tid};
  typename Problem::Row a_rows[kARows];
  bool a_valid[kARows];
  decode_share(
      problem.M, [&](int j) { return m0 + share.a_m(j); }, [&](int m) { return problem.row(m); },
      a_rows, a_valid);
  typename Problem::Col b_cols[kBLoads];
  bool b_valid[kBLoads];
  decode_share(
      problem.Ncols, [&](int e) { return n0 + share.b_n(e); },
      [&](int n) { return problem.col(n); }, b_cols, b_valid);

  float a_next[kALoads], b_next[kBLoads];
  auto load_global = [&](int k0) {
#pragma unroll
    for (int e = 0; e < kALoads; ++e) {
      const int kk = k0 + share.a_k(e);
      const int j = e % kARows;
      a_next[e] = (a_valid[j] && kk < k_end) ? problem.a(a_rows[j], kk) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kBLoads; ++e) {
      const int kk = k0 + share.b_k(e);
      b_next[e] = (b_valid[e] && kk < k_end) ? problem.b(kk, b_cols[e]) : 0.0f;
    }
  };
  auto store_shared = [&](int buffer) {
#pragma unroll
    for (int e = 0; e < kALoads; ++e) As[buffer][share.a_k(e)][share.a_m(e)] = a_next[e];
#pragma unroll
    for (int e = 0; e < kBLoads; ++e) Bs[buffer][share.b_k(e)][share.b_n(e)] = b_next[e];
  };

  const int tm = tid % (BM / TM), tn = tid / (BM / TM);
  float acc[TM][TN] = {};

  load_global(0);
  store_shared(0);
  __syncthreads();
  int buffer = 0;
  for (int k0 = 0; k0 < k_end; k0 += BK) {
    const bool has_next = k0 + BK < k_end;
    if (has_next) load_global(k0 + BK);
    multiply_stage<T>(acc, As[buffer], Bs[buffer], tm, tn);
    if (has_next) {
      store_shared(buffer ^ 1);
      __syncthreads();
      buffer ^= 1;
    }
  }

  store_tile<T>(problem, acc, m0, n0, tm, tn, 0);
}

// The cp.async ring both pipelined kernels run: STAGES - 1 steps in flight. Step
// `step` is multiplied from buffer step % STAGES while step + STAGES - 1 is copied
// into the buffer step - 1 was multiplied from. start_step(step, buffer) issues a
// step's copies, multiply(buffer) multiplies a landed buffer into the
// accumulators. Copies of step s form batch s (empty past the last step), so
// waiting for all but the newest STAGES - 2 batches completes exactly the step to
// multiply; the barrier that follows also guarantees that every thread is done
// with the buffer the next copies overwrite.
template <int STAGES, class Start, class Multiply>
__device__ __forceinline__ void run_stages(int steps, Start& start_step, Multiply&& multiply) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < steps) start_step(s, s);
    __pipeline_commit();
  }
  int read = 0;  // the buffer of step `step`
  for (int step = 0; step < steps; ++step) {
    __pipeline_wait_prior(STAGES - 2);
    __syncthreads();
    const int write = read == 0 ? STAGES - 1 : read - 1;  // multiplied in step - 1
    if (step + STAGES - 1 < steps) start_step(step + STAGES - 1, write);
    __pipeline_commit();
    multiply(read);
    read = read + 1 == STAGES ? 0 : read + 1;
  }
}

// Forward and backward-data when the reduced channels (C forward, K
// backward-data) are a multiple of BK: the reduction runs channel-inner
// (tap-major), kk = rs * channels + channel, so the BK values of one step share
// one tap (r, s). The problem's step(k0) decodes the tap once per step and
// a_base finds each row's pixel once per step (bounds, strides); each element is
// then one address, base + channel * plane. In the natural order
// (implicit_gemm_kernel) every element needs its own two or four divisions and
// bounds checks, which cost more issue slots than the FMAs they feed (A is
// reused only BN times). Any summation order is as deterministic as another.
//
// The operands go global -> shared by cp.async (4 bytes each: a gathered
// element, or a zero fill where the tap falls in the padding) into a ring of
// STAGES buffers, never through registers. STAGES - 1 steps are in flight while
// one is multiplied, where a register-staged double buffer has one: the
// gathers' latency is hidden by the pipeline rather than by more warps. Without
// staging registers (BM*BK + BN*BK over the threads) and their shared stores
// more blocks share an SM (the Tile's MIN_BLOCKS), which also rounds a launch
// of a few hundred blocks into one wave instead of one and a half.
// The ring is run_stages'; the problem gives a_src/b_src, the addresses of a
// step's elements.
template <class Problem, class T, int STAGES>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    pipelined_gemm_kernel(const Problem problem) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, TM = T::TM, TN = T::TN;
  constexpr int kThreads = T::kThreads;
  constexpr int kALoads = BM * BK / kThreads, kBLoads = BN * BK / kThreads;
  static_assert(STAGES >= 2);
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BM % TM == 0 && BN % TN == 0);
  static_assert(BM * BK % kThreads == 0 && BN * BK % kThreads == 0);
  static_assert(kThreads % BM == 0 || BM % kThreads == 0);
  constexpr int kARows = BM > kThreads ? BM / kThreads : 1;  // m fastest: rows repeat

  // A's rows unpadded: its copies go m-fastest, conflict-free without (and 6
  // blocks of the 128x32 tile fit the SM's 100 KB shared-memory carveout).
  __shared__ __align__(16) float As[STAGES][BK][BM];
  __shared__ __align__(16) float Bs[STAGES][BK][BN + 4];

  const int tid = static_cast<int>(threadIdx.x);
  const int m0 = static_cast<int>(blockIdx.x) * BM, n0 = static_cast<int>(blockIdx.y) * BN;
  const int steps = problem.Kred / BK;

  const FlatShare<T> share{tid};
  typename Problem::Row a_rows[kARows];
  bool a_valid[kARows];
  decode_share(
      problem.M, [&](int j) { return m0 + share.a_m(j); }, [&](int m) { return problem.row(m); },
      a_rows, a_valid);

  // Starts step `step`'s copies into buffer `stage`. A zero fill reads nothing;
  // its source is the operand's first element.
  auto start_step = [&](int step, int stage) {
    const typename Problem::Step st = problem.step(step * BK);
    int base[kARows];
#pragma unroll
    for (int j = 0; j < kARows; ++j) base[j] = a_valid[j] ? problem.a_base(a_rows[j], st) : -1;
#pragma unroll
    for (int e = 0; e < kALoads; ++e) {
      const int j = e % kARows;
      float* dst = &As[stage][share.a_k(e)][share.a_m(e)];
      if (base[j] >= 0) {
        __pipeline_memcpy_async(dst, problem.a_src(base[j], share.a_k(e)), 4);
      } else {
        __pipeline_memcpy_async(dst, problem.a_src(0, 0), 4, 4);
      }
    }
#pragma unroll
    for (int e = 0; e < kBLoads; ++e) {  // columns located anew: fewer live registers
      const int n = n0 + share.b_n(e);
      const bool valid = n < problem.Ncols;
      const float* src = problem.b_src(st, share.b_k(e), problem.col(valid ? n : 0));
      __pipeline_memcpy_async(&Bs[stage][share.b_k(e)][share.b_n(e)], src, 4, valid ? 0 : 4);
    }
  };

  const int tm = tid % (BM / TM), tn = tid / (BM / TM);
  float acc[TM][TN] = {};
  run_stages<STAGES>(steps, start_step,
                     [&](int read) { multiply_stage<T>(acc, As[read], Bs[read], tm, tn); });
  store_tile<T>(problem, acc, m0, n0, tm, tn, 0);
}

// Backward-weight: C[k, crs] = sum over this block's split of the (image,
// pixel) pairs npq of grad_y[n, k, pq] * x patch[npq, crs], the operands copied
// global -> shared by cp.async (4 bytes each, zero-filled past the split and in
// the padding) into a ring of STAGES buffers as in pipelined_gemm_kernel:
// STAGES - 1 steps in flight, no staging registers.
//
// All of a thread's copies in one step have the same kk, so its (image, pixel)
// pair is decoded once per step (two divisions, the image's offsets; the
// problem's pixel) for all of them: decoded per element, the divisions and
// offsets issue more instructions than the FMAs (Nsight Compute on FashionNet's
// conv2; docs/kernels.md, "Measured choices"). A
// warp copies 8 consecutive kk of 4 rows (A) or columns (B), so its stores into
// [kk][m + 4] hit 32 distinct banks (rows 4 apart mod 32) where 16 kk of 2 rows
// (BK 16) would conflict two-way. Thread t: kk = t % 8 + 8 * (warp % (BK / 8)),
// row (t / 8) % 4 + 4 * (warp / (BK / 8)), its next rows threads / BK further:
// a one-to-one map of the threads onto BK x threads / BK. Each split sums kk
// in ascending order: the same bits every run.
template <class Problem, class T, int STAGES>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    pipelined_pixel_kernel(const Problem problem, int k_per_split) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, TM = T::TM, TN = T::TN;
  constexpr int kThreads = T::kThreads;
  constexpr int kALoads = BM * BK / kThreads, kBLoads = BN * BK / kThreads;
  constexpr int kRowsApart = kThreads / BK;  // between the rows (columns) of a thread's share
  static_assert(STAGES >= 2);
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BM % TM == 0 && BN % TN == 0);
  static_assert(BM * BK % kThreads == 0 && BN * BK % kThreads == 0);
  static_assert(BK % 8 == 0 && kThreads % 32 == 0 && kRowsApart % 4 == 0);

  __shared__ __align__(16) float As[STAGES][BK][BM + 4];
  __shared__ __align__(16) float Bs[STAGES][BK][BN + 4];

  const int tid = static_cast<int>(threadIdx.x);
  const int m0 = static_cast<int>(blockIdx.x) * BM, n0 = static_cast<int>(blockIdx.y) * BN;
  const int split = static_cast<int>(blockIdx.z);
  const int k_begin = split * k_per_split;
  const int k_end = min(problem.Kred, k_begin + k_per_split);
  const int steps = max(0, k_end - k_begin + BK - 1) / BK;

  // The layout above: 8 kk by 4 rows per warp.
  const int kk = tid % 8 + 8 * (tid / 32 % (BK / 8));
  const int row = tid / 8 % 4 + 4 * (tid / 32 / (BK / 8));

  typename Problem::Row a_rows[kALoads];
  bool a_valid[kALoads];
  decode_share(
      problem.M, [&](int e) { return m0 + row + e * kRowsApart; },
      [&](int m) { return problem.row(m); }, a_rows, a_valid);
  typename Problem::Col b_cols[kBLoads];
  bool b_valid[kBLoads];
  decode_share(
      problem.Ncols, [&](int e) { return n0 + row + e * kRowsApart; },
      [&](int n) { return problem.col(n); }, b_cols, b_valid);

  auto start_step = [&](int step, int stage) {
    const typename Problem::Pixel px = problem.pixel(k_begin + step * BK + kk, k_end);
#pragma unroll
    for (int e = 0; e < kALoads; ++e) {
      const float* src;
      const bool copy = problem.a_src(a_rows[e], px, src) && a_valid[e];
      __pipeline_memcpy_async(&As[stage][kk][row + e * kRowsApart], src, 4, copy ? 0 : 4);
    }
#pragma unroll
    for (int e = 0; e < kBLoads; ++e) {
      const float* src;
      const bool copy = problem.b_src(px, b_cols[e], src) && b_valid[e];
      __pipeline_memcpy_async(&Bs[stage][kk][row + e * kRowsApart], src, 4, copy ? 0 : 4);
    }
  };

  const int tm = tid % (BM / TM), tn = tid / (BM / TM);
  float acc[TM][TN] = {};
  run_stages<STAGES>(steps, start_step,
                     [&](int read) { multiply_stage<T>(acc, As[read], Bs[read], tm, tn); });
  store_tile<T>(problem, acc, m0, n0, tm, tn, split);
}

}  // namespace towerlab::cuda::conv2d_gemm
