// Winograd F(2x2, 3x3) convolution on the CPU: the algorithm, its matrices and its
// numerics in kernels/cpu/winograd.h. The steps, for forward and backward-data alike:
//   1. weight transform  U[e] = (G g Gᵀ)[e]                      [16][K][C], per call,
//                        each U[e] packed once into the GEMM's panels (PackedA)
//   2. for each block of tiles (in parallel, blocks fixed by the shape):
//      input transform   V[e](c, t) = (Bᵀ d[t,c] B)[e]          [16][C, tiles],
//                        each V[e] written in the GEMM's panels of B
//      16 GEMMs          M[e] = U[e] · V[e]                      [K][16][tiles]
//      output transform  out tile (t, k) (+)= Aᵀ m[t,k] A        2x2, clipped at the edge
// Inside this file C and K are the correlation's input and output channels: for
// backward-data they are the layer's K and C, and the input is grad_y. The weight
// gradient is in kernels/cpu/winograd_weight_grad.cpp, the choice of Winograd or
// im2col (set_conv2d_algorithm, winograd_chosen) in kernels/cpu/winograd_choice.cpp.
#include "kernels/cpu/winograd.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/winograd_tiles.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

using namespace winograd;  // kernels/cpu/winograd_tiles.h

// u [4][4] = G g Gᵀ for g [3][3], one kernel a lane of V (or V = float: one kernel).
template <typename V>
[[gnu::always_inline]] inline void transform_kernel(V (&u)[16], const V (&g)[3][3]) {
  V gg[4][3];  // G g
  for (int s = 0; s < 3; ++s) {
    const V g0 = g[0][s], g1 = g[1][s], g2 = g[2][s];
    gg[0][s] = g0;
    gg[1][s] = 0.5f * (g0 + g1 + g2);
    gg[2][s] = 0.5f * (g0 - g1 + g2);
    gg[3][s] = g2;
  }
  for (int i = 0; i < 4; ++i) {
    const V g0 = gg[i][0], g1 = gg[i][1], g2 = gg[i][2];
    u[i * 4 + 0] = g0;
    u[i * 4 + 1] = 0.5f * (g0 + g1 + g2);
    u[i * 4 + 2] = 0.5f * (g0 - g1 + g2);
    u[i * 4 + 3] = g2;
  }
}

// u[e * ldu + l] = (G g_l Gᵀ)[e] for the kernels l < count, kernel l's tap (r, s) at
// g[l * stride + r * row + s * col] (the caller turns the kernels by passing
// negative row and col).
void transform_kernels(float* u, std::int64_t ldu, const float* g, std::int64_t stride,
                       std::int64_t row, std::int64_t col, std::int64_t count) {
  for (std::int64_t l = 0; l < count; ++l) {
    float taps[3][3], out[16];
    for (int r = 0; r < 3; ++r) {
      for (int t = 0; t < 3; ++t) taps[r][t] = g[l * stride + r * row + t * col];
    }
    transform_kernel(out, taps);
    for (int e = 0; e < 16; ++e) u[e * ldu + l] = out[e];
  }
}

#if TL_CPU_X86
// transform_kernels on AVX-512: sixteen kernels a vector, their taps gathered and
// each of their 16 elements stored as one vector, where the scalar loop stores a
// kernel's 16 values into 16 arrays one at a time.
__attribute__((target("avx512f"))) void transform_kernels_avx512(float* u, std::int64_t ldu,
                                                                 const float* g,
                                                                 std::int64_t stride,
                                                                 std::int64_t row, std::int64_t col,
                                                                 std::int64_t count) {
  const __m512i lane =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(stride)));
  for (std::int64_t l0 = 0; l0 < count; l0 += 16) {
    const __mmask16 lanes = first_lanes(count - l0);
    __m512 taps[3][3], out[16];
    for (int r = 0; r < 3; ++r) {
      for (int t = 0; t < 3; ++t) {
        taps[r][t] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, lane,
                                              g + l0 * stride + r * row + t * col, 4);
      }
    }
    transform_kernel(out, taps);
    for (int e = 0; e < 16; ++e) _mm512_mask_storeu_ps(u + e * ldu + l0, lanes, out[e]);
  }
}
#endif

// Step 1 of the file comment: transform_kernels on the selected ISA.
void transform_weight(float* u, std::int64_t ldu, const float* g, std::int64_t stride,
                      std::int64_t row, std::int64_t col, std::int64_t count) {
#if TL_CPU_X86
  if (avx512_selected()) {
    transform_kernels_avx512(u, ldu, g, stride, row, col, count);
    return;
  }
#endif
  transform_kernels(u, ldu, g, stride, row, col, count);
}

// The tiles of a tile row rounded up to whole groups of four, and the padded input
// columns they read (tile tw reads 2*tw .. 2*tw + 3).
std::int64_t vector_tiles(const Problem& p) {
  return (p.tiles_w + 3) / 4 * 4;
}
std::int64_t row_width(const Problem& p) {
  return 2 * vector_tiles(p) + 2;
}

// The input transform of one block of tiles: V[e] [C, tiles] written where the
// GEMM reads its B (PackedA::b_panels), so that the 16 GEMMs pack nothing (the
// copy into panels was a tenth of FashionNet's conv2 forward).
struct BlockInput {
  float* v;             // [16][stride]
  GemmBPanels panels;   // k: C, n: the block's tiles
  std::int64_t stride;  // V[e] to V[e + 1]: spread_stride of the largest block's

  float* of(int e) const { return v + e * stride; }
  // V[e]'s element (c, t).
  float* at(int e, std::int64_t c, std::int64_t t) const { return of(e) + panels.at(c, t); }
};

// The scratch of one thread, for blocks of tiles up to `block` columns (a multiple
// of 16). M keeps each channel's 16 elements together, so that the output
// transform, which goes channel by channel, walks it from start to end; the GEMM of
// element e writes M[e] as a matrix whose rows lie ld() apart.
struct Workspace {
  float* v;     // a BlockInput's V, up to `block` tiles: [16][v_stride]
  float* m;     // [K][16][block]: the 16 products
  float* rows;  // [4][row_width]: the padded input rows one tile row reads
  std::int64_t block, v_stride;

  float* m_at(std::int64_t k, int e) const { return m + (k * 16 + e) * block; }
  std::int64_t ld() const { return 16 * block; }
};

// The floats of one Workspace for blocks of up to `whole.n` tiles, and the Workspace
// laid out in them, with V (see whole_panels) and the rows' padding zeroed.
std::int64_t workspace_floats(const Problem& p, const GemmBPanels& whole) {
  return 16 * spread_stride(whole.floats()) + 16 * p.K * whole.n + 4 * row_width(p);
}
Workspace workspace_in(float* base, const Problem& p, const GemmBPanels& whole) {
  const std::int64_t v_stride = spread_stride(whole.floats());
  float* m = base + 16 * v_stride;
  const Workspace ws{base, m, m + 16 * p.K * whole.n, whole.n, v_stride};
  std::fill(ws.v, ws.m, 0.0f);
  std::fill(ws.rows, ws.rows + 4 * row_width(p), 0.0f);  // the padding
  return ws;
}

// The layout of V for `columns` tiles rounded up to whole panels of the GEMM, which
// then multiplies its last panel whole, without a ragged edge: the columns past the
// tiles hold finite leftovers (zeros at first, then what an earlier block or a tile
// row's last group left), whose products are never read, since a column of M
// depends on its column of V alone.
GemmBPanels whole_panels(const PackedA& u, std::int64_t columns) {
  GemmBPanels panels = u.b_panels(columns);
  panels.n = panels.panels() * panels.width;
  return panels;
}

// The transforms ask for the input rows they will read, and the AVX-512 output
// transform for the output rows it will write, this many channel planes ahead:
// each plane is a new stretch of memory, a few short rows of which the hardware
// prefetcher does not see coming (the stores' misses held up the output transform
// as the loads' did the input's).
constexpr std::int64_t kPrefetchPlanes = 4;

// Asks for the input rows that tile row (n, th) reads of channel c + kPrefetchPlanes.
// Inlined always: as a call from the AVX-512 transform it measured slower
// (docs/kernels.md, "Measured choices").
[[gnu::always_inline]] inline void prefetch_rows(const float* in, const Problem& p, std::int64_t n,
                                                 std::int64_t th, std::int64_t c) {
  if (c + kPrefetchPlanes >= p.C) return;
  const std::int64_t h0 = std::max<std::int64_t>(0, 2 * th - p.pad_h);  // rows [h0, h1)
  const std::int64_t h1 = std::min<std::int64_t>(p.H, 2 * th - p.pad_h + 4);
  if (h0 >= h1) return;
  const float* plane = in + (n * p.C + c + kPrefetchPlanes) * p.H * p.W;  // [H,W]
  for (std::int64_t x = h0 * p.W; x < h1 * p.W; x += 16) __builtin_prefetch(plane + x);
  __builtin_prefetch(plane + h1 * p.W - 1);
}

// V[e](c, first + tw) = (Bᵀ d B)[e] for the tiles tw of tile row (n, th), d their
// 4x4 inputs (zero outside the image). Four tiles at a time in vector lanes: tile
// tw's column j is row element 2*tw + j, so the lanes are the even or odd elements
// of two loads; each tile's values are stored one by one.
void transform_input_row(const Workspace& ws, const BlockInput& v, const float* in,
                         const Problem& p, std::int64_t n, std::int64_t th, std::int64_t first) {
  const std::int64_t width = row_width(p);
  // Valid input columns w = x - pad_w lie at x in [x0, x1) of a padded row.
  const std::int64_t x0 = std::min(width, p.pad_w), x1 = std::min(width, p.W + p.pad_w);
  for (std::int64_t c = 0; c < p.C; ++c) {
    const float* plane = in + (n * p.C + c) * p.H * p.W;  // [H,W]
    prefetch_rows(in, p, n, th, c);
    for (int i = 0; i < 4; ++i) {  // rows[i][x] = x[n, c, 2*th - pad_h + i, x - pad_w]
      // Columns outside [x0, x1) stay zero from run(): only the image's are written.
      float* row = ws.rows + i * width;
      const std::int64_t h = 2 * th - p.pad_h + i;
      if (h < 0 || h >= p.H) {
        for (std::int64_t x = x0; x < x1; ++x) row[x] = 0.0f;
        continue;
      }
      const float* src = plane + h * p.W;  // [W]: input column x - pad_w
      for (std::int64_t x = x0; x < x1; ++x) row[x] = src[x - p.pad_w];
    }
    for (std::int64_t tw = 0; tw < p.tiles_w; tw += 4) {
      Vec4 d[4][4];  // d[i][j]: element (i, j) of tiles tw..tw+3
      for (int i = 0; i < 4; ++i) {
        const float* r = ws.rows + i * width + 2 * tw;
        const Vec4 r0 = load4(r), r4 = load4(r + 4), r2 = load4(r + 2), r6 = load4(r + 6);
        d[i][0] = __builtin_shufflevector(r0, r4, 0, 2, 4, 6);
        d[i][1] = __builtin_shufflevector(r0, r4, 1, 3, 5, 7);
        d[i][2] = __builtin_shufflevector(r2, r6, 0, 2, 4, 6);
        d[i][3] = __builtin_shufflevector(r2, r6, 1, 3, 5, 7);
      }
      transform_input_tile(d);
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) {
          for (std::int64_t l = 0; l < std::min<std::int64_t>(4, p.tiles_w - tw); ++l) {
            *v.at(4 * i + j, c, first + tw + l) = d[i][j][l];
          }
        }
      }
    }
  }
}

#if TL_CPU_X86
// Where a vector of up to eight tiles, starting at the block's tile t, goes in V's
// panels (transform_input_avx2 and _pairs_avx2 below). One store a row of V, unless
// the vector runs past its panel's end: then the lanes that fit go by
// store_first_lanes (a masked store would be slow) and the rest, turned to lanes 0..,
// as a whole vector at the start of the next panel's row.
struct TileVectorStore {
  std::int64_t t;    // the vector's first tile
  std::int64_t fit;  // lanes in t's panel
  bool split;        // the vector runs past its panel's end
  bool spill;        // and some of its tiles lie past it
  __m256i turn;      // lane l <- lane l + fit

  __attribute__((target("avx2")))
  TileVectorStore(const BlockInput& v, std::int64_t first, std::int64_t tiles)
      : t(first),
        fit(v.panels.width - first % v.panels.width),
        split(fit < 8),
        spill(tiles > fit),
        turn(_mm256_and_si256(_mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                               _mm256_set1_epi32(static_cast<int>(fit))),
                              _mm256_set1_epi32(7))) {}

  // The 16 elements d of the tiles' channel c to V[0..15]. Inlined into each caller,
  // the two ways to store kept apart and each unrolled: with the test inside the loop,
  // the compiler kept d in memory and the transform took twice as long.
  __attribute__((target("avx2"), always_inline)) void store(const BlockInput& v, std::int64_t c,
                                                            const __m256 (&d)[4][4]) const {
    float* here = v.v + v.panels.at(c, t);
    if (!split) {
#pragma GCC unroll 16
      for (int e = 0; e < 16; ++e) _mm256_storeu_ps(here + e * v.stride, d[e / 4][e % 4]);
      return;
    }
    for (int e = 0; e < 16; ++e) store_first_lanes(here + e * v.stride, d[e / 4][e % 4], fit);
    if (spill) {
      float* next = v.v + v.panels.at(c, t + fit);
      for (int e = 0; e < 16; ++e) {
        _mm256_storeu_ps(next + e * v.stride, _mm256_permutevar8x32_ps(d[e / 4][e % 4], turn));
      }
    }
  }
};

// The tile rows [row0, row1) of transform_input_row on AVX2: eight tiles a vector
// (a row of FashionNet's 7 tiles is one group). The 18 input columns a group reads
// come straight from the image as four loads, masked where they reach past the image
// (columns outside it read as the padding's zeros), not through a copy of the rows:
// the copy took about as long as the transform.
//
// A group's eight tiles go to V by TileVectorStore (FashionNet's 7 tiles a row start
// at every column of a 16-wide panel in turn, so a group often runs past its
// panel's end). Lanes past the group's tiles (a row's last group) land on later
// tiles, which later groups overwrite, or past the block's.
__attribute__((target("avx2,fma"))) void transform_input_avx2(const BlockInput& v, const float* in,
                                                              const Problem& p, std::int64_t row0,
                                                              std::int64_t row1) {
  // The loads start at columns x0 + kOffset[l] of the group's first input column x0.
  constexpr std::int64_t kOffset[4] = {0, 8, 2, 10};
  for (std::int64_t row = row0; row < row1; ++row) {
    const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
    for (std::int64_t tw = 0; tw < p.tiles_w; tw += 8) {
      const std::int64_t x0 = 2 * tw - p.pad_w;  // negative in the padding
      __m256i mask[4];                           // the lanes whose column lies in [0, W)
      bool whole[4];  // all eight: a plain load (AMD runs the masked one slowly)
      for (int l = 0; l < 4; ++l) {
        const std::int64_t x = x0 + kOffset[l];
        mask[l] = _mm256_andnot_si256(first_lanes8(-x), first_lanes8(p.W - x));
        whole[l] = x >= 0 && x + 8 <= p.W;
      }
      const std::int64_t t = (row - row0) * p.tiles_w + tw;  // the group's first tile
      const TileVectorStore to_v(v, t, std::min<std::int64_t>(8, p.tiles_w - tw));
      for (std::int64_t c = 0; c < p.C; ++c) {
        if (tw == 0) prefetch_rows(in, p, n, th, c);
        const float* plane = in + (n * p.C + c) * p.H * p.W;  // [H,W]
        __m256 d[4][4];  // d[i][j]: element (i, j) of tiles tw..tw+7
        for (int i = 0; i < 4; ++i) {
          const std::int64_t h = 2 * th - p.pad_h + i;
          if (h < 0 || h >= p.H) {
            for (int j = 0; j < 4; ++j) d[i][j] = _mm256_setzero_ps();
            continue;
          }
          const float* src = plane + h * p.W + x0;
          __m256 r[4];
          for (int l = 0; l < 4; ++l) {
            r[l] = whole[l] ? _mm256_loadu_ps(src + kOffset[l])
                            : _mm256_maskload_ps(src + kOffset[l], mask[l]);
          }
          d[i][0] = even_lanes(r[0], r[1]);
          d[i][1] = odd_lanes(r[0], r[1]);
          d[i][2] = even_lanes(r[2], r[3]);
          d[i][3] = odd_lanes(r[2], r[3]);
        }
        transform_input_tile(d);
        to_v.store(v, c, d);
      }
    }
  }
}

// transform_input_avx2 where a tile row has four tiles (ResNet-20's 7x7 stage, Q of
// 7 or 8): two tile rows a vector, row's tiles in lanes 0 .. 3 and row + 1's in lanes
// 4 .. 7, which are the next tiles of the block in V as well; one row a vector left
// half the lanes unused. The even or odd columns of one load of each row make a
// tile column's lanes (where one row took them from two loads of its own). The
// same values for each tile, the same transform: the same bits. A last tile row
// alone fills the other lanes with the transform of zeros, on tiles past the block's
// (as transform_input_avx2's last group of a row does).
__attribute__((target("avx2,fma"))) void transform_input_pairs_avx2(
    const BlockInput& v, const float* in, const Problem& p, std::int64_t row0, std::int64_t row1) {
  // The loads start at columns x0 + kOffset[l] of the rows' first input column x0.
  constexpr std::int64_t kOffset[2] = {0, 2};
  const std::int64_t x0 = -p.pad_w;  // negative in the padding
  __m256i mask[2];                   // the lanes whose column lies in [0, W)
  bool whole[2];                     // all eight: a plain load
  for (int l = 0; l < 2; ++l) {
    const std::int64_t x = x0 + kOffset[l];
    mask[l] = _mm256_andnot_si256(first_lanes8(-x), first_lanes8(p.W - x));
    whole[l] = x >= 0 && x + 8 <= p.W;
  }
  for (std::int64_t row = row0; row < row1; row += 2) {
    const int pair = row + 1 < row1 ? 2 : 1;  // tile rows in this vector
    const std::int64_t t = (row - row0) * 4;  // the first tile
    const TileVectorStore to_v(v, t, 4 * pair);
    std::int64_t n[2], th[2];
    for (int r = 0; r < pair; ++r) n[r] = (row + r) / p.tiles_h, th[r] = (row + r) % p.tiles_h;
    for (std::int64_t c = 0; c < p.C; ++c) {
      for (int r = 0; r < pair; ++r) prefetch_rows(in, p, n[r], th[r], c);
      __m256 d[4][4];  // d[i][j]: element (i, j) of the eight tiles
      for (int i = 0; i < 4; ++i) {
        __m256 cols[2][2];  // [tile row][load]: columns x0 + kOffset[l] .. + 7 of its row i
        for (int r = 0; r < 2; ++r) {
          const std::int64_t h = r < pair ? 2 * th[r] - p.pad_h + i : -1;
          if (h < 0 || h >= p.H) {
            cols[r][0] = cols[r][1] = _mm256_setzero_ps();
            continue;
          }
          const float* src = in + ((n[r] * p.C + c) * p.H + h) * p.W + x0;
          for (int l = 0; l < 2; ++l) {
            cols[r][l] = whole[l] ? _mm256_loadu_ps(src + kOffset[l])
                                  : _mm256_maskload_ps(src + kOffset[l], mask[l]);
          }
        }
        d[i][0] = even_lanes(cols[0][0], cols[1][0]);
        d[i][1] = odd_lanes(cols[0][0], cols[1][0]);
        d[i][2] = even_lanes(cols[0][1], cols[1][1]);
        d[i][3] = odd_lanes(cols[0][1], cols[1][1]);
      }
      transform_input_tile(d);
      to_v.store(v, c, d);
    }
  }
}

// The tile rows [row0, row1) of transform_input_row on AVX-512, sixteen tiles a
// vector taken from the block's run of tiles regardless of the tile rows (as
// transform_output_avx512 does), channel by channel: each tile row's share of the
// lanes, at most eight tiles, picked from two masked loads of each input row (the
// mask stands for the padding), so V's rows are written sixteen tiles, a cache
// line, at a time, never across a panel's end (its width is a multiple of 16).
__attribute__((target("avx512f"))) void transform_input_avx512(const BlockInput& v, const float* in,
                                                               const Problem& p, std::int64_t row0,
                                                               std::int64_t row1) {
  // Lane t: column 2t of the two loads end to end (16 to 31: the second). A tile
  // row whose tiles start at lane s adds 2 * -s + j for its tiles' column j.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const std::int64_t count = (row1 - row0) * p.tiles_w;  // the block's tiles
  const std::int64_t next_e = v.stride;                  // V[e] to V[e + 1]
  for (std::int64_t c = 0; c < p.C; ++c) {
    for (std::int64_t row = row0; row < row1; ++row) {
      prefetch_rows(in, p, row / p.tiles_h, row % p.tiles_h, c);
    }
    for (std::int64_t t0 = 0; t0 < count; t0 += 16) {
      const std::int64_t t1 = std::min(count, t0 + 16);
      __m512 d[4][4];  // d[i][j]: element (i, j) of tiles t0 .. t0 + 15
      for (auto& di : d) {
        for (auto& dij : di) dij = _mm512_setzero_ps();
      }
      std::int64_t tiles;
      for (std::int64_t t = t0; t < t1; t += tiles) {  // tiles t .. t + tiles - 1: one row
        const std::int64_t row = row0 + t / p.tiles_w, tw = t % p.tiles_w;
        tiles = std::min({t1 - t, p.tiles_w - tw, std::int64_t{8}});
        const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
        const std::int64_t x0 = 2 * tw - p.pad_w;  // the input column of the loads' lane 0
        // Lanes whose column lies in [0, W): the others are the padding's zeros.
        const __mmask16 first_load = static_cast<__mmask16>(
            first_lanes(std::min<std::int64_t>(p.W - x0, 2 * tiles + 2)) & ~first_lanes(-x0));
        const __mmask16 second_load =
            first_lanes(std::min<std::int64_t>(p.W - x0, 2 * tiles + 2) - 16);
        const __mmask16 lanes =
            static_cast<__mmask16>(first_lanes(t - t0 + tiles) & ~first_lanes(t - t0));
        const __m512i shift = _mm512_set1_epi32(static_cast<int>(2 * (t0 - t)));
        const float* plane = in + (n * p.C + c) * p.H * p.W;  // [H,W]
        for (int i = 0; i < 4; ++i) {
          const std::int64_t h = 2 * th - p.pad_h + i;
          if (h < 0 || h >= p.H) continue;  // zeros
          const float* src = plane + h * p.W + x0;
          const __m512 lo = _mm512_maskz_loadu_ps(first_load, src);
          const __m512 hi = _mm512_maskz_loadu_ps(second_load, src + 16);
          for (int j = 0; j < 4; ++j) {
            const __m512i from =
                _mm512_add_epi32(_mm512_add_epi32(even, shift), _mm512_set1_epi32(j));
            d[i][j] = _mm512_mask_mov_ps(d[i][j], lanes, _mm512_permutex2var_ps(lo, from, hi));
          }
        }
      }
      transform_input_tile(d);
      // The address once a group: v.at(e, c, t0) in the loop divided by the panel
      // width four times a store and reread v after each (the stores may alias it),
      // and took the transform from a quarter of backward-data's time to a half.
      float* here = v.v + v.panels.at(c, t0);
#pragma GCC unroll 16
      for (int e = 0; e < 16; ++e) _mm512_storeu_ps(here + e * next_e, d[e / 4][e % 4]);
    }
  }
}
#endif

// V for the tile rows [row0, row1) (row = n * tiles_h + th), on the ISA whose GEMM
// reads it (its panels' width is that ISA's).
void transform_input(const Workspace& ws, const BlockInput& v, const float* in, const Problem& p,
                     std::int64_t row0, std::int64_t row1) {
#if TL_CPU_X86
  if (v.panels.isa == GemmIsa::Avx512) {  // kernels/cpu/x86.h
    transform_input_avx512(v, in, p, row0, row1);
    return;
  }
  if (v.panels.isa == GemmIsa::Avx2) {
    if (p.tiles_w == 4) {
      transform_input_pairs_avx2(v, in, p, row0, row1);
    } else {
      transform_input_avx2(v, in, p, row0, row1);
    }
    return;
  }
#endif
  for (std::int64_t row = row0; row < row1; ++row) {
    transform_input_row(ws, v, in, p, row / p.tiles_h, row % p.tiles_h, (row - row0) * p.tiles_w);
  }
}

// Output row i (0 or 1) of tiles from their 16 products m[e] (element (r, j) of
// Aᵀ m A's input at e = 4*r + j), one tile per lane: Aᵀ's row i across the rows of
// m, then A's two columns, (a, b, c, d) -> (a + b + c, b - c - d) both times. The
// same operations in the same order whatever the vector width: the same bits.
template <typename V>
[[gnu::always_inline]] inline void output_row(const V (&m)[16], int i, V& left, V& right) {
  V t[4];
  for (int j = 0; j < 4; ++j) {
    t[j] = i == 0 ? m[j] + m[4 + j] + m[8 + j] : m[4 + j] - m[8 + j] - m[12 + j];
  }
  left = t[0] + t[1] + t[2];
  right = t[1] - t[2] - t[3];
}

// The output of tile rows [row0, row1) (row = n * tiles_h + th, its tiles at
// columns (row - row0) * tiles_w onwards) from M [K][16][block]: out = bias + Aᵀ m
// A, or out += Aᵀ m A when `accumulate`. M is read once, straight into the output
// rows, rather than in a pass each for Aᵀ, A and the scatter: four tiles (eight
// output columns) a vector, channel by channel. A tile past the bottom or right
// edge (P or Q odd) writes only its pixels inside the output. A group of four may
// read up to 3 columns past the row's tiles (run() leaves room); their lanes are
// not written. Out is float, or a forward's 16-bit y (assigned, never accumulated):
// each value bias + Aᵀ m A rounded once as it is stored.
template <typename Out>
void transform_output(const Workspace& ws, Out* out, const float* bias, bool accumulate,
                      const Problem& p, std::int64_t row0, std::int64_t row1) {
  for (std::int64_t k = 0; k < p.K; ++k) {
    for (std::int64_t row = row0; row < row1; ++row) {
      const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
      const std::int64_t rows = std::min<std::int64_t>(2, p.P - 2 * th);
      Out* plane = out + (n * p.K + k) * p.P * p.Q;  // [P,Q]
      const Vec4 b = splat(bias != nullptr ? bias[k] : 0.0f);
      const float* mk = ws.m_at(k, 0) + (row - row0) * p.tiles_w;
      for (std::int64_t tw = 0; tw < p.tiles_w; tw += 4) {
        Vec4 m[16];
        for (int e = 0; e < 16; ++e) m[e] = load4(mk + e * ws.block + tw);
        const std::int64_t pixels = std::min<std::int64_t>(8, p.Q - 2 * tw);
        for (int i = 0; i < rows; ++i) {
          Vec4 left, right;
          output_row(m, i, left, right);
          Out* y = plane + (2 * th + i) * p.Q + 2 * tw;
          float values[8];  // pixels 2*tw .. 2*tw + 7 of the row
          store4(values, __builtin_shufflevector(left, right, 0, 4, 1, 5));
          store4(values + 4, __builtin_shufflevector(left, right, 2, 6, 3, 7));
          for (std::int64_t x = 0; x < pixels; ++x) {
            if constexpr (std::is_same_v<Out, float>) {
              y[x] = accumulate ? y[x] + values[x] : b[0] + values[x];
            } else {
              y[x] = Out(b[0] + values[x]);
            }
          }
        }
      }
    }
  }
}

#if TL_CPU_X86
// y[0 .. count) = base + v, base = y (accumulate) or b, for count <= 8: a row's
// pixels past the output are neither read nor written.
__attribute__((target("avx2,fma"))) inline void add_pixels(float* y, __m256 v, __m256 b,
                                                           bool accumulate, std::int64_t count) {
  if (count >= 8) {
    _mm256_storeu_ps(y, _mm256_add_ps(accumulate ? _mm256_loadu_ps(y) : b, v));
  } else if (count > 0) {
    const __m256 base = accumulate ? _mm256_maskload_ps(y, first_lanes8(count)) : b;
    store_first_lanes(y, _mm256_add_ps(base, v), count);
  }
}

// A forward's 16-bit y[0 .. count) = b + v rounded once, for count <= 8 (a 16-bit y
// is assigned, never accumulated).
template <typename T>
__attribute__((target("avx2,fma,f16c"))) inline void add_pixels(T* y, __m256 v, __m256 b, bool,
                                                                std::int64_t count) {
  if (count >= 8) {
    store8(y, _mm256_add_ps(b, v));
  } else if (count > 0) {
    store_first8(y, _mm256_add_ps(b, v), count);
  }
}

// transform_output_avx2's plane k where a tile row has four tiles (ResNet-20's 7x7
// stage, P and Q of 7 or 8): two tile rows a vector, row's tiles in lanes 0 .. 3 and
// row + 1's in lanes 4 .. 7 (M holds a block's tiles end to end), where one row a
// vector left half the lanes unused. Each lane's arithmetic is output_row's, as
// before: the same bits. The last row of an odd count reads four columns of M past
// the block's tiles (run() leaves room) and writes only its own pixels.
template <typename Out>
__attribute__((target("avx2,fma,f16c"))) inline void transform_output_pairs_avx2(
    const Workspace& ws, Out* out, __m256 b, bool accumulate, const Problem& p, std::int64_t k,
    std::int64_t row0, std::int64_t row1) {
  for (std::int64_t row = row0; row < row1; row += 2) {
    const float* mk = ws.m_at(k, 0) + (row - row0) * 4;
    __m256 m[16];
    for (int e = 0; e < 16; ++e) m[e] = _mm256_loadu_ps(mk + e * ws.block);
    __m256 half[2][2];  // [tile row][output row]: its eight pixels
    for (int i = 0; i < 2; ++i) {
      __m256 left, right;
      output_row(m, i, left, right);
      const __m256 lo = _mm256_unpacklo_ps(left, right);  // l0 r0 l1 r1 | l4 r4 l5 r5
      const __m256 hi = _mm256_unpackhi_ps(left, right);  // l2 r2 l3 r3 | l6 r6 l7 r7
      half[0][i] = _mm256_permute2f128_ps(lo, hi, 0x20);
      half[1][i] = _mm256_permute2f128_ps(lo, hi, 0x31);
    }
    for (std::int64_t r = 0; r < 2 && row + r < row1; ++r) {
      const std::int64_t n = (row + r) / p.tiles_h, th = (row + r) % p.tiles_h;
      const std::int64_t rows = std::min<std::int64_t>(2, p.P - 2 * th);
      Out* y = out + ((n * p.K + k) * p.P + 2 * th) * p.Q;  // output row 2*th
      for (int i = 0; i < rows; ++i) add_pixels(y + i * p.Q, half[r][i], b, accumulate, p.Q);
    }
  }
}

// transform_output on AVX2: eight tiles (sixteen output columns) a vector, the
// tiles of one tile row, as the portable code takes four.
template <typename Out>
__attribute__((target("avx2,fma,f16c"))) void transform_output_avx2(
    const Workspace& ws, Out* out, const float* bias, bool accumulate, const Problem& p,
    std::int64_t row0, std::int64_t row1) {
  for (std::int64_t k = 0; k < p.K; ++k) {
    const __m256 b = _mm256_set1_ps(bias != nullptr ? bias[k] : 0.0f);
    if (p.tiles_w == 4) {
      transform_output_pairs_avx2(ws, out, b, accumulate, p, k, row0, row1);
      continue;
    }
    for (std::int64_t row = row0; row < row1; ++row) {
      const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
      const std::int64_t rows = std::min<std::int64_t>(2, p.P - 2 * th);
      Out* plane = out + (n * p.K + k) * p.P * p.Q;  // [P,Q]
      const float* mk = ws.m_at(k, 0) + (row - row0) * p.tiles_w;
      for (std::int64_t tw = 0; tw < p.tiles_w; tw += 8) {
        __m256 m[16];
        for (int e = 0; e < 16; ++e) m[e] = _mm256_loadu_ps(mk + e * ws.block + tw);
        const std::int64_t pixels = p.Q - 2 * tw;  // of the row, from column 2*tw
        for (int i = 0; i < rows; ++i) {
          __m256 left, right;
          output_row(m, i, left, right);
          // Pixels 2t and 2t + 1 from lane t of left and of right.
          const __m256 lo = _mm256_unpacklo_ps(left, right);  // l0 r0 l1 r1 | l4 r4 l5 r5
          const __m256 hi = _mm256_unpackhi_ps(left, right);  // l2 r2 l3 r3 | l6 r6 l7 r7
          Out* y = plane + (2 * th + i) * p.Q + 2 * tw;
          add_pixels(y, _mm256_permute2f128_ps(lo, hi, 0x20), b, accumulate, pixels);
          add_pixels(y + 8, _mm256_permute2f128_ps(lo, hi, 0x31), b, accumulate, pixels - 8);
        }
      }
    }
  }
}

// transform_output on AVX-512: sixteen tiles a vector, taken from the block's run
// of tiles regardless of the tile rows (a row of FashionNet's 7 tiles would fill
// fewer than half the lanes), then each tile row's share of the lanes, at most
// eight tiles, interleaved into sixteen output pixels (masked to the row, an odd
// Q's last column included). A 16-bit Out (a forward's y) rounds each value once as
// it is stored.
template <typename Out>
__attribute__((target("avx512f"))) void transform_output_avx512(const Workspace& ws, Out* out,
                                                                const float* bias, bool accumulate,
                                                                const Problem& p, std::int64_t row0,
                                                                std::int64_t row1) {
  // Pixel 2t of the result from lane t of left, pixel 2t + 1 from lane t of right;
  // added to it, a tile row's first lane s picks lanes s + t instead.
  const __m512i interleave =
      _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const std::int64_t count = (row1 - row0) * p.tiles_w;  // the block's tiles
  for (std::int64_t k = 0; k < p.K; ++k) {
    const __m512 b = _mm512_set1_ps(bias != nullptr ? bias[k] : 0.0f);
    const float* mk = ws.m_at(k, 0);
    if (k + kPrefetchPlanes < p.K) {  // the output rows to write, as for the input
      for (std::int64_t row = row0; row < row1; ++row) {
        const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
        const std::int64_t h0 = 2 * th, h1 = std::min<std::int64_t>(p.P, 2 * th + 2);
        const Out* plane = out + (n * p.K + k + kPrefetchPlanes) * p.P * p.Q;
        for (std::int64_t x = h0 * p.Q; x < h1 * p.Q; x += 16) __builtin_prefetch(plane + x, 1);
        __builtin_prefetch(plane + h1 * p.Q - 1, 1);
      }
    }
    for (std::int64_t t0 = 0; t0 < count; t0 += 16) {
      const std::int64_t t1 = std::min(count, t0 + 16);
      __m512 m[16];
      for (int e = 0; e < 16; ++e) {
        m[e] = _mm512_maskz_loadu_ps(first_lanes(t1 - t0), mk + e * ws.block + t0);
      }
      __m512 left[2], right[2];  // output rows 0 and 1 of the tiles
      for (int i = 0; i < 2; ++i) output_row(m, i, left[i], right[i]);
      std::int64_t tiles;
      for (std::int64_t t = t0; t < t1; t += tiles) {  // tiles t .. t + tiles - 1: one row
        const std::int64_t row = row0 + t / p.tiles_w, tw = t % p.tiles_w;
        tiles = std::min({t1 - t, p.tiles_w - tw, std::int64_t{8}});
        const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
        const std::int64_t rows = std::min<std::int64_t>(2, p.P - 2 * th);
        const std::int64_t pixels = std::min(2 * tiles, p.Q - 2 * tw);
        const __mmask16 keep = first_lanes(pixels);
        const __m512i from =
            _mm512_add_epi32(interleave, _mm512_set1_epi32(static_cast<int>(t - t0)));
        Out* y = out + ((n * p.K + k) * p.P + 2 * th) * p.Q + 2 * tw;
        for (int i = 0; i < rows; ++i, y += p.Q) {
          const __m512 v = _mm512_permutex2var_ps(left[i], from, right[i]);
          if constexpr (std::is_same_v<Out, float>) {
            const __m512 base = accumulate ? _mm512_maskz_loadu_ps(keep, y) : b;
            _mm512_mask_storeu_ps(y, keep, _mm512_add_ps(base, v));
          } else {
            store_first16(y, _mm512_add_ps(b, v), pixels);
          }
        }
      }
    }
  }
}
#endif

// Steps 2 of the file comment for tile rows [row0, row1) (row = n * tiles_h + th),
// with u the 16 matrices U[e] [K][C] of the transformed kernel, packed.
template <typename Out>
void run_block(Out* out, const float* in, const std::vector<PackedA>& u, const float* bias,
               bool accumulate, const Problem& p, std::int64_t row0, std::int64_t row1,
               const Workspace& ws) {
  const BlockInput v{ws.v, whole_panels(u[0], (row1 - row0) * p.tiles_w), ws.v_stride};
  transform_input(ws, v, in, p, row0, row1);
  for (int e = 0; e < 16; ++e) gemm_packed(u[e], v.panels, v.of(e), 0.0f, ws.m_at(0, e), ws.ld());
#if TL_CPU_X86
  if (avx512_selected()) {  // kernels/cpu/x86.h
    transform_output_avx512(ws, out, bias, accumulate, p, row0, row1);
    return;
  }
  if (avx2_selected()) {
    transform_output_avx2(ws, out, bias, accumulate, p, row0, row1);
    return;
  }
#endif
  transform_output(ws, out, bias, accumulate, p, row0, row1);
}

// Steps 2 over all tile rows, blocks spread over the caller's threads (each block
// writes its own output rows).
template <typename Out>
void run(Out* out, const float* in, const std::vector<PackedA>& u, const float* bias,
         bool accumulate, const Problem& p) {
  const std::int64_t per_block = rows_per_block(p);
  // M's columns: a block's tiles and the 7 past them that the AVX2 output
  // transform's last group of eight reads.
  const GemmBPanels whole = whole_panels(u[0], per_block * p.tiles_w + 7);
  const std::int64_t all_rows = p.N * p.tiles_h, blocks = (all_rows + per_block - 1) / per_block;
  parallel_rows(blocks, whole.n * 16 * (p.C + p.K), [&](std::int64_t first, std::int64_t last) {
    HostScratch<float> scratch(workspace_floats(p, whole));
    const Workspace ws = workspace_in(scratch.get(), p, whole);
    for (std::int64_t b = first; b < last; ++b) {
      run_block(out, in, u, bias, accumulate, p, b * per_block,
                std::min(all_rows, (b + 1) * per_block), ws);
    }
  });
}

// U [16][rows][cols] as 16 packed GEMM operands, packed once for all the blocks.
std::vector<PackedA> packed_weights(const float* u, std::int64_t rows, std::int64_t cols) {
  std::vector<PackedA> packed;
  packed.reserve(16);
  for (int e = 0; e < 16; ++e) packed.emplace_back(u + e * rows * cols, cols, rows, cols);
  return packed;
}

}  // namespace

template <typename Out>
void winograd_forward(Out* y, const float* x, const float* weight, const float* bias,
                      const Conv2dShape& s) {
  const Problem p = make_problem(s.N, s.C, s.H, s.W, s.K, s.params.pad_h, s.params.pad_w);
  HostScratch<float> u(16 * s.K * s.C);     // [16][K][C]
  for (std::int64_t k = 0; k < s.K; ++k) {  // the kernels of weight[k], c a lane
    transform_weight(u.get() + k * s.C, s.K * s.C, weight + k * s.C * 9, 9, 3, 1, s.C);
  }
  run(y, x, packed_weights(u.get(), s.K, s.C), bias, false, p);
}

void winograd_backward_data(float* grad_x, const float* grad_y, const float* weight,
                            const Conv2dShape& s, bool accumulate) {
  // grad_x[n,c,h,w] += sum_{k,r,s} grad_y[n,k,h+pad_h-r,w+pad_w-s] weight[k,c,r,s]: the
  // correlation of grad_y, padded by 2 - pad, with weight[k,c] turned 180 degrees.
  const Problem p = make_problem(s.N, s.K, s.P, s.Q, s.C, 2 - s.params.pad_h, 2 - s.params.pad_w);
  HostScratch<float> u(16 * s.C * s.K);     // [16][C][K]
  for (std::int64_t c = 0; c < s.C; ++c) {  // the kernels weight[., c], k a lane
    // g(r,s) = weight[k,c,2-r,2-s]: start at the last tap, step backwards.
    transform_weight(u.get() + c * s.K, s.C * s.K, weight + c * 9 + 8, s.C * 9, -3, -1, s.K);
  }
  run(grad_x, grad_y, packed_weights(u.get(), s.C, s.K), nullptr, accumulate, p);
}

template void winograd_forward<float>(float*, const float*, const float*, const float*,
                                      const Conv2dShape&);
template void winograd_forward<bfloat16>(bfloat16*, const float*, const float*, const float*,
                                         const Conv2dShape&);
template void winograd_forward<float16>(float16*, const float*, const float*, const float*,
                                        const Conv2dShape&);

}  // namespace towerlab::cpu
