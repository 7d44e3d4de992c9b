// The tensor-core GEMM (kernels/cuda/matmul_tc.h; contract in kernels/matmul.h):
// bfloat16 and float16 operands on mma.sync m16n8k16, float32 operands rounded to
// TF32 on mma.sync m16n8k8, float32 sums for all three, operands staged through
// shared memory by a cp.async pipeline and read into the mma's fragments by
// ldmatrix (or, for one TF32 case, plain shared loads: below). It uses only
// kernels/cuda/tensor_core.cuh (with tc_tile.cuh's sizes of an operand type) and
// cuda_pipeline.h, so the same text runs under nvcc and on the emulated GPUs.
//
// Tiling. A block of 256 threads (8 warps) computes a 128x128 tile of C, stepping
// through K one stage at a time (32 16-bit values or 16 float32 ones: 64 bytes of
// a row). The warps sit 2 (M) x 4 (N), each owning a 64x32 patch of the tile: 4
// m16 x 4 n8 mma tiles, 64 float32 accumulators a thread. Per mma step of K (k16,
// or k8 for TF32), a warp loads 4 A fragments and 4 B fragments (with 6
// ldmatrix.x4 where it can) and issues 16 mma: each fragment feeds 4 mma, which is
// what keeps shared-memory bandwidth off the critical path (a 32x32 patch would
// need 4 loads per 8 mma).
//
// Shared memory holds each operand as it lies in global memory, so that cp.async
// copies 16-byte chunks (8 16-bit values, 4 float32) without touching registers;
// ldmatrix then does any transposition on the way out (its .trans form):
//   an operand stored with K contiguous (A [M,K], or B^T stored [N,K]): a tile of
//     128 lines (rows of C's M or N) x 64 bytes of k = 4 chunks a line ("k-major");
//   one stored with M or N contiguous (A^T stored [K,M], B [K,N]): 32 (16-bit) or
//     16 (float32) lines of k x 128 values = 16 or 32 chunks a line ("mn-major").
// All are 8 KiB a stage. A k-major line read with ldmatrix gives the mma's
// row-major A fragment or col-major B fragment directly; an mn-major one needs
// .trans (the PTX ISA's fragments; tensor_core.cuh's table).
//
// TF32. The float32 operands take the same pipeline with the sizes above: the
// copies, swizzle, barriers, split of K and epilogue are one text (TcOperand holds
// the few numbers that differ). What is particular to them:
//   - a float32 is copied as it is, and each fragment register is rounded to tf32
//     as it is loaded (to_tf32: cvt.rna, to nearest with ties away from zero), so
//     the mma reads rounded values and nothing is rounded twice;
//   - a k-major tile is read with the same ldmatrix.x4 at the same addresses as a
//     16-bit one: ldmatrix gives lane l the 4 bytes at row l/4, bytes 4 (l%4) ..
//     4 (l%4) + 3 of each 8x16-byte matrix, which for float32 is element (l/4,
//     l%4) of an 8x4 block, the m16n8k8 tf32 fragment's (g, t);
//   - an mn-major tile cannot be: .trans transposes 16-bit halves and would split
//     every float32. There each lane reads its 4 A and 2 B values per fragment with
//     32-bit shared loads (tf32_element below); a warp's load touches 8 m (or n)
//     values, two chunks, in each of 4 k lines.
//
// Swizzle. ldmatrix reads 8 rows of 16 bytes per 8x8 matrix; shared memory serves
// 128 bytes (32 banks of 4) per cycle, so the 8 rows are conflict-free only if
// they fall in 8 different 16-byte slots of a 128-byte line. Stored plainly they
// do not: an mn-major line is 256 or 512 bytes, so chunk c of 8 consecutive k
// lines sits in the same slot 8 times (an 8-way conflict); a k-major line is 64
// bytes, so chunk c of lines r, r+2, r+4, r+6 collide (4-way). Padding would cure
// it at the cost of shared memory; instead each chunk's position within its line
// is XORed with bits of the line number (the "swizzle", swizzled() below):
//   k-major:  chunk ^ ((line / 2) % 4): lines r..r+7 are 4 pairs of 64-byte lines
//             per 128 bytes, the pair's two lines in the two halves, each pair's
//             chunk moved to a different quarter of its half;
//   mn-major, 16-bit: chunk ^ (line % 8): the 8 lines of a matrix hit slots c^0 ..
//             c^7, all different;
//   mn-major, float32: chunk ^ 2 (line % 8): a plain load's 32 words lie in 4
//             lines (t = lane % 4) x 2 chunks (g / 4) x 4 words (g % 4); the two
//             chunks differ in bit 0 and the XOR moves each line's pair by 2t, so
//             the 8 chunks fall in 8 different slots and the words in 32 banks.
// The permutation is within a line, so the cp.async stores stay 16-byte aligned
// and a warp's 32 copies still cover 512 contiguous bytes.
//
// Pipeline. Three stages in a ring (48 KiB, the static limit): while the block
// computes on stage s, the copies of the next two K steps are in flight. One
// commit group per step; __pipeline_wait_prior(kStages - 2) then guarantees that
// this thread's copies of the step to compute have landed, and the __syncthreads
// after it that every thread's have, and that every warp has finished the step
// before, whose buffer this step refills. Two blocks fit an SM (96 of its 228 KiB
// and 2 x 256 threads at <= 128 registers: __launch_bounds__(256, 2)), so one
// block's barrier wait hides behind the other's mma.
//
// Edges. A row of A or B as the kernel sees it is whole 16-byte chunks: 16-byte
// aligned, its length a multiple of a chunk's values, and zero past the matrix's
// edge (the launcher pads an operand that is not so; matmul_tc.h states the rule),
// so a chunk is always copied whole. A block's lines past M or N are copies of its
// last line inside (they only reach rows or columns of C that are not stored);
// chunks at and past the end of K (of the split) are zero-filled by cp.async
// itself (src-size 0: nothing is read). Both copies have a constant size and fill
// (a run-time fill costs a branch table per copy in the CUDA header), and only the
// step that reaches k_end checks K at all. Every warp runs the same loop: no lane
// diverges around an mma or ldmatrix. Stores of C are clipped to [M, N].
//
// Split-K. A product whose 128x128 tiles number fewer than the SMs (512^3: 16;
// a linear layer's [128,3136] x [3136,128]: 1) cuts K into splits of whole steps;
// each block writes its split's raw float32 sums and split_reduce adds them in a
// fixed tree and applies alpha, beta and the rounding of C once.
//
// Instantiations: 12 (A and B transposed or not x bfloat16, float16 or TF32
// inputs); the dtype of C is a run-time switch in the epilogue only (float32 for
// TF32).
#include <cuda_pipeline.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

#include "engine/half.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_tc.h"
#include "kernels/cuda/split_reduce.cuh"
#include "kernels/cuda/tc_tile.cuh"
#include "kernels/cuda/tensor_core.cuh"

namespace towerlab::cuda {

namespace {

constexpr int kTile = 128;               // rows (M) and columns (N) of C per block
constexpr int kStages = 3;               // stages in the shared-memory ring
constexpr int kThreads = 256;            // 8 warps, 2 (M) x 4 (N)
constexpr int kWarpM = 64, kWarpN = 32;  // each warp's patch of C
constexpr int kFragsM = kWarpM / 16;     // m16 tiles per warp
constexpr int kFragsN = kWarpN / 8;      // n8 tiles per warp
constexpr int kStageBytes = kTile * 64;  // one operand's stage: 128 lines of 64 bytes of k
static_assert((kTile / kWarpM) * (kTile / kWarpN) * 32 == kThreads, "one warp per patch");

// The numbers of the pipeline that depend on the operand type (the file's opening
// comment: everything is sized in bytes). Stored (a 16-bit pattern, or a float32
// that is rounded to tf32 when its fragment is loaded: as it lies in global and
// shared memory), kChunk (values per 16-byte copy), kStepK (K per pipeline stage)
// and kMmaK (K per mma) are conv2d's tensor-core kernel's too (tc_tile.cuh).
template <TcInput kInput>
struct TcOperand : tc::TcValues<kInput> {
  using Stored = typename tc::TcValues<kInput>::Stored;
  static constexpr int kTileValues = kStageBytes / sizeof(Stored);
  static constexpr int kMnXorShift = tc::TcValues<kInput>::kTf32 ? 1 : 0;  // mn-major swizzle
};

// A split of K keeps at least this much (8 stages of 16-bit operands, 16 of
// float32), so that writing and reading back the split's partial tile (64 KiB each
// way) costs less than its 128x128x256 products at the tensor cores' rate (a guess
// until a GPU times it; TF32's rate is half the 16-bit one, which only makes the
// split cheaper in comparison).
constexpr int kMinSplitK = 256;

// The longest row of an operand (its leading dimension): a stage tile's 128 lines
// of it then span less than 2^31 values, so that the copies' offsets are 32-bit.
// A multiple of 8, and so of every operand's chunk.
constexpr std::int64_t kMaxLd = (std::int64_t{INT_MAX} - kTile) / kTile / 8 * 8;

enum class OutType { Float32, BFloat16, Float16 };

// One launch: C = alpha * op(A) op(B) + beta * C over the K range of each block's
// split. Block z sums k in [z * k_per_split, min(k, (z + 1) * k_per_split)) and
// writes to c + z * split_stride (split_stride 0: no split). a and b hold the
// operand's Stored values, 16-byte aligned with lda, ldb multiples of a chunk (the
// launcher pads them otherwise).
struct TcParams {
  int m, n, k;
  float alpha, beta;
  const void* a;
  std::int64_t lda;
  const void* b;
  std::int64_t ldb;
  void* c;
  std::int64_t ldc;
  OutType out;
  bool pair_c;  // c and ldc allow storing two neighbouring values at once
  int k_per_split;
  std::int64_t split_stride;
};

// Offset, in values, of chunk `chunk` of line `line` in a stage's tile of an operand
// (k-major: 128 lines of 4 chunks; mn-major: kStepK lines of 16 or 32), swizzled as
// the file's opening comment explains.
template <bool kKMajor, class Op>
__host__ __device__ constexpr int swizzled(int line, int chunk) {
  if constexpr (kKMajor) {
    return line * Op::kStepK + (chunk ^ ((line >> 1) & 3)) * Op::kChunk;
  } else {
    return line * kTile + (chunk ^ ((line & 7) << Op::kMnXorShift)) * Op::kChunk;
  }
}

// The copies of one operand's stage tile that this thread issues: 512 chunks, two
// a thread, consecutive threads taking consecutive chunks, so that a warp reads
// whole 64- to 512-byte runs of a row of X. What does not change from step to step
// (each chunk's place in the step's block of X and in the swizzled tile) is worked
// out once, with 32-bit offsets (the launcher bounds ld so that a tile's span
// fits), so a step costs a pointer increment and the copies.
// Lines past M or N are not zero-filled but copied from the last line inside: they
// only feed rows or columns of C that are never stored. Values past K must be
// zero (0 * inf would reach the stored outputs), so the step that reaches k_end (the
// last of a split, and only where K is not a multiple of the step) takes the checked
// copy, zero-filling the chunks at and past k_end; the test on k0 is the same in
// every thread, so no warp diverges.
template <bool kKMajor, class Op>
struct TileCopier {
  using Stored = typename Op::Stored;
  static constexpr int kChunksPerLine = kKMajor ? Op::kStepK / Op::kChunk : kTile / Op::kChunk;
  static constexpr int kPerThread = Op::kTileValues / Op::kChunk / kThreads;
  const Stored* x;           // the operand's base: the source of a zero fill
  const Stored* block;       // the current step's first value (line 0, chunk 0)
  std::int64_t stride;       // from one step's block to the next
  int src[kPerThread];       // chunk i's offset from `block`
  int dst[kPerThread];       // chunk i's offset in a stage's tile
  int k_offset[kPerThread];  // chunk i's first k, from the step's first

  // X from its row or column `base` (A's m0 or B's n0; `extent` is M or N, which
  // base is below), k from k_begin.
  __device__ TileCopier(const Stored* operand, std::int64_t ld, int extent, int base, int k_begin)
      : x(operand),
        block(operand + (kKMajor ? base * ld + k_begin : k_begin * ld + base)),
        stride(kKMajor ? Op::kStepK : Op::kStepK * ld) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int q = static_cast<int>(threadIdx.x) + i * kThreads;
      const int line = q / kChunksPerLine, chunk = q % kChunksPerLine;
      if constexpr (kKMajor) {  // line: a row of X past M or N reads the last one
        src[i] = min(line, extent - 1 - base) * static_cast<int>(ld) + chunk * Op::kChunk;
      } else {  // chunk: a column past M or N reads the last chunk (rows are whole chunks)
        src[i] = line * static_cast<int>(ld) +
                 min(chunk * Op::kChunk, (extent - 1 - base) / Op::kChunk * Op::kChunk);
      }
      dst[i] = swizzled<kKMajor, Op>(line, chunk);
      k_offset[i] = kKMajor ? chunk * Op::kChunk : line;
    }
  }

  // Starts the copies of the step whose first k is k0 into `tile`, zero at and
  // past k_end, and moves on to the next step.
  __device__ __forceinline__ void start(Stored* tile, int k0, int k_end) {
    if (k0 + Op::kStepK <= k_end) {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
        __pipeline_memcpy_async(tile + dst[i], block + src[i], 16);
    } else {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        if (k0 + k_offset[i] < k_end) {
          __pipeline_memcpy_async(tile + dst[i], block + src[i], 16);
        } else {
          __pipeline_memcpy_async(tile + dst[i], x, 16, 16);  // all zero fill: reads nothing
        }
      }
    }
    block += stride;
  }
};

// A fragment register that holds a float32's bits (as ldmatrix leaves them),
// rounded to tf32.
__device__ __forceinline__ std::uint32_t tf32_from_bits(std::uint32_t bits) {
  float x;
  memcpy(&x, &bits, sizeof x);
  return to_tf32(x);
}

// The offset of value (k, mn) of an mn-major float32 tile, for the plain loads
// that stand in for ldmatrix's .trans. The fragments ask for k = 8 kk + 4 h + t
// and mn = c0 + 8 q + g (c0 a multiple of 32, t and g the lane's, kk, h and q
// constants of the unrolled loops), and for those swizzled(k, mn / 4) + mn % 4 is
//   (8 kk + 4 h) kTile + 32 ((c0 / 32 + q / 4) ^ h)  +  t kTile + g + 8 ((q % 4) ^ t)
// (the chunk's bits from 3 up are c0 / 32 + q / 4, XORed with h; its bits 0-2 are
// g / 4 and q % 4, XORed with t). Written so, the lane's part takes four values
// (one per q % 4) that stay in registers across the loop, and each load adds
// constants to one of them; the static_assert below checks it against swizzled().
__host__ __device__ constexpr int tf32_offset(int kk, int h, int c0, int q, int lane) {
  const int g = lane / 4, t = lane % 4;
  return (8 * kk + 4 * h) * kTile + 32 * ((c0 / 32 + q / 4) ^ h) + t * kTile + g +
         8 * ((q % 4) ^ t);
}

// tf32_offset is swizzled()'s offset for every lane and every argument the
// fragment loaders pass (kk < 2, h < 2, c0 a warp's first row or column, q < 8).
constexpr bool tf32_offsets_agree() {
  using Op = TcOperand<TcInput::Tf32>;
  for (int lane = 0; lane < 32; ++lane) {
    for (int kk = 0; kk < Op::kStepK / Op::kMmaK; ++kk) {
      for (int h = 0; h < 2; ++h) {
        for (int c0 = 0; c0 < kTile; c0 += 32) {
          for (int q = 0; q < 8; ++q) {
            const int k = 8 * kk + 4 * h + lane % 4, mn = c0 + 8 * q + lane / 4;
            const int want = swizzled<false, Op>(k, mn / Op::kChunk) + mn % Op::kChunk;
            if (tf32_offset(kk, h, c0, q, lane) != want) return false;
          }
        }
      }
    }
  }
  return true;
}
static_assert(tf32_offsets_agree(), "tf32_offset must follow the mn-major swizzle");

// Value (k, mn) of an mn-major float32 tile (tf32_offset's arguments), rounded to tf32.
__device__ __forceinline__ std::uint32_t tf32_element(const float* tile, int kk, int h, int c0,
                                                      int q, int lane) {
  return to_tf32(tile[tf32_offset(kk, h, c0, q, lane)]);
}

// The A fragments of the warp's 4 m16 tiles (rows warp_row + 16 i) for mma step kk
// of a stage (k from kk * kMmaK). With ldmatrix, lane 8j + r gives row r of 8x8
// matrix j, and matrix j must land in a[j]: for 16-bit (m 0-7, k 0-7), (m 8-15,
// k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15); for tf32 the same with 4 k a matrix.
// Either way the k halves are chunks 2 kk and 2 kk + 1 of a k-major line.
template <bool kKMajor, class Op>
__device__ __forceinline__ void load_a(std::uint32_t (&fa)[kFragsM][4],
                                       const typename Op::Stored* tile, int warp_row, int kk,
                                       int lane) {
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
    const int m = warp_row + i * 16;
    if constexpr (kKMajor) {  // tile [m][k]: matrix j's rows are m + 8 (j % 2) + r
      ldmatrix_x4(fa[i], tile + swizzled<true, Op>(m + lane % 16, 2 * kk + lane / 16));
      if constexpr (Op::kTf32) {
#pragma unroll
        for (int e = 0; e < 4; ++e) fa[i][e] = tf32_from_bits(fa[i][e]);
      }
    } else if constexpr (!Op::kTf32) {  // tile [k][m], transposed: matrix j's rows
      // are k = 16 kk + 8 (j / 2) + r
      ldmatrix_x4_trans(fa[i], tile + swizzled<false, Op>(16 * kk + lane % 8 + 8 * (lane / 16),
                                                          m / 8 + (lane / 8) % 2));
    } else {  // tile [k][m], float32: a[e] is (m + g + 8 (e % 2), k + t + 4 (e / 2))
#pragma unroll
      for (int e = 0; e < 4; ++e)
        fa[i][e] = tf32_element(tile, kk, e / 2, warp_row, 2 * i + e % 2, lane);
    }
  }
}

// The B fragments of the warp's 4 n8 tiles (columns warp_col + 8 j). With
// ldmatrix, two per ldmatrix.x4: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7,
// n 8-15), (k 8-15, n 8-15) are b[0], b[1] of the first n8 tile and b[0], b[1] of
// the second (for tf32, 4 k a matrix, chunks 2 kk and 2 kk + 1 again).
template <bool kKMajor, class Op>
__device__ __forceinline__ void load_b(std::uint32_t (&fb)[kFragsN][2],
                                       const typename Op::Stored* tile, int warp_col, int kk,
                                       int lane) {
  if constexpr (!kKMajor && Op::kTf32) {  // tile [k][n], float32: b[e] is (k + t + 4 e, n + g)
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) fb[j][e] = tf32_element(tile, kk, e, warp_col, j, lane);
    }
  } else {
#pragma unroll
    for (int pair = 0; pair < kFragsN / 2; ++pair) {
      const int n = warp_col + pair * 16;
      std::uint32_t r[4];
      if constexpr (kKMajor) {  // tile [n][k]: matrix j's rows are n = 8 (j / 2) + r
        ldmatrix_x4(
            r, tile + swizzled<true, Op>(n + lane % 8 + 8 * (lane / 16), 2 * kk + (lane / 8) % 2));
        if constexpr (Op::kTf32) {
#pragma unroll
          for (int e = 0; e < 4; ++e) r[e] = tf32_from_bits(r[e]);
        }
      } else {  // tile [k][n], transposed: matrix j's rows are k = 16 kk + 8 (j % 2) + r
        ldmatrix_x4_trans(r, tile + swizzled<false, Op>(16 * kk + lane % 16, n / 8 + lane / 16));
      }
      fb[2 * pair][0] = r[0], fb[2 * pair][1] = r[1];
      fb[2 * pair + 1][0] = r[2], fb[2 * pair + 1][1] = r[3];
    }
  }
}

// C's one formula: out = alpha * sum + beta * out in float32, rounded once to T;
// beta == 0 does not read out (it may hold NaN).
template <typename T>
__device__ __forceinline__ T output_value(const T* out, float alpha, float sum, float beta) {
  return T(beta == 0.0f ? alpha * sum : alpha * sum + beta * static_cast<float>(*out));
}

// C[row, col], C[row, col + 1] from the sums v0, v1, the second skipped at col + 1
// == N; one 8- or 4-byte store where C allows it.
template <typename T>
__device__ __forceinline__ void store_pair(const TcParams& p, T* c, int row, int col, float v0,
                                           float v1) {
  T* out = c + static_cast<std::int64_t>(row) * p.ldc + col;
  const T r0 = output_value(out, p.alpha, v0, p.beta);
  if (col + 1 >= p.n) {
    *out = r0;
    return;
  }
  const T r1 = output_value(out + 1, p.alpha, v1, p.beta);
  if (!p.pair_c) {
    out[0] = r0, out[1] = r1;
  } else if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float2*>(out) = make_float2(r0, r1);
  } else {
    *reinterpret_cast<std::uint32_t*>(out) =
        static_cast<std::uint32_t>(r0.bits) | static_cast<std::uint32_t>(r1.bits) << 16;
  }
}

// The warp's 64x32 patch of C at (row0, col0), clipped to [M, N]. Accumulator e of
// mma tile (i, j) is row row0 + 16 i + g + 8 (e / 2), column col0 + 8 j + 2 t + e % 2
// (g = lane / 4, t = lane % 4; the same for m16n8k16 and m16n8k8): e = 0, 1 and
// e = 2, 3 are neighbouring pairs.
template <typename T>
__device__ __forceinline__ void store_patch(const TcParams& p, T* c,
                                            const float (&acc)[kFragsM][kFragsN][4], int row0,
                                            int col0, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * i + g + 8 * h;
      if (row >= p.m) continue;
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int col = col0 + 8 * j + 2 * t;
        if (col < p.n) store_pair(p, c, row, col, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
    }
  }
}

template <bool kTransposeA, bool kTransposeB, TcInput kInput>
__global__ void __launch_bounds__(kThreads, 2) gemm_tc_kernel(const TcParams p) {
  using Op = TcOperand<kInput>;
  using Stored = typename Op::Stored;
  constexpr bool kAKMajor = !kTransposeA;  // A [M,K]
  constexpr bool kBKMajor = kTransposeB;   // B^T [N,K]
  __shared__ __align__(128) Stored tile_a[kStages][Op::kTileValues];
  __shared__ __align__(128) Stored tile_b[kStages][Op::kTileValues];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int m0 = static_cast<int>(blockIdx.y) * kTile, n0 = static_cast<int>(blockIdx.x) * kTile;
  const int warp_row = (warp / (kTile / kWarpN)) * kWarpM;
  const int warp_col = (warp % (kTile / kWarpN)) * kWarpN;
  // An empty split (k_begin >= k) has no steps and stores a zero partial.
  const int k_begin = static_cast<int>(blockIdx.z) * p.k_per_split;
  const int k_end = k_begin + max(0, min(p.k_per_split, p.k - k_begin));
  const int steps = (k_end - k_begin + Op::kStepK - 1) / Op::kStepK;

  // Steps start in order, so each copier's sources advance one step per call.
  TileCopier<kAKMajor, Op> copy_a(static_cast<const Stored*>(p.a), p.lda, p.m, m0, k_begin);
  TileCopier<kBKMajor, Op> copy_b(static_cast<const Stored*>(p.b), p.ldb, p.n, n0, k_begin);
  auto start_step = [&](int step, int stage) {
    const int k0 = k_begin + step * Op::kStepK;
    copy_a.start(tile_a[stage], k0, k_end);
    copy_b.start(tile_b[stage], k0, k_end);
  };
  // Commit group s holds step s's copies (empty past the last step), so waiting
  // for all but the newest kStages - 2 groups completes exactly the step to compute.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) start_step(s, s);
    __pipeline_commit();
  }

  float acc[kFragsM][kFragsN][4] = {};
  int read = 0;  // the stage of step `step`
  for (int step = 0; step < steps; ++step) {
    __pipeline_wait_prior(kStages - 2);
    __syncthreads();
    // Refill the stage read in step - 1, which every warp has left (the barrier).
    const int write = read == 0 ? kStages - 1 : read - 1;
    if (step + kStages - 1 < steps) start_step(step + kStages - 1, write);
    __pipeline_commit();
#pragma unroll
    for (int kk = 0; kk < Op::kStepK / Op::kMmaK; ++kk) {
      std::uint32_t fa[kFragsM][4], fb[kFragsN][2];
      load_a<kAKMajor, Op>(fa, tile_a[read], warp_row, kk, lane);
      load_b<kBKMajor, Op>(fb, tile_b[read], warp_col, kk, lane);
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) mma_m16n8<kInput>(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    read = read + 1 == kStages ? 0 : read + 1;
  }

  const int row0 = m0 + warp_row, col0 = n0 + warp_col;
  switch (p.out) {
    case OutType::Float32:
      store_patch(p, static_cast<float*>(p.c) + blockIdx.z * p.split_stride, acc, row0, col0, lane);
      break;
    case OutType::BFloat16:
      store_patch(p, static_cast<bfloat16*>(p.c), acc, row0, col0, lane);
      break;
    case OutType::Float16:
      store_patch(p, static_cast<float16*>(p.c), acc, row0, col0, lane);
      break;
  }
}

// The split-K epilogue: C[i / n, i % n] from element i's sum of the partials, by
// the kernel's own formula (output_value).
struct TcSplitEpilogue {
  void* c;
  std::int64_t ldc;
  int n;
  float alpha, beta;
  OutType out;
  __device__ void operator()(std::int64_t i, float sum) const {
    const std::int64_t at = (i / n) * ldc + i % n;
    switch (out) {
      case OutType::Float32: {
        float* o = static_cast<float*>(c) + at;
        *o = output_value(o, alpha, sum, beta);
        break;
      }
      case OutType::BFloat16: {
        bfloat16* o = static_cast<bfloat16*>(c) + at;
        *o = output_value(o, alpha, sum, beta);
        break;
      }
      case OutType::Float16: {
        float16* o = static_cast<float16*>(c) + at;
        *o = output_value(o, alpha, sum, beta);
        break;
      }
    }
  }
};

// out [rows, pitch] = in [rows, cols] (rows ld_in apart), zeros in columns cols..pitch-1.
template <typename T>
__global__ void pad_rows_kernel(std::int64_t count, T* out, int pitch, const T* in,
                                std::int64_t ld_in, int cols) {
  for (const std::int64_t i : grid_stride(count)) {
    const std::int64_t row = i / pitch;
    const int col = static_cast<int>(i % pitch);
    out[i] = col < cols ? in[row * ld_in + col] : T{0};
  }
}

// The operand x as the kernel takes it: itself where it is 16-byte aligned with rows
// a multiple of a chunk's values, else a padded copy in `padded` (its leading
// dimension into *ld).
template <class Op>
const typename Op::Stored* operand(const Tensor& x, std::optional<Scratch>& padded,
                                   std::int64_t* ld, const Stream& stream) {
  using Stored = typename Op::Stored;
  const auto* data = static_cast<const Stored*>(x.raw_data());
  const std::int64_t rows = x.size(0), cols = x.size(1);
  TL_CHECK(cols <= kMaxLd, InvalidArgument,
           "matmul: " << x.describe() << " has rows of " << cols
                      << " values; the tensor-core GEMM takes at most " << kMaxLd);
  *ld = cols;
  const bool aligned = reinterpret_cast<std::uintptr_t>(data) % 16 == 0 && cols % Op::kChunk == 0;
  if (aligned || rows * cols == 0) return data;  // empty: K = 0, nothing is read
  const std::int64_t pitch = (cols + Op::kChunk - 1) / Op::kChunk * Op::kChunk;
  TL_CHECK(pitch <= INT_MAX, InvalidArgument,
           "matmul: an operand's rows of " << cols << " values exceed INT_MAX");
  padded.emplace(stream, static_cast<std::size_t>(rows * pitch) * sizeof(Stored));
  launch_grid_stride(pad_rows_kernel<Stored>, rows * pitch, stream, padded->as<Stored>(),
                     static_cast<int>(pitch), data, cols, static_cast<int>(cols));
  *ld = pitch;
  return padded->as<Stored>();
}

using TcKernel = void (*)(TcParams);

template <TcInput kInput>
TcKernel pick_kernel(bool transpose_a, bool transpose_b) {
  return transpose_a ? (transpose_b ? gemm_tc_kernel<true, true, kInput>
                                    : gemm_tc_kernel<true, false, kInput>)
                     : (transpose_b ? gemm_tc_kernel<false, true, kInput>
                                    : gemm_tc_kernel<false, false, kInput>);
}

// Splits of K (whole steps of step_k each) so that tiles x splits reaches the SM count.
struct TcPlan {
  int splits, k_per_split;
};
TcPlan plan_tc(int m, int n, int k, int step_k, int sms) {
  const std::int64_t tiles = std::int64_t{(m + kTile - 1) / kTile} * ((n + kTile - 1) / kTile);
  const int splits = split_count(tiles, sms, k, kMinSplitK);
  if (splits == 1) return {1, k};
  const int k_per_split = ((k + splits - 1) / splits + step_k - 1) / step_k * step_k;
  return {(k + k_per_split - 1) / k_per_split, k_per_split};  // rounding may leave fewer
}

// gemm_16bit's and gemm_tf32's launcher, for operands of type kInput.
template <TcInput kInput>
void gemm_tc(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
             float alpha, float beta, const Stream& stream) {
  using Op = TcOperand<kInput>;
  const std::int64_t m = c.size(0), n = c.size(1), k = transpose_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  TL_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, InvalidArgument,
           "matmul: dimensions " << m << "x" << n << "x" << k << " exceed INT_MAX");
  CudaDeviceGuard guard(stream.device().index);
  TcParams p{};
  p.m = static_cast<int>(m), p.n = static_cast<int>(n), p.k = static_cast<int>(k);
  p.alpha = alpha, p.beta = beta;
  std::optional<Scratch> padded_a, padded_b;  // live until the product is enqueued
  p.a = operand<Op>(a, padded_a, &p.lda, stream);
  p.b = operand<Op>(b, padded_b, &p.ldb, stream);
  const TcKernel kernel = pick_kernel<kInput>(transpose_a, transpose_b);
  const OutType out = c.dtype() == DType::Float32    ? OutType::Float32
                      : c.dtype() == DType::BFloat16 ? OutType::BFloat16
                                                     : OutType::Float16;
  const TcPlan plan = plan_tc(p.m, p.n, p.k, Op::kStepK, sm_count(stream.device().index));
  const dim3 grid((p.n + kTile - 1) / kTile, (p.m + kTile - 1) / kTile, plan.splits);
  TL_CHECK(grid.y <= 65535, InvalidArgument,
           "matmul: M = " << m << " needs more than 65535 row tiles; split the product");
  cudaStream_t s = native(stream);
  if (plan.splits == 1) {
    p.c = c.raw_data(), p.ldc = n, p.out = out;
    p.pair_c =
        reinterpret_cast<std::uintptr_t>(p.c) % (2 * dtype_size(c.dtype())) == 0 && n % 2 == 0;
    p.k_per_split = p.k, p.split_stride = 0;
    kernel<<<grid, kThreads, 0, s>>>(p);
    TL_CUDA_CHECK_LAUNCH();
    return;
  }
  // The partials hold the raw sums; the reduction applies alpha, beta and C's dtype.
  const std::int64_t count = m * n;
  Scratch partial(stream, static_cast<std::size_t>(plan.splits * count) * sizeof(float));
  p.alpha = 1.0f, p.beta = 0.0f;
  p.c = partial.as<float>(), p.ldc = n, p.out = OutType::Float32, p.pair_c = n % 2 == 0;
  p.k_per_split = plan.k_per_split, p.split_stride = count;
  kernel<<<grid, kThreads, 0, s>>>(p);
  TL_CUDA_CHECK_LAUNCH();
  split_reduce(partial.as<float>(), count, plan.splits,
               TcSplitEpilogue{c.raw_data(), n, p.n, alpha, beta, out}, stream);
}

}  // namespace

void gemm_16bit(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a,
                bool transpose_b, float alpha, float beta, const Stream& stream) {
  if (a.dtype() == DType::BFloat16) {
    gemm_tc<TcInput::BFloat16>(c, a, b, transpose_a, transpose_b, alpha, beta, stream);
  } else {
    gemm_tc<TcInput::Float16>(c, a, b, transpose_a, transpose_b, alpha, beta, stream);
  }
}

void gemm_tf32(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a,
               bool transpose_b, float alpha, float beta, const Stream& stream) {
  gemm_tc<TcInput::Tf32>(c, a, b, transpose_a, transpose_b, alpha, beta, stream);
}

}  // namespace towerlab::cuda
