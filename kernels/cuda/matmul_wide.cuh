// The pieces every CUDA GEMM launch of kernels/cuda/matmul.cu shares (GemmParams,
// the guarded float4 load and store) and the wide-tile kernel for large products.
//
// gemm_wide_kernel: a block of 256 threads computes a 128x256 tile of C (M x N),
// stepping through K 8 at a time, one block per SM (__launch_bounds__(256, 1):
// ptxas may use up to 255 registers). The shape is the one cuBLAS's FP32 SIMT
// kernel picks on Hopper for 4096^3 (256x128x8 tile, 3 stages, 4x2 warps of 64x64,
// 128 accumulators per thread), and for the same reason: per k, a thread reads 8
// values of op(A) and 16 of op(B) in 6 float4 shared loads and does 128 FMAs
// (21 FMAs per load, against 16 for the 128x128 tile's 8x8 micro-tile), so the
// FMA pipe, not shared memory or issue slots, limits it.
// Warps: 8 as 2 (M) x 4 (N), each 64x64. A lane (ly, lx) = (lane / 4, lane % 4)
// owns rows ly*4 + {0..3} + {0, 32} and columns lx*4 + {0..3} + {0, 16, 32, 48}
// of its warp's 64x64: per k, the warp's float4 reads of the A slice are 8
// consecutive addresses (128 bytes) and of the B slice 4 (64 bytes), each one
// shared-memory wavefront, the lanes sharing an address served by broadcast.
// Operands reach the shared slices ([k][row], k-major) as in gemm_kernel: by
// cp.async where the global layout already is k-major (A transposed, B not),
// through registers and a transposing store where it is not (A not transposed:
// one float4 a thread, B transposed: two). Three stages, the slices of steps
// step+1 and step+2 in flight while step is computed on. The transposing scalar
// stores are conflict-free: the two k-groups of a warp's 16 rows lie 4 * (row
// length + 4) floats apart, 16 banks.
// Fragments are double-buffered in registers (as in CUTLASS's SIMT mainloop):
// while one k's 128 FMAs issue, the next k's 6 shared loads fill a second set
// of 24 registers, so a k never waits on its loads' latency; the step's barrier
// sits before its last k's FMAs, so the next step's first loads hide behind
// them too. With one block (2 warps a scheduler) there is no other warp to
// cover that latency.
// A block whose tile lies inside C, on 16-byte operands, with whole K-steps
// (4096^3: every block) runs a copy of the main loop without edge checks, its
// global sources advanced by a step's stride: about 100 issued instructions a
// step beside the 1024 FMAs (48 of them shared loads), where the checked loop
// issues up to 290.
// ptxas for sm_90 (CUDA 13): 253 (NN), 247 (TN), 255 (NT, TT) registers, no
// spills, 36.75 KiB of static shared memory: one block (8 warps) per SM, as
// cuBLAS's (254 registers); its 128 independent accumulators per thread keep
// the FMA pipe fed from 2 warps per scheduler.
// The operand that is not k-major (NN's A, NT's B^T) goes through registers, TN's
// both by cp.async, which is why NN and NT trail TN and matmul.cu may stage that
// operand first (its "Staging"). Speed beside cuBLAS: bench/results/gpu_h100.md.
#pragma once

#include <cuda_pipeline.h>

#include <cstdint>
#include <type_traits>

namespace towerlab::cuda::gemm_detail {

// One launch: C = alpha * op(A) op(B) + beta * C over the K range of each block's
// split. Block z sums k in [z * k_per_split, min(k, (z + 1) * k_per_split)) and
// writes to c + z * split_stride (split_stride 0 and k_per_split >= k: no split).
// vector_x says that X and its leading dimension allow 16-byte accesses.
struct GemmParams {
  int m, n, k;
  float alpha;
  const float* a;
  std::int64_t lda;
  const float* b;
  std::int64_t ldb;
  float beta;
  float* c;
  std::int64_t ldc;
  int k_per_split;
  std::int64_t split_stride;
  bool vector_a, vector_b, vector_c;
};

// One thread's share of a slice: 4 consecutive floats of global memory.
struct Fragment {
  float v[4];
};

// Reads 4 floats at src[0..3] that are valid while `count` > index, zero past it.
// `vector` says that src is 16-byte aligned (checked by the launcher via the
// leading dimension and the base pointer) so one float4 load does.
__device__ __forceinline__ Fragment load4(const float* src, int count, bool vector) {
  Fragment f;
  if (vector && count >= 4) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(src));
    f.v[0] = q.x;
    f.v[1] = q.y;
    f.v[2] = q.z;
    f.v[3] = q.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) f.v[e] = e < count ? __ldg(src + e) : 0.0f;
  }
  return f;
}

// Copies 4 floats src[0..3] (valid while `count` > index) to shared dst with
// cp.async, zero-filling past the edge: one 16-byte copy where allowed, else
// four 4-byte ones. A fully zero-filled copy reads nothing; its source is `base`.
__device__ __forceinline__ void copy4_async(float* dst, const float* src, const float* base,
                                            int count, bool vector) {
  if (vector && count >= 4) {
    __pipeline_memcpy_async(dst, src, 16);
  } else if (vector && count <= 0) {
    __pipeline_memcpy_async(dst, base, 16, 16);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e < count) {
        __pipeline_memcpy_async(dst + e, src + e, 4);
      } else {
        __pipeline_memcpy_async(dst + e, base, 4, 4);
      }
    }
  }
}

// C[row, col..col+3] = alpha * v[0..3] + beta * C[row, col..col+3], the columns at
// and past N skipped: one float4 store where C allows it. beta == 0 does not read C
// (it may hold NaN). `c` is the block's split's C.
__device__ __forceinline__ void store4(const GemmParams& p, float* c, int row, int col,
                                       const float* v) {
  const float alpha = p.alpha, beta = p.beta;
  float* out = c + static_cast<std::int64_t>(row) * p.ldc + col;
  if (p.vector_c && col + 4 <= p.n) {
    float4 r = make_float4(alpha * v[0], alpha * v[1], alpha * v[2], alpha * v[3]);
    if (beta != 0.0f) {
      const float4 old = *reinterpret_cast<const float4*>(out);
      r.x += beta * old.x, r.y += beta * old.y, r.z += beta * old.z, r.w += beta * old.w;
    }
    *reinterpret_cast<float4*>(out) = r;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (col + e < p.n) out[e] = beta == 0.0f ? alpha * v[e] : alpha * v[e] + beta * out[e];
    }
  }
}

struct WideTile {
  static constexpr int kM = 128, kN = 256, kK = 8;
  static constexpr int kThreads = 256;
  static constexpr int kStages = 3;
  // Slice rows padded by 4 floats: float4 reads stay aligned, and the transposing
  // stores' two k-groups fall 16 banks apart (see the header).
  static constexpr int kPad = 4;
};

// A [kK x kRows] slice of X stored [row][k] (k contiguous), loaded for a
// transposing store: two threads a row, each 4 consecutive k; kRows / 128
// fragments a thread. Zero at and past k_end and the extent.
template <int kRows>
__device__ __forceinline__ void load_rows_by_k(Fragment (&f)[kRows / 128], const float* x,
                                               std::int64_t ld, int extent, int k_end, int base,
                                               int k0, bool vector) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < kRows / 128; ++i) {
    const int r = base + i * 128 + t / 2, q = k0 + (t % 2) * 4;
    f[i] = load4(x + static_cast<std::int64_t>(r) * ld + q, r < extent ? k_end - q : 0, vector);
  }
}

// load_rows_by_k for a slice wholly inside X with 16-byte rows: `src` is the
// thread's first fragment's source (rows_by_k_source), no checks.
template <int kRows>
__device__ __forceinline__ const float* rows_by_k_source(const float* x, std::int64_t ld, int base,
                                                         int k0) {
  const int t = threadIdx.x;
  return x + static_cast<std::int64_t>(base + t / 2) * ld + k0 + (t % 2) * 4;
}
template <int kRows>
__device__ __forceinline__ void load_rows_by_k_inside(Fragment (&f)[kRows / 128], const float* src,
                                                      std::int64_t ld) {
#pragma unroll
  for (int i = 0; i < kRows / 128; ++i) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(src + i * 128 * ld));
    f[i] = Fragment{{v.x, v.y, v.z, v.w}};
  }
}

template <int kRows>
__device__ __forceinline__ void store_rows_by_k(float (*slice)[kRows + WideTile::kPad],
                                                const Fragment (&f)[kRows / 128]) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < kRows / 128; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) slice[(t % 2) * 4 + e][i * 128 + t / 2] = f[i].v[e];
  }
}

// A [kK x kRows] slice of X stored [k][row] (rows contiguous), copied by cp.async:
// kRows / 4 threads a k, each 4 consecutive rows. Zero at and past k_end and the
// extent.
template <int kRows>
__device__ __forceinline__ void copy_k_by_rows_async(float (*slice)[kRows + WideTile::kPad],
                                                     const float* x, std::int64_t ld, int extent,
                                                     int k_end, int base, int k0, bool vector) {
  constexpr int kLanes = kRows / 4, kPerPass = WideTile::kThreads / kLanes;
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < WideTile::kK / kPerPass; ++i) {
    const int kk = i * kPerPass + t / kLanes, q = k0 + kk, r = base + (t % kLanes) * 4;
    copy4_async(&slice[kk][(t % kLanes) * 4], x + static_cast<std::int64_t>(q) * ld + r, x,
                q < k_end ? extent - r : 0, vector);
  }
}

// copy_k_by_rows_async for a slice wholly inside X with 16-byte rows: `src` is
// the thread's first copy's source (k_by_rows_source), one 16-byte copy each.
template <int kRows>
__device__ __forceinline__ const float* k_by_rows_source(const float* x, std::int64_t ld, int base,
                                                         int k0) {
  constexpr int kLanes = kRows / 4;
  const int t = threadIdx.x;
  return x + static_cast<std::int64_t>(k0 + t / kLanes) * ld + base + (t % kLanes) * 4;
}
template <int kRows>
__device__ __forceinline__ void copy_k_by_rows_inside(float (*slice)[kRows + WideTile::kPad],
                                                      const float* src, std::int64_t ld) {
  constexpr int kLanes = kRows / 4, kPerPass = WideTile::kThreads / kLanes;
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < WideTile::kK / kPerPass; ++i) {
    __pipeline_memcpy_async(&slice[i * kPerPass + t / kLanes][(t % kLanes) * 4],
                            src + i * kPerPass * ld, 16);
  }
}

// C[m0:m0+128, n0:n0+256] = alpha * op(A) op(B) + beta * C for one block and its
// split of K (see the header for the design; the loop is gemm_kernel's).
template <bool kTransposeA, bool kTransposeB>
__global__ void __launch_bounds__(WideTile::kThreads, 1) gemm_wide_kernel(const GemmParams p) {
  constexpr int kM = WideTile::kM, kN = WideTile::kN, kK = WideTile::kK;
  constexpr int kStages = WideTile::kStages, kPad = WideTile::kPad;
  constexpr bool kAContiguousK = !kTransposeA;  // A [M,K]: transposed on its way in
  constexpr bool kBContiguousK = kTransposeB;   // B [N,K]: transposed on its way in
  __shared__ __align__(16) float slice_a[kStages][kK][kM + kPad];  // [k][m]
  __shared__ __align__(16) float slice_b[kStages][kK][kN + kPad];  // [k][n]
  const int m0 = blockIdx.y * kM, n0 = blockIdx.x * kN;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // The thread's first row and column in the block's tile.
  const int row0 = (warp / 4) * 64 + (lane / 4) * 4;
  const int col0 = (warp % 4) * 64 + (lane % 4) * 4;
  // An empty split (k_begin >= k) has no steps and stores a zero partial.
  const int k_begin = blockIdx.z * p.k_per_split;
  const int k_end = k_begin + max(0, min(p.k_per_split, p.k - k_begin));
  float* c = p.c + blockIdx.z * p.split_stride;
  const int steps = (k_end - k_begin + kK - 1) / kK;

  Fragment reg_a[kM / 128], reg_b[kN / 128];
  // A block whose tile lies inside C, on 16-byte operands, with whole K-steps
  // runs the main loop compiled without the edge checks, loading from sources
  // that advance by one step's stride: the checked loads' per-step address and
  // bounds arithmetic costs about a tenth of a step's 1024 FMAs in issue slots,
  // which one block per SM cannot hide behind another block (4096^3: every block).
  const bool interior =
      p.vector_a && p.vector_b && m0 + kM <= p.m && n0 + kN <= p.n && (k_end - k_begin) % kK == 0;
  const float* src_a = kAContiguousK ? rows_by_k_source<kM>(p.a, p.lda, m0, k_begin)
                                     : k_by_rows_source<kM>(p.a, p.lda, m0, k_begin);
  const float* src_b = kBContiguousK ? rows_by_k_source<kN>(p.b, p.ldb, n0, k_begin)
                                     : k_by_rows_source<kN>(p.b, p.ldb, n0, k_begin);
  const std::int64_t stride_a = kAContiguousK ? kK : kK * p.lda;
  const std::int64_t stride_b = kBContiguousK ? kK : kK * p.ldb;
  float acc[8][16] = {};

  auto main_loop = [&](auto inside) {
    constexpr bool kInside = decltype(inside)::value;
    // Called for steps 0, 1, 2, ... in order: the sources advance once a call.
    auto start_slice = [&](int step, int stage) {
      if constexpr (kInside) {
        if constexpr (kAContiguousK) {
          load_rows_by_k_inside<kM>(reg_a, src_a, p.lda);
        } else {
          copy_k_by_rows_inside<kM>(slice_a[stage], src_a, p.lda);
        }
        if constexpr (kBContiguousK) {
          load_rows_by_k_inside<kN>(reg_b, src_b, p.ldb);
        } else {
          copy_k_by_rows_inside<kN>(slice_b[stage], src_b, p.ldb);
        }
        src_a += stride_a, src_b += stride_b;
      } else {
        const int k0 = k_begin + step * kK;
        if constexpr (kAContiguousK) {
          load_rows_by_k<kM>(reg_a, p.a, p.lda, p.m, k_end, m0, k0, p.vector_a);
        } else {
          copy_k_by_rows_async<kM>(slice_a[stage], p.a, p.lda, p.m, k_end, m0, k0, p.vector_a);
        }
        if constexpr (kBContiguousK) {
          load_rows_by_k<kN>(reg_b, p.b, p.ldb, p.n, k_end, n0, k0, p.vector_b);
        } else {
          copy_k_by_rows_async<kN>(slice_b[stage], p.b, p.ldb, p.n, k_end, n0, k0, p.vector_b);
        }
      }
    };
    auto store_registers = [&](int stage) {
      if constexpr (kAContiguousK) store_rows_by_k<kM>(slice_a[stage], reg_a);
      if constexpr (kBContiguousK) store_rows_by_k<kN>(slice_b[stage], reg_b);
    };

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) {
        start_slice(s, s);
        store_registers(s);
      }
      __pipeline_commit();
    }

    // One k's values of op(A) (8) and op(B) (16) for the thread, from a stage.
    auto load_fragments = [&](int stage, int kk, float(&av)[8], float(&bv)[16]) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 q = *reinterpret_cast<const float4*>(&slice_a[stage][kk][row0 + h * 32]);
        av[h * 4] = q.x, av[h * 4 + 1] = q.y, av[h * 4 + 2] = q.z, av[h * 4 + 3] = q.w;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 q = *reinterpret_cast<const float4*>(&slice_b[stage][kk][col0 + j * 16]);
        bv[j * 4] = q.x, bv[j * 4 + 1] = q.y, bv[j * 4 + 2] = q.z, bv[j * 4 + 3] = q.w;
      }
    };

    // Fragment double buffering: k's FMAs run on one register set while the next
    // k's shared loads fill the other, so no k waits on its loads' latency. The
    // step's barrier sits before its last k's FMAs, not at the top of the next
    // step: the next step's first loads then overlap those 128 FMAs too.
    // Ring safety: step s writes (cp.async at its top, register stores at its last
    // k) the stage that step s - 1 read, whose last shared loads precede step
    // s - 1's barrier; it reads stage s % kStages only after its own predecessor's
    // barrier, which follows the wait for that stage's copies.
    float av[2][8], bv[2][16];
    int read = 0;
    if (steps > 0) {
      __pipeline_wait_prior(kStages - 2);
      __syncthreads();
      load_fragments(0, 0, av[0], bv[0]);
    }
    for (int step = 0; step < steps; ++step) {
      const int write = read == 0 ? kStages - 1 : read - 1;
      const bool more = step + kStages - 1 < steps;
      if (more) start_slice(step + kStages - 1, write);
      __pipeline_commit();
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        if (kk == kK - 1) {
          // Step step + 1's slices: its registers stored two steps ago, its copies
          // waited for here; after the barrier every thread may read them.
          if (more) store_registers(write);
          __pipeline_wait_prior(kStages - 2);
          __syncthreads();
          read = read + 1 == kStages ? 0 : read + 1;
          if (step + 1 < steps) load_fragments(read, 0, av[0], bv[0]);
        } else {
          load_fragments(read, kk + 1, av[(kk + 1) % 2], bv[(kk + 1) % 2]);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 16; ++j) acc[i][j] = fmaf(av[kk % 2][i], bv[kk % 2][j], acc[i][j]);
        }
      }
    }
  };
  if (interior) {
    main_loop(std::true_type{});
  } else {
    main_loop(std::false_type{});
  }

  // C = alpha * acc + beta * C, clipped to [M, N].
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = m0 + row0 + (i % 4) + (i / 4) * 32;
    if (row >= p.m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) store4(p, c, row, n0 + col0 + j * 16, &acc[i][j * 4]);
  }
}

}  // namespace towerlab::cuda::gemm_detail
