// CUDA GEMM (contracts in kernels/matmul.h), float32, checked against the CPU
// GEMM. towerlab's own kernel is the default; cuBLAS (TF32 off) is the reference
// and a selectable alternative (set_gemm_backend).
//
// Large products run gemm_wide_kernel (kernels/cuda/matmul_wide.cuh): 128x256
// tiles, 8x16 outputs a thread, one block per SM, the shape of cuBLAS's own FP32
// kernel on Hopper. An operand that kernel would have to transpose on its way
// into shared memory is transposed into scratch first where that pays (staging,
// below). The rest run gemm_kernel, below.
// gemm_kernel is the classic SIMT tiling, in two tile shapes (TileShape). A block
// of 256 threads computes a 128x128 tile of C stepping through K 8 at a time, or
// a 64x64 tile stepping 16 at a time. Each step, the block stages a [step x tile]
// slice of op(A) and of op(B) in shared memory, k-major, so that a thread reads
// its values of A and B for one k with float4 loads and does 64 FMAs (an 8x8
// micro-tile of C in registers) or 16 (4x4).
// How the slices get there (gemm_kernel): a ring of shared buffers, with the
// next slices in flight while one is computed on. An operand whose global layout
// already is the slice's (A transposed, B not: 4 consecutive floats of a tile
// row per thread) is copied global -> shared with cp.async (cuda_pipeline.h),
// 16 bytes a thread, 4-byte copies at a ragged edge or on a misaligned operand;
// it costs no registers and no shared stores. An operand that must be transposed
// into the k-major slice (A not transposed, B transposed) cannot be: cp.async
// copies bytes as they lie. It is loaded into registers at the top of a step and
// stored transposed at the bottom. (Keeping it untransposed in shared memory
// would need 4 k of it in registers at once: 32 more registers than the 128 that
// two blocks of the 128 tile per SM allow.) Three stages (two slices ahead),
// except the 128 tile with a register operand (NN, NT, TT): two stages, as a
// third one there made ptxas spill.
// ptxas for sm_90: 128x128: 127-128 registers per thread, no spills, 24.75 KiB
// of shared memory per block for TN (three stages), 16.5 KiB for the others, two
// blocks per SM; 64x64: 63-64 registers, no spills, 25.5 KiB, four blocks per SM.
//
// The tile plan (plan_gemm) fills the SMs: 128x256 tiles where they alone give
// every SM a block (4096^3) or do so split along K in one wave (1024^3: 32 tiles
// x 4 splits), 128x128 tiles where those give every SM a block, 64x64 tiles
// where they give at least half the SMs one, and otherwise a split along K.
// Split-K: a product with few tiles of C and a long K (a linear layer's forward,
// [batch,3136] x [3136,128]) cuts K into splits of whole K-steps so that tiles x
// splits gives every SM work; each block writes its split's raw sum into a
// partial buffer, and split_reduce (kernels/cuda/split_reduce.cuh) adds the
// partials in a fixed tree and applies alpha and beta once. The same plan gives
// the same bits every run.
//
// Its speed on a GPU, each layout and size beside cuBLAS (TF32 off):
// bench/results/gpu_h100.md.
#include <cublas_v2.h>
#include <cuda_pipeline.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_wide.cuh"
#include "kernels/cuda/split_reduce.cuh"

namespace towerlab::cuda {

namespace {

using gemm_detail::copy4_async;
using gemm_detail::Fragment;
using gemm_detail::GemmParams;
using gemm_detail::load4;

// Two tile shapes, both 256 threads, each thread loading one float4 of op(A) and
// one of op(B) per K-step (tile x K-step = 1024 floats):
//   128x128, K-step 8:  8x8 micro-tile per thread, for products with enough
//                       tiles to fill the SMs (4096^3: 1024 tiles);
//   64x64,   K-step 16: 4x4 micro-tile, four times the tiles, for mid and small
//                       products (1024^3: 256 tiles where 128x128 gives 64 for
//                       132 SMs; FashionNet's [128,3136] products: 98 tiles).
template <int kTile>
struct TileShape {
  static_assert(kTile == 128 || kTile == 64);
  static constexpr int kK = 1024 / kTile;    // K per shared-memory step
  static constexpr int kMicro = kTile / 16;  // rows (and columns) of C per thread
};
constexpr int kGemmThreads = 256;
static_assert(gemm_detail::WideTile::kThreads == kGemmThreads);
// Rows of the shared slices are padded by 4 floats: the transposing stores (A
// without transpose, B with) then hit distinct banks (at 64 wide, two-way), and
// float4 reads stay 16-byte aligned (132 * 4 = 33 * 16, 68 * 4 = 17 * 16 bytes).
constexpr int kPad = 4;

// Slice of op(X) for k in [k0, k0 + kK) and the block's kTile rows (A) or columns
// (B), zero at and past k_end. `contiguous_k` is true when X is stored with k
// along its rows (A without transpose, B with): kK / 4 threads share a row, each
// reading 4 consecutive k, and the store to shared memory transposes. Otherwise
// kTile / 4 threads share a k, each reading 4 consecutive rows/columns.
template <bool kContiguousK, int kTile>
__device__ __forceinline__ Fragment load_slice(const float* x, std::int64_t ld, int extent,
                                               int k_end, int base, int k0, bool vector) {
  const int t = threadIdx.x;
  if constexpr (kContiguousK) {
    constexpr int kLanes = TileShape<kTile>::kK / 4;
    const int r = base + t / kLanes, p = k0 + (t % kLanes) * 4;
    const int count = r < extent ? k_end - p : 0;
    return load4(x + static_cast<std::int64_t>(r) * ld + p, count, vector);
  } else {
    constexpr int kLanes = kTile / 4;
    const int p = k0 + t / kLanes, r = base + (t % kLanes) * 4;
    const int count = p < k_end ? extent - r : 0;
    return load4(x + static_cast<std::int64_t>(p) * ld + r, count, vector);
  }
}

template <bool kContiguousK, int kTile>
__device__ __forceinline__ void store_slice(float (*slice)[kTile + kPad], const Fragment& f) {
  const int t = threadIdx.x;
  if constexpr (kContiguousK) {
    constexpr int kLanes = TileShape<kTile>::kK / 4;
#pragma unroll
    for (int e = 0; e < 4; ++e) slice[(t % kLanes) * 4 + e][t / kLanes] = f.v[e];
  } else {
    constexpr int kLanes = kTile / 4;
    *reinterpret_cast<float4*>(&slice[t / kLanes][(t % kLanes) * 4]) =
        make_float4(f.v[0], f.v[1], f.v[2], f.v[3]);
  }
}

// The slice of load_slice<false, kTile> (X stored with its rows/columns
// contiguous: A transposed, B not), copied into shared memory with cp.async
// instead of through registers; zero at and past k_end and the extent. A 16-byte
// copy per thread where X allows 16-byte accesses and the 4 floats are in range
// or all out (zero-filled); 4-byte copies at a ragged edge or on a misaligned
// operand (copy4_async, matmul_wide.cuh).
template <int kTile>
__device__ __forceinline__ void copy_slice_async(float (*slice)[kTile + kPad], const float* x,
                                                 std::int64_t ld, int extent, int k_end, int base,
                                                 int k0, bool vector) {
  constexpr int kLanes = kTile / 4;
  const int t = threadIdx.x;
  const int p = k0 + t / kLanes, r = base + (t % kLanes) * 4;
  const int count = p < k_end ? extent - r : 0;
  float* dst = &slice[t / kLanes][(t % kLanes) * 4];
  copy4_async(dst, x + static_cast<std::int64_t>(p) * ld + r, x, count, vector);
}

// acc += the product of one pair of shared slices ([kK][kTile] each, k-major):
// per k, a thread's kMicro values of A and of B in float4 reads, then kMicro^2
// FMAs. Thread (ty, tx) owns rows ty*4 + {0..3} + 64h and columns tx*4 + {0..3}
// + 64h (see gemm_kernel).
template <int kTile>
__device__ __forceinline__ void multiply_slices(
    float (&acc)[TileShape<kTile>::kMicro][TileShape<kTile>::kMicro],
    const float (*slice_a)[kTile + kPad], const float (*slice_b)[kTile + kPad], int ty, int tx) {
  constexpr int kK = TileShape<kTile>::kK, kMicro = TileShape<kTile>::kMicro;
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    float av[kMicro], bv[kMicro];
#pragma unroll
    for (int h = 0; h < kMicro / 4; ++h) {
      const float4 a4 = *reinterpret_cast<const float4*>(&slice_a[kk][ty * 4 + h * 64]);
      const float4 b4 = *reinterpret_cast<const float4*>(&slice_b[kk][tx * 4 + h * 64]);
      av[h * 4] = a4.x, av[h * 4 + 1] = a4.y, av[h * 4 + 2] = a4.z, av[h * 4 + 3] = a4.w;
      bv[h * 4] = b4.x, bv[h * 4 + 1] = b4.y, bv[h * 4 + 2] = b4.z, bv[h * 4 + 3] = b4.w;
    }
#pragma unroll
    for (int i = 0; i < kMicro; ++i) {
#pragma unroll
      for (int j = 0; j < kMicro; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
}

// C = alpha * acc + beta * C for the thread's micro-tile of the block's tile at
// (m0, n0), clipped to [M, N] (store4, matmul_wide.cuh).
template <int kTile>
__device__ __forceinline__ void store_tile(
    const GemmParams& p, float* c,
    const float (&acc)[TileShape<kTile>::kMicro][TileShape<kTile>::kMicro], int m0, int n0, int ty,
    int tx) {
  constexpr int kMicro = TileShape<kTile>::kMicro;
#pragma unroll
  for (int i = 0; i < kMicro; ++i) {
    const int row = m0 + ty * 4 + (i % 4) + (i / 4) * 64;
    if (row >= p.m) continue;
#pragma unroll
    for (int half = 0; half < kMicro / 4; ++half) {
      store4(p, c, row, n0 + tx * 4 + half * 64, &acc[i][half * 4]);
    }
  }
}

// C[m0:m0+kTile, n0:n0+kTile] = alpha * op(A) op(B) + beta * C for one block and
// its split of K, through a kStages-deep ring of shared slices: the slices of
// steps step+1 .. step+kStages-1 are on their way while step is computed on.
// An operand stored with its tile's rows/columns contiguous (A transposed, B
// not) goes global -> shared by cp.async, never through registers, one batch of
// copies per step; an operand that must be transposed on its way into the
// k-major slice (A not transposed, B transposed) cannot be copied by cp.async,
// so it keeps the register path: loaded at the top of a step, stored into the
// buffer of slice step+kStages-1 at the bottom. One __syncthreads per step:
// after it, every thread's copies for this step have landed (each waited for
// its own batch before it), and every thread has finished the previous step,
// whose buffer is the one this step refills.
// Thread (ty, tx) of 16x16 owns rows ty*4 + {0..3} + 64h and columns tx*4 +
// {0..3} + 64h (h < kMicro / 4): split in 64-wide halves so that a warp's float4
// reads of a shared slice cover contiguous addresses. A warp is a 4x8 patch of
// the thread grid (the 8 warps tile it 4 down, 2 across): per k, its float4
// reads of the A slice are 4 addresses and those of the B slice 8, consecutive,
// each read one shared-memory wavefront of 64 and 128 bytes with the lanes that
// share an address served by broadcast. (A 2x16 patch needs 1 + 2 wavefronts; at
// the 64 tile's 16 FMAs per pair of reads that is the difference between 50 %
// and 75 % of the SM's shared-memory bandwidth.)
// The 64 tile's smaller register need (4x4 accumulators) allows 4 blocks per SM.
template <bool kTransposeA, bool kTransposeB, int kTile>
__global__ void __launch_bounds__(kGemmThreads, kTile == 128 ? 2 : 4)
    gemm_kernel(const GemmParams p) {
  constexpr int kK = TileShape<kTile>::kK, kMicro = TileShape<kTile>::kMicro;
  constexpr bool kAContiguousK = !kTransposeA;  // A [M,K]: transposed on its way in
  constexpr bool kBContiguousK = kTransposeB;   // B [N,K]: transposed on its way in
  // Three stages, but two for the 128 tile with an operand in registers: there
  // its 4 registers in flight across the multiply and a third stage's
  // bookkeeping exceed the 128-register cap (ptxas spills 20-36 bytes with
  // three, none with two). The 64 tile fits three stages in 64 registers.
  constexpr int kStages = kTile == 64 || !(kAContiguousK || kBContiguousK) ? 3 : 2;
  __shared__ __align__(16) float slice_a[kStages][kK][kTile + kPad];  // [k][m]
  __shared__ __align__(16) float slice_b[kStages][kK][kTile + kPad];  // [k][n]
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int ty = (warp / 2) * 4 + lane / 8, tx = (warp % 2) * 8 + lane % 8;
  // An empty split (k_begin >= k) has no steps and stores a zero partial.
  const int k_begin = blockIdx.z * p.k_per_split;
  const int k_end = k_begin + max(0, min(p.k_per_split, p.k - k_begin));
  float* c = p.c + blockIdx.z * p.split_stride;
  const int steps = (k_end - k_begin + kK - 1) / kK;

  // Starts slice `step` on its way into buffer `stage`: cp.async, or a register
  // load into `reg` that store_registers puts in place.
  Fragment reg_a, reg_b;
  auto start_slice = [&](int step, int stage) {
    const int k0 = k_begin + step * kK;
    if constexpr (kAContiguousK) {
      reg_a = load_slice<true, kTile>(p.a, p.lda, p.m, k_end, m0, k0, p.vector_a);
    } else {
      copy_slice_async<kTile>(slice_a[stage], p.a, p.lda, p.m, k_end, m0, k0, p.vector_a);
    }
    if constexpr (kBContiguousK) {
      reg_b = load_slice<true, kTile>(p.b, p.ldb, p.n, k_end, n0, k0, p.vector_b);
    } else {
      copy_slice_async<kTile>(slice_b[stage], p.b, p.ldb, p.n, k_end, n0, k0, p.vector_b);
    }
  };
  auto store_registers = [&](int stage) {
    if constexpr (kAContiguousK) store_slice<true, kTile>(slice_a[stage], reg_a);
    if constexpr (kBContiguousK) store_slice<true, kTile>(slice_b[stage], reg_b);
  };

  // Batch s holds slice s's copies (empty past the last step), so that waiting for
  // all but the newest kStages - 2 batches completes exactly the slice to compute.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) {
      start_slice(s, s);
      store_registers(s);
    }
    __pipeline_commit();
  }

  float acc[kMicro][kMicro] = {};
  int read = 0;  // the buffer of slice `step`
  for (int step = 0; step < steps; ++step) {
    __pipeline_wait_prior(kStages - 2);
    __syncthreads();
    // The buffer of slice step + kStages - 1: the one read in step - 1.
    const int write = read == 0 ? kStages - 1 : read - 1;
    const bool more = step + kStages - 1 < steps;
    if (more) start_slice(step + kStages - 1, write);
    __pipeline_commit();
    multiply_slices<kTile>(acc, slice_a[read], slice_b[read], ty, tx);
    if (more) store_registers(write);
    read = read + 1 == kStages ? 0 : read + 1;
  }
  store_tile<kTile>(p, c, acc, m0, n0, ty, tx);
}

// The split-K epilogue: C[i / n, i % n] = alpha * sum + beta * C, where sum is
// element i of op(A) op(B) [M,N] added up from the partials. The same formula
// as the kernel's own epilogue; C is not read when beta == 0.
struct GemmSplitEpilogue {
  float* c;
  std::int64_t ldc;
  int n;
  float alpha, beta;
  __device__ void operator()(std::int64_t i, float sum) const {
    float* out = c + (i / n) * ldc + i % n;
    *out = beta == 0.0f ? alpha * sum : alpha * sum + beta * *out;
  }
};

// How a product is run: the tile (64, 128, or kWideTile for gemm_wide_kernel's
// 128x256), and how K is cut: `splits` ranges
// of k_per_split (a multiple of the tile's K-step, so that every split's slices
// start where the unsplit kernel's would: 16-byte aligned). splits == 1 runs the
// kernel alone, epilogue in place.
struct GemmPlan {
  int tile;
  int splits;
  int k_per_split;
};

// Each split keeps at least 64 of K: 8 steps of the 128 tile (the double-
// buffered loop reaches its stride, and the split's 64 KiB partial tile costs far
// less than its 128x128x64 FMAs), 4 of the 64 tile.
constexpr int kMinSplitK = 64;

// The plan's name for gemm_wide_kernel's 128x256 (M x N) tile.
constexpr int kWideTile = 256;
// A split of the wide tile keeps at least 256 of K: 32 steps, so that the
// pipeline's fill and the partial tile (128 KiB written, read back) stay small
// beside the split's 128x256x256 FMAs.
constexpr int kMinWideSplitK = 256;

int k_step(int tile) {
  if (tile == kWideTile) return gemm_detail::WideTile::kK;
  return tile == 128 ? TileShape<128>::kK : TileShape<64>::kK;
}
int tile_rows(int tile) {
  return tile == kWideTile ? gemm_detail::WideTile::kM : tile;
}
int tile_cols(int tile) {
  return tile == kWideTile ? gemm_detail::WideTile::kN : tile;
}

std::int64_t tile_count(int m, int n, int tile) {
  const int rows = tile_rows(tile), cols = tile_cols(tile);
  return std::int64_t{(m + rows - 1) / rows} * ((n + cols - 1) / cols);
}

GemmPlan split_plan(int tile, std::int64_t tiles, int k, std::int64_t wanted_blocks) {
  const int splits = split_count(tiles, wanted_blocks, k, kMinSplitK);
  if (splits == 1) return {tile, 1, k};
  const int step = k_step(tile);
  const int k_per_split = ((k + splits - 1) / splits + step - 1) / step * step;
  return {tile, (k + k_per_split - 1) / k_per_split, k_per_split};  // rounding may leave fewer
}

// The plan, in order of preference:
// 0. 128x256 tiles (gemm_wide_kernel, one block per SM), unsplit, when they give
//    every SM a block (4096^3: 512 tiles, 3.9 waves of 132), else split along K
//    into as many splits as fit one wave when that gives at least three
//    quarters of the SMs a block (1024^3: 32 tiles x 4 splits of 256 = 128
//    blocks, each at the wide tile's FMA rate, against 256 64x64 blocks at the
//    4x4 micro-tile's);
// 1. 128x128 tiles, unsplit, when they give every SM a block (large products);
// 2. 64x64 tiles, unsplit, when they give at least half the SMs a block: two to
//    four of them share an SM, and no partials or second launch are needed
//    (1024^3: 256 blocks; FashionNet's backward [128,3136] products: 98);
// 3. 128x128 tiles split along K when that reaches half the SMs (512^3: 16
//    tiles x 8 splits);
// 4. otherwise 64x64 tiles split along K for about two blocks per SM (a linear
//    layer's forward, [128,3136] x [3136,128]: 4 tiles x 49 splits).
// A pure function of the shape and the SM count: the emulated GPUs plan for 8 and
// 132 SMs with it.
GemmPlan plan_gemm(int m, int n, int k, int sms) {
  const std::int64_t tiles128 = tile_count(m, n, 128), tiles64 = tile_count(m, n, 64);
  const std::int64_t wide = tile_count(m, n, kWideTile);
  if (wide >= sms) return {kWideTile, 1, k};
  const std::int64_t wide_splits =
      std::min<std::int64_t>({sms / wide, k / kMinWideSplitK, kMaxSplits});
  if (wide_splits >= 2 && 4 * wide * wide_splits >= 3 * std::int64_t{sms}) {
    const int step = gemm_detail::WideTile::kK;
    const int k_per_split =
        static_cast<int>(((k + wide_splits - 1) / wide_splits + step - 1) / step * step);
    return {kWideTile, (k + k_per_split - 1) / k_per_split, k_per_split};
  }
  if (tiles128 >= sms) return {128, 1, k};
  if (2 * tiles64 >= sms) return {64, 1, k};
  const GemmPlan big = split_plan(128, tiles128, k, sms);
  if (2 * tiles128 * big.splits >= sms) return big;
  return split_plan(64, tiles64, k, 2 * std::int64_t{sms});
}

// ---- Staging ---------------------------------------------------------------
// gemm_wide_kernel copies an operand stored k-major (A transposed, B not) into
// shared memory with cp.async; one stored the other way goes through registers
// and a transposing store, which costs issue slots its one block per SM cannot
// hide: on a GPU, NN and NT ran behind TN at 4096^3. Staged, such an operand is
// transposed into k-major scratch by transpose_kernel and the product runs as if it
// were stored that way: the same sums in the same order (the same bits), and NN and
// NT came up to TN's speed at 4096^3 and 2048^3, the transposes included
// (bench/experiments/sgemm_staging.cu; its runs in
// bench/results/gpu_h100_3891b00_staging/).
// The transpose reads and writes the operand once: for A [M,K], 8 M K bytes
// against the product's 2 M N K FLOPs, about 80 / N of the product's time at an
// H100's memory bandwidth and FP32 rate. So an operand is staged only where the other side
// of C is at least kStageMinOther (the smallest size measured), and only up to
// kStageMaxBytes of scratch (the caching allocator's, ordered on the stream).
constexpr int kStageMinOther = 2048;
constexpr std::int64_t kStageMaxBytes = std::int64_t{256} << 20;

// out [cols, ld_out] = in [rows, cols] transposed (in's rows ld_in apart), with
// zeros in out's columns rows..ld_out-1; through a 32x33 shared tile (the odd
// pitch keeps the transposed reads off one bank), 32x8 threads moving 4 values
// each. blockIdx.x runs over out's columns (in's rows), blockIdx.y over in's columns.
__global__ void transpose_kernel(float* __restrict__ out, int ld_out, const float* __restrict__ in,
                                 std::int64_t ld_in, int rows, int cols) {
  __shared__ float tile[32][33];
  const int r0 = static_cast<int>(blockIdx.x) * 32, c0 = static_cast<int>(blockIdx.y) * 32;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (int j = ty; j < 32; j += 8) {
    const int r = r0 + j, c = c0 + tx;
    if (c < cols) tile[j][tx] = r < rows ? in[r * ld_in + c] : 0.0f;
  }
  __syncthreads();
  for (int j = ty; j < 32; j += 8) {
    const int r = r0 + tx, c = c0 + j;
    if (c < cols && r < ld_out) out[std::int64_t{c} * ld_out + r] = tile[tx][j];
  }
}

// Where staging an operand with `rows` rows of length k pays (the other side of C
// being `other`), the staged operand's row pitch (rows rounded up to 4: 16-byte
// rows for cp.async); else 0.
int staged_pitch(int rows, int k, int other) {
  const std::int64_t pitch = (std::int64_t{rows} + 3) / 4 * 4;
  const bool pays = other >= kStageMinOther && k > 0 && pitch * k * 4 <= kStageMaxBytes;
  return pays && pitch <= INT_MAX && (k + 31) / 32 <= 65535 ? static_cast<int>(pitch) : 0;
}

// A scratch copy of the operand [rows, k] (rows ld apart), k-major with row pitch
// `pitch`.
const float* stage(std::optional<Scratch>& staged, const float* operand, std::int64_t ld, int rows,
                   int k, int pitch, const Stream& stream) {
  staged.emplace(stream, static_cast<std::size_t>(k) * pitch * sizeof(float));
  const dim3 grid((pitch + 31) / 32, (k + 31) / 32);
  transpose_kernel<<<grid, dim3(32, 8), 0, native(stream)>>>(staged->as<float>(), pitch, operand,
                                                             ld, rows, k);
  TL_CUDA_CHECK_LAUNCH();
  return staged->as<float>();
}

bool aligned16(const void* p, std::int64_t ld) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && ld % 4 == 0;
}

using GemmKernel = void (*)(GemmParams);

template <int kTile>
GemmKernel pick_kernel(bool transpose_a, bool transpose_b) {
  return transpose_a
             ? (transpose_b ? gemm_kernel<true, true, kTile> : gemm_kernel<true, false, kTile>)
             : (transpose_b ? gemm_kernel<false, true, kTile> : gemm_kernel<false, false, kTile>);
}

GemmKernel pick_kernel(int tile, bool transpose_a, bool transpose_b) {
  if (tile == kWideTile) {
    using gemm_detail::gemm_wide_kernel;
    return transpose_a
               ? (transpose_b ? gemm_wide_kernel<true, true> : gemm_wide_kernel<true, false>)
               : (transpose_b ? gemm_wide_kernel<false, true> : gemm_wide_kernel<false, false>);
  }
  if (tile == 128) return pick_kernel<128>(transpose_a, transpose_b);
  return pick_kernel<64>(transpose_a, transpose_b);
}

// Runs `product` (everything up to ldc set) with `plan`: in place, or split into
// scratch partials [splits, M, N] that split_reduce adds into C.
void gemm_towerlab(bool transpose_a, bool transpose_b, GemmParams product, const GemmPlan& plan,
                   const Stream& stream) {
  const int tile = plan.tile, step = k_step(tile);
  TL_CHECK((tile == kWideTile || tile == 128 || tile == 64) &&
               (plan.splits == 1 ||
                (plan.splits > 1 && plan.splits <= kMaxSplits && plan.k_per_split % step == 0 &&
                 std::int64_t{plan.splits} * plan.k_per_split >= product.k)),
           InvalidArgument,
           "gemm: split plan of " << plan.splits << " x " << plan.k_per_split << " (tile " << tile
                                  << ") does not cover K = " << product.k << " in whole K-steps");
  const int rows = tile_rows(tile), cols = tile_cols(tile);
  const dim3 grid((product.n + cols - 1) / cols, (product.m + rows - 1) / rows, plan.splits);
  TL_CHECK(grid.y <= 65535, InvalidArgument,
           "gemm: M = " << product.m << " needs more than 65535 row tiles; split the product");
  cudaStream_t s = native(stream);
  GemmParams p = product;
  std::optional<Scratch> staged_a, staged_b;  // live until the product is enqueued
  if (tile == kWideTile && plan.splits == 1) {
    if (const int pitch = transpose_a ? 0 : staged_pitch(p.m, p.k, p.n); pitch > 0) {
      p.a = stage(staged_a, p.a, p.lda, p.m, p.k, pitch, stream), p.lda = pitch;
      transpose_a = true;  // A [M,K] now lies as A^T [K,M]
    }
    if (const int pitch = transpose_b ? staged_pitch(p.n, p.k, p.m) : 0; pitch > 0) {
      p.b = stage(staged_b, p.b, p.ldb, p.n, p.k, pitch, stream), p.ldb = pitch;
      transpose_b = false;  // B^T [N,K] now lies as B [K,N]
    }
  }
  const GemmKernel kernel = pick_kernel(tile, transpose_a, transpose_b);
  p.vector_a = aligned16(p.a, p.lda), p.vector_b = aligned16(p.b, p.ldb);
  if (plan.splits == 1) {
    p.k_per_split = p.k, p.split_stride = 0, p.vector_c = aligned16(p.c, p.ldc);
    kernel<<<grid, kGemmThreads, 0, s>>>(p);
    TL_CUDA_CHECK_LAUNCH();
    return;
  }
  const std::int64_t count = std::int64_t{p.m} * p.n;
  Scratch partial(stream, static_cast<std::size_t>(plan.splits * count) * sizeof(float));
  p.alpha = 1.0f, p.beta = 0.0f;  // partials hold the raw sums; the reduction scales them
  p.c = partial.as<float>(), p.ldc = p.n, p.vector_c = aligned16(p.c, p.ldc);
  p.k_per_split = plan.k_per_split, p.split_stride = count;
  kernel<<<grid, kGemmThreads, 0, s>>>(p);
  TL_CUDA_CHECK_LAUNCH();
  split_reduce(partial.as<float>(), count, plan.splits,
               GemmSplitEpilogue{product.c, product.ldc, product.n, product.alpha, product.beta},
               stream);
}

// ---------------------------------------------------------------------------
// cuBLAS: one handle per (thread, device, stream). A handle is then never used
// by two threads at once (cuBLAS handles are not thread-safe), and each stream
// has its own workspace. Handles live until their thread exits.

class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    TL_CUBLAS_CHECK(cublasCreate(&handle_));
    // FP32 as FP32: no TF32 tensor-core shortcut, so cuBLAS computes what our kernel does.
    TL_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    TL_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  }
  ~CublasHandle() {
    if (cublasDestroy(handle_) != CUBLAS_STATUS_SUCCESS) {
      detail::log_cuda_error("cublasDestroy(handle_)", "cuBLAS error", -1, __FILE__, __LINE__);
    }
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

cublasHandle_t cublas_handle(int device, cudaStream_t stream) {
  thread_local std::map<std::pair<int, cudaStream_t>, std::unique_ptr<CublasHandle>> handles;
  auto& slot = handles[{device, stream}];
  if (!slot) slot = std::make_unique<CublasHandle>(stream);
  return slot->get();
}

void gemm_cublas(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                 float* c, std::int64_t ldc, int device, cudaStream_t stream) {
  TL_CHECK(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX, InvalidArgument,
           "gemm: leading dimensions above INT_MAX are not supported by cuBLAS");
  // cuBLAS is column-major: a row-major C [M,N] is a column-major C^T [N,M], and
  // C^T = op(B)^T op(A)^T, so swap the operands and the dimensions.
  // With K = 0 an operand is [M,0] and its leading dimension 0, which cuBLAS
  // rejects although it reads nothing: 1 is as good.
  lda = std::max<std::int64_t>(lda, 1);
  ldb = std::max<std::int64_t>(ldb, 1);
  const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  TL_CUBLAS_CHECK(cublasSgemm(cublas_handle(device, stream), op_b, op_a, n, m, k, &alpha, b,
                              static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c,
                              static_cast<int>(ldc)));
}

}  // namespace

void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
          float beta, float* c, std::int64_t ldc, const Stream& stream) {
  if (m <= 0 || n <= 0) return;
  TL_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, InvalidArgument,
           "gemm: dimensions " << m << "x" << n << "x" << k << " exceed INT_MAX");
  CudaDeviceGuard guard(stream.device().index);
  if (gemm_backend() == GemmBackend::Cublas) {
    gemm_cublas(transpose_a, transpose_b, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, lda, b, ldb, beta, c, ldc, stream.device().index,
                native(stream));
    return;
  }
  GemmParams product{};
  product.m = static_cast<int>(m), product.n = static_cast<int>(n), product.k = static_cast<int>(k);
  product.alpha = alpha, product.a = a, product.lda = lda, product.b = b, product.ldb = ldb;
  product.beta = beta, product.c = c, product.ldc = ldc;
  const GemmPlan plan = plan_gemm(product.m, product.n, product.k, sm_count(stream.device().index));
  gemm_towerlab(transpose_a, transpose_b, product, plan, stream);
}

}  // namespace towerlab::cuda
