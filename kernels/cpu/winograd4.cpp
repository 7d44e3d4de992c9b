// Winograd F(4x4, 3x3) on the CPU: the forward and backward-data of the wide 3x3
// layers (which ones: f4x4_chosen in kernels/cpu/winograd_choice.cpp), the
// algorithm and its numerics in kernels/cpu/winograd.h. Each 4x4 tile of output
// reads a 6x6 tile of input, and the layer becomes 36 matrix products
//   M[e] = U[e] · V[e]      [K, tiles] = [K, C] · [C, tiles]
// of 36 multiplications per tile and channel pair, 2.25 per output pixel against
// F(2x2, 3x3)'s 4 and im2col's 9. The steps, as F(2x2)'s (kernels/cpu/winograd.cpp):
//   1. weight transform  U[e] = (G g Gᵀ)[e]                 [36][K][C], per call,
//                        eight kernels a vector, each U[e] packed once into the
//                        GEMM's panels (PackedA)
//   2. for each block of tile rows (in parallel, blocks fixed by the shape):
//      input transform   channel by channel: the input rows the block reads copied
//                        into padded planes (zeros around them), then
//                        V[e](c, t) = (Bᵀ d[t,c] B)[e] eight tiles a vector, each
//                        tile's six rows loaded from its own place and transposed
//                        in registers into its columns, written into the GEMM's
//                        panels
//      36 GEMMs          M[e] = U[e] · V[e]                 [K][36][tiles]
//      output transform  eight tiles a vector: Aᵀ m A, transposed back into each
//                        tile's rows of 4 pixels, each written (or added) to its
//                        own place, clipped at the edge
// Eight consecutive tiles of a block share a vector whichever tile rows and images
// they come from (a 7x7 layer has two tiles a tile row).
//
// Bits: every lane does the same operations in the same order, and the transforms
// multiply only by powers of two (5 d is 4 d + d), so fused multiply-adds give the
// bits of separate ones. The AVX2 code serves the AVX2 and AVX-512 GEMMs, whose
// products sum in the same order: the same bits on both; the portable code is the
// same templates in GCC vector extensions beside the portable GEMM, which sums in
// its own order. The blocks depend on the shape alone: the same bits for any thread
// count.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/winograd.h"
#include "kernels/cpu/winograd_tiles.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

using winograd::Problem;

constexpr int kElements = 36;                // of a 6x6 tile
constexpr int kLanes = 8;                    // tiles a vector
constexpr std::int64_t kPrefetchPlanes = 4;  // input channels ahead

// Eight floats, whatever the target: AVX registers in the AVX2 code, SSE pairs in
// the portable code. Every function that takes or returns one is inlined into its
// caller, so no call passes one across the two codes' ABIs (which -Wpsabi warns of).
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float Vec8 __attribute__((vector_size(32)));

typedef float UnalignedVec8 __attribute__((vector_size(32), aligned(4), may_alias));

[[gnu::always_inline]] inline Vec8 load8(const float* p) {
  return *reinterpret_cast<const UnalignedVec8*>(p);
}
[[gnu::always_inline]] inline void store8(float* p, const Vec8& v) {
  *reinterpret_cast<UnalignedVec8*>(p) = v;
}
// Lanes 0-3 from p, 4-7 from q.
[[gnu::always_inline]] inline Vec8 load_halves(const float* p, const float* q) {
  Vec4 lo, hi;
  std::memcpy(&lo, p, sizeof lo);
  std::memcpy(&hi, q, sizeof hi);
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7);
}
// Half `which` (0: lanes 0-3, 1: lanes 4-7) of v.
[[gnu::always_inline]] inline Vec4 half(const Vec8& v, int which) {
  return which == 0 ? __builtin_shufflevector(v, v, 0, 1, 2, 3)
                    : __builtin_shufflevector(v, v, 4, 5, 6, 7);
}

// The 4x4 transposes within each half of a vector (unpcklps, unpckhps, shufps).
[[gnu::always_inline]] inline Vec8 unpack_lo(const Vec8& a, const Vec8& b) {
  return __builtin_shufflevector(a, b, 0, 8, 1, 9, 4, 12, 5, 13);
}
[[gnu::always_inline]] inline Vec8 unpack_hi(const Vec8& a, const Vec8& b) {
  return __builtin_shufflevector(a, b, 2, 10, 3, 11, 6, 14, 7, 15);
}
[[gnu::always_inline]] inline Vec8 low_pairs(const Vec8& a, const Vec8& b) {
  return __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13);
}
[[gnu::always_inline]] inline Vec8 high_pairs(const Vec8& a, const Vec8& b) {
  return __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15);
}

// col[j] lane l = p[l][at + j] for eight tiles' rows of four floats (p[l] any
// address): tiles l and l + 4 loaded into one vector's halves, then transposed in
// each half. Only the first `Cols` columns are made.
template <int Cols>
[[gnu::always_inline]] inline void tile_columns(const float* const (&p)[kLanes], std::int64_t at,
                                                Vec8 (&col)[Cols]) {
  const Vec8 r0 = load_halves(p[0] + at, p[4] + at), r1 = load_halves(p[1] + at, p[5] + at);
  const Vec8 r2 = load_halves(p[2] + at, p[6] + at), r3 = load_halves(p[3] + at, p[7] + at);
  const Vec8 a = unpack_lo(r0, r1), c = unpack_lo(r2, r3);
  col[0] = low_pairs(a, c);
  col[1] = high_pairs(a, c);
  if constexpr (Cols > 2) {
    const Vec8 b = unpack_hi(r0, r1), d = unpack_hi(r2, r3);
    col[2] = low_pairs(b, d);
    col[3] = high_pairs(b, d);
  }
}

// The inverse: rows[l] holds lane l's four columns in its low half and lane l + 4's
// in its high half.
[[gnu::always_inline]] inline void tile_rows(const Vec8 (&col)[4], Vec8 (&rows)[4]) {
  const Vec8 a = unpack_lo(col[0], col[1]), b = unpack_hi(col[0], col[1]);
  const Vec8 c = unpack_lo(col[2], col[3]), d = unpack_hi(col[2], col[3]);
  rows[0] = low_pairs(a, c);
  rows[1] = high_pairs(a, c);
  rows[2] = low_pairs(b, d);
  rows[3] = high_pairs(b, d);
}

// d <- Bᵀ d on a column of 6 (or d B on a row), one tile per lane:
//   Bᵀ = [4  0 -5  0  1  0]
//        [0 -4 -4  1  1  0]
//        [0  4 -4 -1  1  0]
//        [0 -2 -1  2  1  0]
//        [0  2 -1 -2  1  0]
//        [0  4  0 -5  0  1]
// Products by powers of two only (exact), so a contracted multiply-add rounds as
// the separate add does.
template <typename V>
[[gnu::always_inline]] inline void apply_bt(V& d0, V& d1, V& d2, V& d3, V& d4, V& d5) {
  const V s = d4 - 4.0f * d2, t = d3 - 4.0f * d1;
  const V u = d4 - d2, w = 2.0f * (d3 - d1);
  const V v0 = (s - d2) + 4.0f * d0;
  const V v5 = ((d5 - 4.0f * d3) - d3) + 4.0f * d1;
  d0 = v0;
  d1 = s + t;
  d2 = s - t;
  d3 = u + w;
  d4 = u - w;
  d5 = v5;
}

// (o0..o3) = Aᵀ (m0..m5), one tile per lane:
//   Aᵀ = [1  1  1  1  1  0]
//        [0  1 -1  2 -2  0]
//        [0  1  1  4  4  0]
//        [0  1 -1  8 -8  1]
template <typename V>
[[gnu::always_inline]] inline void apply_at(const V& m0, const V& m1, const V& m2, const V& m3,
                                            const V& m4, const V& m5, V& o0, V& o1, V& o2, V& o3) {
  const V a = m1 + m2, b = m1 - m2, c = m3 + m4, d = m3 - m4;
  o0 = (m0 + a) + c;
  o1 = b + 2.0f * d;
  o2 = a + 4.0f * c;
  o3 = (b + 8.0f * d) + m5;
}

// (o0..o5) = G (g0, g1, g2), one kernel a lane of V (or V = float: one kernel):
//   G = [ 1/4     0     0 ]
//       [-1/6  -1/6  -1/6 ]
//       [-1/6   1/6  -1/6 ]
//       [1/24  1/12   1/6 ]
//       [1/24 -1/12   1/6 ]
//       [ 0      0     1  ]
// The products by 1/6 come last, after no add (a contracted multiply-add can only
// fold in an exact product by a power of two): the same bits in any lane width.
template <typename V>
[[gnu::always_inline]] inline void apply_g(const V& g0, const V& g1, const V& g2, V (&o)[6]) {
  constexpr float kSixth = 1.0f / 6.0f;
  o[0] = 0.25f * g0;
  o[1] = -(g0 + g1 + g2) * kSixth;
  o[2] = -(g0 - g1 + g2) * kSixth;
  o[3] = (0.25f * g0 + 0.5f * g1 + g2) * kSixth;
  o[4] = (0.25f * g0 - 0.5f * g1 + g2) * kSixth;
  o[5] = g2;
}

// u[e] = (G g Gᵀ)[e] for a 3x3 kernel g, one a lane: G along the columns, then the rows.
template <typename V>
[[gnu::always_inline]] inline void transform_kernel(V (&u)[kElements], const V (&g)[3][3]) {
  V gg[6][3];  // G g
  for (int s = 0; s < 3; ++s) {
    V column[6];
    apply_g(g[0][s], g[1][s], g[2][s], column);
    for (int i = 0; i < 6; ++i) gg[i][s] = column[i];
  }
  for (int i = 0; i < 6; ++i) {
    V out[6];
    apply_g(gg[i][0], gg[i][1], gg[i][2], out);
    for (int j = 0; j < 6; ++j) u[i * 6 + j] = out[j];
  }
}

// u[e * stride + l] = (G g_l Gᵀ)[e] for the kernels l < count, kernel l's tap (r, s)
// at g[l * step + r * row + s * col]: eight kernels a vector, the rest one by one.
template <typename V>
[[gnu::always_inline]] inline void transform_kernels(float* u, std::int64_t stride, const float* g,
                                                     std::int64_t step, std::int64_t row,
                                                     std::int64_t col, std::int64_t count) {
  std::int64_t l = 0;
  for (; l + kLanes <= count; l += kLanes) {
    V taps[3][3], out[kElements];
    for (int r = 0; r < 3; ++r) {
      for (int t = 0; t < 3; ++t) {
        for (int lane = 0; lane < kLanes; ++lane) {
          taps[r][t][lane] = g[(l + lane) * step + r * row + t * col];
        }
      }
    }
    transform_kernel(out, taps);
    for (int e = 0; e < kElements; ++e) store8(u + e * stride + l, out[e]);
  }
  for (; l < count; ++l) {
    float taps[3][3], out[kElements];
    for (int r = 0; r < 3; ++r) {
      for (int t = 0; t < 3; ++t) taps[r][t] = g[l * step + r * row + t * col];
    }
    transform_kernel(out, taps);
    for (int e = 0; e < kElements; ++e) u[e * stride + l] = out[e];
  }
}

void transform_kernels_portable(float* u, std::int64_t stride, const float* g, std::int64_t step,
                                std::int64_t row, std::int64_t col, std::int64_t count) {
  transform_kernels<Vec8>(u, stride, g, step, row, col, count);
}

#if TL_CPU_X86
__attribute__((target("avx2,fma"))) void transform_kernels_avx2(float* u, std::int64_t stride,
                                                                const float* g, std::int64_t step,
                                                                std::int64_t row, std::int64_t col,
                                                                std::int64_t count) {
  transform_kernels<Vec8>(u, stride, g, step, row, col, count);
}
#endif

// Step 1: U[e] [rows][count] `stride` apart, row q's kernels at g + q * row_step
// (see transform_kernels), on the ISA whose GEMM multiplies them.
void transform_weights(float* u, std::int64_t stride, const float* g, std::int64_t rows,
                       std::int64_t row_step, std::int64_t step, std::int64_t row, std::int64_t col,
                       std::int64_t count) {
  auto* transform = &transform_kernels_portable;
#if TL_CPU_X86
  if (avx2_selected()) transform = &transform_kernels_avx2;  // the AVX2 or AVX-512 GEMM
#endif
  for (std::int64_t q = 0; q < rows; ++q) {
    transform(u + q * count, stride, g + q * row_step, step, row, col, count);
  }
}

// Tile blocks are runs of whole tile rows, about enough that V and M of one block
// (36 (C + K) floats a tile) take three quarters of a 512 KiB L2, but at least 64
// tiles: the 64-channel layers' 20 left the GEMMs narrow and ran slower. A function
// of the shape alone.
std::int64_t tile_rows_per_block(const Problem& p) {
  constexpr std::int64_t kBlockBytes = 384 * 1024;
  constexpr std::int64_t kMinBlockTiles = 64;
  const std::int64_t tiles = std::max<std::int64_t>(
      kMinBlockTiles, kBlockBytes / (kElements * (p.C + p.K) * std::int64_t{sizeof(float)}));
  return std::max<std::int64_t>(1, tiles / p.tiles_w);
}

// Where one tile of a block reads and writes: its 6x6 input at planes + in (row i
// at + i * width), its output pixel (i, j) at out + k * P * Q + i * Q + j for the
// output channel k, of which rows x cols lie inside the output (0 x 0 for the
// lanes past a block's last tile).
struct TileAt {
  std::int64_t in, out;
  int rows, cols;
};

// One thread's scratch for blocks of up to `block` tiles (a multiple of kLanes) and
// `slots` images. The padded planes hold one input channel of the block's images,
// each at (pad_h, pad_w) in its [height][width], zeros around it.
struct Workspace {
  float* v;       // [36][v_stride]: V in the GEMM's panels
  float* m;       // [K][36][block]: the 36 products
  float* planes;  // [2][slots][height][width]: two channels' planes
  TileAt* tiles;  // [block]
  std::int64_t block, v_stride, slots, height, width;

  float* m_at(std::int64_t k, int e) const { return m + (k * kElements + e) * block; }
  std::int64_t ld() const { return kElements * block; }
  // Channel c's padded planes (two channels' in turn).
  float* planes_of(std::int64_t c) const { return planes + (c % 2) * slots * height * width; }
};

// dst[0 .. count) = src[0 .. count), inlined into the transform's code.
[[gnu::always_inline]] inline void copy_row(float* dst, const float* src, std::int64_t count) {
  std::int64_t x = 0;
  for (; x + 8 <= count; x += 8) store8(dst + x, load8(src + x));
  for (; x < count; ++x) dst[x] = src[x];
}

// The block of tile rows [row0, row1) (row = n * tiles_h + th): where each tile
// reads and writes.
void place_tiles(const Workspace& ws, const Problem& p, std::int64_t row0, std::int64_t row1) {
  const std::int64_t tiles = (row1 - row0) * p.tiles_w, n0 = row0 / p.tiles_h;
  for (std::int64_t t = 0; t < (tiles + kLanes - 1) / kLanes * kLanes; ++t) {
    const std::int64_t last = std::min(t, tiles - 1);
    const std::int64_t row = row0 + last / p.tiles_w, tw = last % p.tiles_w;
    const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
    ws.tiles[t] = {(n - n0) * ws.height * ws.width + 4 * th * ws.width + 4 * tw,
                   n * p.K * p.P * p.Q + 4 * th * p.Q + 4 * tw,
                   t < tiles ? static_cast<int>(std::min<std::int64_t>(4, p.P - 4 * th)) : 0,
                   t < tiles ? static_cast<int>(std::min<std::int64_t>(4, p.Q - 4 * tw)) : 0};
  }
}

// The input rows that the tiles of tile rows [row0, row1) read of channel c,
// copied into its padded planes.
[[gnu::always_inline]] inline void copy_channel(const Workspace& ws, const float* in,
                                                const Problem& p, std::int64_t row0,
                                                std::int64_t row1, std::int64_t c) {
  const std::int64_t n0 = row0 / p.tiles_h, n1 = (row1 - 1) / p.tiles_h;
  float* planes = ws.planes_of(c);
  for (std::int64_t n = n0; n <= n1; ++n) {
    // The image's tile rows in the block, and the input rows they read.
    const std::int64_t th0 = n == n0 ? row0 % p.tiles_h : 0;
    const std::int64_t th1 = n == n1 ? (row1 - 1) % p.tiles_h : p.tiles_h - 1;
    const std::int64_t h0 = std::max<std::int64_t>(0, 4 * th0 - p.pad_h);
    const std::int64_t h1 = std::min<std::int64_t>(p.H, 4 * th1 + 6 - p.pad_h);
    const float* plane = in + (n * p.C + c) * p.H * p.W;
    float* padded = planes + ((n - n0) * ws.height + p.pad_h) * ws.width + p.pad_w;
    for (std::int64_t h = h0; h < h1; ++h) copy_row(padded + h * ws.width, plane + h * p.W, p.W);
    // The same rows kPrefetchPlanes channels on, asked for now: each plane is a new
    // stretch of memory whose few short rows the hardware prefetcher does not see
    // coming (as in F(2x2)'s transforms, kernels/cpu/winograd_steps.h).
    if (c + kPrefetchPlanes < p.C && h1 > h0) {
      const float* ahead = plane + kPrefetchPlanes * p.H * p.W;
      for (std::int64_t x = h0 * p.W; x < h1 * p.W; x += 16) __builtin_prefetch(ahead + x);
      __builtin_prefetch(ahead + h1 * p.W - 1);
    }
  }
}

// V of channel c for the tiles of tile rows [row0, row1) from its padded planes,
// eight tiles a vector, each tile's rows loaded from its own place. Channel c + 1
// is copied into the other planes first: the loads here then find the copy's
// stores of channel c long done (a load of four floats that two of those stores
// wrote, straight after them, waits for both; bench/results/winograd4_cpu_5011002.md).
template <typename V>
[[gnu::always_inline]] inline void transform_input_channel(const Workspace& ws,
                                                           const GemmBPanels& panels,
                                                           const float* in, const Problem& p,
                                                           std::int64_t row0, std::int64_t row1,
                                                           std::int64_t c) {
  if (c + 1 < p.C) copy_channel(ws, in, p, row0, row1, c + 1);
  const float* planes = ws.planes_of(c);
  const std::int64_t tiles = (row1 - row0) * p.tiles_w;
  for (std::int64_t t0 = 0; t0 < tiles; t0 += kLanes) {
    const float* base[kLanes];
    for (int l = 0; l < kLanes; ++l) base[l] = planes + ws.tiles[t0 + l].in;
    V d[6][6];  // d[i][j]: element (i, j) of the eight tiles
    for (int i = 0; i < 6; ++i) {
      V left[4], right[2];
      tile_columns(base, i * ws.width, left);
      tile_columns(base, i * ws.width + 4, right);
      V r[6] = {left[0], left[1], left[2], left[3], right[0], right[1]};
      apply_bt(r[0], r[1], r[2], r[3], r[4], r[5]);  // the row: d B
      for (int j = 0; j < 6; ++j) d[i][j] = r[j];
    }
    const std::int64_t at = panels.at(c, t0);  // eight tiles side by side in a panel
    for (int j = 0; j < 6; ++j) {
      apply_bt(d[0][j], d[1][j], d[2][j], d[3][j], d[4][j], d[5][j]);  // the column: Bᵀ .
      for (int i = 0; i < 6; ++i) store8(ws.v + (6 * i + j) * ws.v_stride + at, d[i][j]);
    }
  }
}

// One tile's row of 4 output pixels, `cols` of them inside the output: y = b + v,
// or y += v when `accumulate`; a 16-bit Out (a forward's y, assigned) rounds each
// value once as it is stored.
template <typename Out>
[[gnu::always_inline]] inline void write_pixels(Out* y, const Vec4& v, float b, bool accumulate,
                                                int cols) {
  if constexpr (std::is_same_v<Out, float>) {
    if (cols == 4) {
      Vec4 base;
      if (accumulate) {
        std::memcpy(&base, y, sizeof base);
      } else {
        base = Vec4{b, b, b, b};
      }
      const Vec4 sum = base + v;
      std::memcpy(y, &sum, sizeof sum);
      return;
    }
    for (int x = 0; x < cols; ++x) y[x] = accumulate ? y[x] + v[x] : b + v[x];
  } else {
    static_assert(std::is_same_v<Out, bfloat16>, "a float16 y goes through float32 sums");
    // Four lanes at once (the scalar conversion, a branch a value, took most of a
    // bfloat16 layer's output transform); the same bits.
    round_store_first4(y, Vec4{b, b, b, b} + v, cols);
  }
}

// The output of output channel k for the tiles of tile rows [row0, row1) from M:
// out = bias + Aᵀ m A, or out += Aᵀ m A when `accumulate`, eight tiles a vector,
// each tile's rows of four pixels written to its own place, clipped at the edge.
template <typename Out, typename V>
[[gnu::always_inline]] inline void transform_output_channel(const Workspace& ws, Out* out,
                                                            const float* bias, bool accumulate,
                                                            const Problem& p, std::int64_t row0,
                                                            std::int64_t row1, std::int64_t k) {
  const std::int64_t tiles = (row1 - row0) * p.tiles_w;
  const float* mk = ws.m_at(k, 0);
  const float b = bias != nullptr ? bias[k] : 0.0f;
  Out* plane = out + k * p.P * p.Q;
  for (std::int64_t t0 = 0; t0 < tiles; t0 += kLanes) {
    V t[4][6];  // Aᵀ m: row i, column j
    for (int j = 0; j < 6; ++j) {
      V m[6];
      for (int r = 0; r < 6; ++r) m[r] = load8(mk + (6 * r + j) * ws.block + t0);
      apply_at(m[0], m[1], m[2], m[3], m[4], m[5], t[0][j], t[1][j], t[2][j], t[3][j]);
    }
    V rows[4][4];  // output row i of lane l in rows[i][l % 4]'s half l / 4
    for (int i = 0; i < 4; ++i) {
      V o[4];  // (Aᵀ m A)[i][j]
      apply_at(t[i][0], t[i][1], t[i][2], t[i][3], t[i][4], t[i][5], o[0], o[1], o[2], o[3]);
      tile_rows(o, rows[i]);
    }
    for (int l = 0; l < kLanes; ++l) {  // tile by tile: a whole one without a test a row
      const TileAt& at = ws.tiles[t0 + l];
      Out* y = plane + at.out;
      if (at.rows == 4 && at.cols == 4) {
        for (int i = 0; i < 4; ++i)
          write_pixels(y + i * p.Q, half(rows[i][l % 4], l / 4), b, accumulate, 4);
      } else {
        for (int i = 0; i < at.rows; ++i) {
          write_pixels(y + i * p.Q, half(rows[i][l % 4], l / 4), b, accumulate, at.cols);
        }
      }
    }
  }
}

// Steps 2 for the tile rows [row0, row1), u the 36 packed U[e] [K][C].
template <typename Out, typename V>
[[gnu::always_inline]] inline void run_block(Out* out, const float* in,
                                             const std::vector<PackedA>& u, const float* bias,
                                             bool accumulate, const Problem& p, std::int64_t row0,
                                             std::int64_t row1, const Workspace& ws) {
  GemmBPanels panels = u[0].b_panels((row1 - row0) * p.tiles_w);
  panels.n = panels.panels() * panels.width;  // whole panels: columns past the tiles unread
  place_tiles(ws, p, row0, row1);
  copy_channel(ws, in, p, row0, row1, 0);
  for (std::int64_t c = 0; c < p.C; ++c) {
    transform_input_channel<V>(ws, panels, in, p, row0, row1, c);
  }
  for (int e = 0; e < kElements; ++e) {
    gemm_packed(u[e], panels, ws.v + e * ws.v_stride, 0.0f, ws.m_at(0, e), ws.ld());
  }
  for (std::int64_t k = 0; k < p.K; ++k) {
    transform_output_channel<Out, V>(ws, out, bias, accumulate, p, row0, row1, k);
  }
}

template <typename Out>
void run_blocks_portable(Out* out, const float* in, const std::vector<PackedA>& u,
                         const float* bias, bool accumulate, const Problem& p, std::int64_t row0,
                         std::int64_t row1, const Workspace& ws) {
  run_block<Out, Vec8>(out, in, u, bias, accumulate, p, row0, row1, ws);
}

#if TL_CPU_X86
template <typename Out>
__attribute__((target("avx2,fma,f16c"))) void run_blocks_avx2(
    Out* out, const float* in, const std::vector<PackedA>& u, const float* bias, bool accumulate,
    const Problem& p, std::int64_t row0, std::int64_t row1, const Workspace& ws) {
  run_block<Out, Vec8>(out, in, u, bias, accumulate, p, row0, row1, ws);
}
#endif

// Steps 2 over all tile rows, u_matrices the 36 U[e] [K][C] `stride` apart (36
// arrays written side by side: spread_stride keeps them in different cache sets), in
// blocks spread over the caller's threads (each block writes its own output rows).
template <typename Out>
void run(Out* out, const float* in, const float* u_matrices, std::int64_t stride, const float* bias,
         bool accumulate, const Problem& p) {
  std::vector<PackedA> u;
  u.reserve(kElements);
  for (int e = 0; e < kElements; ++e) u.emplace_back(u_matrices + e * stride, p.C, p.K, p.C);
  const std::int64_t per_block = tile_rows_per_block(p);
  GemmBPanels whole = u[0].b_panels(per_block * p.tiles_w);
  whole.n = (whole.panels() * whole.width + kLanes - 1) / kLanes * kLanes;
  const std::int64_t v_stride = winograd::spread_stride(whole.floats());
  const std::int64_t height = 4 * p.tiles_h + 2, width = 4 * p.tiles_w + 4;
  const std::int64_t slots = per_block / p.tiles_h + 2;  // images a block's rows touch
  const std::int64_t v_floats = kElements * v_stride, m_floats = kElements * p.K * whole.n;
  const std::int64_t plane_floats = 2 * slots * height * width;
  const std::int64_t all_rows = p.N * p.tiles_h, blocks = (all_rows + per_block - 1) / per_block;
  const bool portable = whole.isa == GemmIsa::Portable;
  parallel_rows(
      blocks, whole.n * kElements * (p.C + p.K), [&](std::int64_t first, std::int64_t last) {
        HostScratch<float> scratch(v_floats + m_floats + plane_floats);
        std::vector<TileAt> tiles(static_cast<std::size_t>(whole.n));
        // V's columns past a block's tiles stay finite, and the planes' padding zero.
        std::fill(scratch.get(), scratch.get() + v_floats, 0.0f);
        float* planes = scratch.get() + v_floats + m_floats;
        std::fill(planes, planes + plane_floats, 0.0f);
        const Workspace ws{scratch.get(), scratch.get() + v_floats,
                           planes,        tiles.data(),
                           whole.n,       v_stride,
                           slots,         height,
                           width};
        for (std::int64_t b = first; b < last; ++b) {
          const std::int64_t row0 = b * per_block, row1 = std::min(all_rows, (b + 1) * per_block);
#if TL_CPU_X86
          if (!portable) {
            run_blocks_avx2(out, in, u, bias, accumulate, p, row0, row1, ws);
            continue;
          }
#endif
          run_blocks_portable(out, in, u, bias, accumulate, p, row0, row1, ws);
        }
      });
}

}  // namespace

template <typename Out>
void winograd4_forward(Out* y, const float* x, const float* weight, const float* bias,
                       const Conv2dShape& s) {
  const Problem p =
      winograd::make_problem(s.N, s.C, s.H, s.W, s.K, s.params.pad_h, s.params.pad_w, 4);
  const std::int64_t stride = winograd::spread_stride(s.K * s.C);
  HostScratch<float> u(kElements * stride);  // U[e] [K][C] at e * stride
  // Row k: the kernels weight[k, c], c a lane.
  transform_weights(u.get(), stride, weight, s.K, s.C * 9, 9, 3, 1, s.C);
  if constexpr (std::is_same_v<Out, float16>) {
    // float16 has no four-lane rounding in portable vector arithmetic (bfloat16's is
    // a shift): the float32 sums, then the vector conversions over the whole y, the
    // same bits. Rounded one value at a time in the output transform, a float16 y was
    // the slowest part of the layer (bench/results/precision_fp16_zen5_*.md).
    const std::int64_t n = s.N * s.K * s.P * s.Q;
    HostScratch<float> sums(n);  // [N,K,P,Q]
    run(sums.get(), x, u.get(), stride, bias, false, p);
    round_to_16bit(y, sums.get(), n);
  } else {
    run(y, x, u.get(), stride, bias, false, p);
  }
}

void winograd4_backward_data(float* grad_x, const float* grad_y, const float* weight,
                             const Conv2dShape& s, bool accumulate) {
  // The correlation of grad_y, padded by 2 - pad, with weight[k,c] turned 180
  // degrees, input and output channels swapped (kernels/cpu/winograd.h).
  const Problem p =
      winograd::make_problem(s.N, s.K, s.P, s.Q, s.C, 2 - s.params.pad_h, 2 - s.params.pad_w, 4);
  const std::int64_t stride = winograd::spread_stride(s.C * s.K);
  HostScratch<float> u(kElements * stride);  // U[e] [C][K] at e * stride
  // Row c: the kernels weight[k, c], k a lane, turned: g(r,s) = weight[k,c,2-r,2-s]
  // starts at the last tap and steps backwards.
  transform_weights(u.get(), stride, weight + 8, s.C, 9, s.C * 9, -3, -1, s.K);
  run(grad_x, grad_y, u.get(), stride, nullptr, accumulate, p);
}

template void winograd4_forward<float>(float*, const float*, const float*, const float*,
                                       const Conv2dShape&);
template void winograd4_forward<bfloat16>(bfloat16*, const float*, const float*, const float*,
                                          const Conv2dShape&);
template void winograd4_forward<float16>(float16*, const float*, const float*, const float*,
                                         const Conv2dShape&);

}  // namespace towerlab::cpu
