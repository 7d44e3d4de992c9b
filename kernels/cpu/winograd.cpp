// Winograd F(2x2, 3x3) convolution on the CPU: the algorithm, its matrices and its
// numerics in kernels/cpu/winograd.h. The steps, for forward and backward-data alike
// (with at most 16 channels each side on AVX2, steps 2 fused for each tile row
// instead: fused_rows_avx2, the same bits):
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
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>
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

  // The 16 elements d of the tiles' channel c to V[0..15], `here` their place in V[0]
  // (v.v + v.panels.at(c, t)) and, when split, `rest` floats on the next panel's
  // (at(c, t + fit) - at(c, t), the same for the channels of one block of kGemmKc). Inlined
  // into each caller, the two ways to store kept apart and each unrolled: with the
  // test inside the loop, the compiler kept d in memory and the transform took twice
  // as long. Split is `split`, which a caller whose loop stores many channels takes as
  // a template argument.
  template <bool Split>
  __attribute__((target("avx2"), always_inline)) void store(const BlockInput& v, float* here,
                                                            std::int64_t rest,
                                                            const __m256 (&d)[4][4]) const {
    if constexpr (!Split) {
#pragma GCC unroll 16
      for (int e = 0; e < 16; ++e) _mm256_storeu_ps(here + e * v.stride, d[e / 4][e % 4]);
    } else {
      for (int e = 0; e < 16; ++e) store_first_lanes(here + e * v.stride, d[e / 4][e % 4], fit);
      if (spill) {
        float* next = here + rest;
        for (int e = 0; e < 16; ++e) {
          _mm256_storeu_ps(next + e * v.stride, _mm256_permutevar8x32_ps(d[e / 4][e % 4], turn));
        }
      }
    }
  }
  __attribute__((target("avx2"), always_inline)) void store(const BlockInput& v, std::int64_t c,
                                                            const __m256 (&d)[4][4]) const {
    float* here = v.v + v.panels.at(c, t);
    if (split) {
      store<true>(v, here, spill ? v.panels.at(c, t + fit) - v.panels.at(c, t) : 0, d);
    } else {
      store<false>(v, here, 0, d);
    }
  }
};

// A row of zeros, the input row that transform_input_avx2 reads outside the image
// (a group reads 18 columns, from up to 8 before its first: GroupInput::at).
alignas(32) constexpr float kZeroRow[32] = {};

// What one group of transform_input_avx2 reads, set up once for all its channels:
// channel c's input row i (its column x0, the group's first) at rows[i] + c * step[i],
// kZeroRow with step 0 for a row outside the image; load l takes columns
// x0 + kGroupOffset[l] .. + 7, masked by mask[l] to those inside the image.
constexpr std::int64_t kGroupOffset[4] = {0, 8, 2, 10};
struct GroupInput {
  const float* rows[4];
  std::int64_t step[4];
  __m256i mask[4];
  int whole;  // bit l: load l lies inside the image, a plain load
  // Where W >= 8, the other loads as eight columns inside the row, from rows[i] +
  // at[l], their lanes moved by `index` and those outside the image cleared by `mask`
  // (fused_input_avx2: faster so than with the masked load vmaskmovps).
  std::int64_t at[4];
  __m256i index[4];
  // The fused path's prefetch, channel by channel: up to two input rows of a later
  // tile row, channel c's ahead_width[j] floats at ahead[j] + c * ahead_step[j].
  const float* ahead[2];
  std::int64_t ahead_step[2], ahead_width[2];
};

// The GroupInput of the group of tiles tw .. tw + 7 of tile row (n, th).
__attribute__((target("avx2"))) inline GroupInput group_input(const float* in, const Problem& p,
                                                              std::int64_t n, std::int64_t th,
                                                              std::int64_t tw) {
  const std::int64_t x0 = 2 * tw - p.pad_w;  // negative in the padding
  GroupInput g;
  g.whole = 0;
  for (int l = 0; l < 4; ++l) {
    const std::int64_t x = x0 + kGroupOffset[l];
    g.mask[l] = _mm256_andnot_si256(first_lanes8(-x), first_lanes8(p.W - x));
    if (x >= 0 && x + 8 <= p.W) g.whole |= 1 << l;
    const std::int64_t base = std::clamp<std::int64_t>(x, 0, std::max<std::int64_t>(0, p.W - 8));
    g.at[l] = base - x0;
    g.index[l] = _mm256_min_epi32(
        _mm256_max_epi32(_mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(static_cast<int>(x - base))),
                         _mm256_setzero_si256()),
        _mm256_set1_epi32(7));
  }
  for (int i = 0; i < 4; ++i) {
    const std::int64_t h = 2 * th - p.pad_h + i;
    const bool inside = h >= 0 && h < p.H;
    // A row outside the image reads kZeroRow from 8 floats in (`at` may be negative).
    g.rows[i] = inside ? in + (n * p.C * p.H + h) * p.W + x0 : kZeroRow + 8;
    g.step[i] = inside ? p.H * p.W : 0;
  }
  for (int j = 0; j < 2; ++j) {  // nothing ahead
    g.ahead[j] = nullptr;
    g.ahead_step[j] = g.ahead_width[j] = 0;
  }
  return g;
}

// The channels of one group of transform_input_avx2: bit l of Whole set where load l
// lies inside the image (a plain load: AMD runs the masked one slowly), Split the
// group's TileVectorStore::split. Template arguments so that the loop over the
// channels tests nothing: the tests on them and V's panel address (a division) were
// in it for every channel, and the profile put much of the transform's time there.
template <int Whole, bool Split>
__attribute__((target("avx2,fma"))) void transform_group_avx2(const BlockInput& v,
                                                              const TileVectorStore& to_v,
                                                              const GroupInput& g, const float* in,
                                                              const Problem& p, std::int64_t n,
                                                              std::int64_t th, bool prefetch) {
  for (std::int64_t c0 = 0; c0 < p.C; c0 += kGemmKc) {  // V's blocks of channels
    const std::int64_t c1 = std::min(p.C, c0 + kGemmKc);
    float* here = v.v + v.panels.at(c0, to_v.t);  // channel c's at here + (c - c0) * width
    const std::int64_t rest =
        Split && to_v.spill ? v.panels.at(c0, to_v.t + to_v.fit) - v.panels.at(c0, to_v.t) : 0;
    for (std::int64_t c = c0; c < c1; ++c, here += v.panels.width) {
      if (prefetch) prefetch_rows(in, p, n, th, c);
      __m256 d[4][4];  // d[i][j]: element (i, j) of the group's tiles
      for (int i = 0; i < 4; ++i) {
        const float* src = g.rows[i] + c * g.step[i];
        __m256 r[4];
        for (int l = 0; l < 4; ++l) {
          r[l] = (Whole >> l & 1) ? _mm256_loadu_ps(src + kGroupOffset[l])
                                  : _mm256_maskload_ps(src + kGroupOffset[l], g.mask[l]);
        }
        d[i][0] = even_lanes(r[0], r[1]);
        d[i][1] = odd_lanes(r[0], r[1]);
        d[i][2] = even_lanes(r[2], r[3]);
        d[i][3] = odd_lanes(r[2], r[3]);
      }
      transform_input_tile(d);
      to_v.store<Split>(v, here, rest, d);
    }
  }
}

// transform_group_avx2 for each Whole (the index's low four bits) and Split (bit 4).
using GroupKernel = void (*)(const BlockInput&, const TileVectorStore&, const GroupInput&,
                             const float*, const Problem&, std::int64_t, std::int64_t, bool);
template <std::size_t... I>
constexpr std::array<GroupKernel, sizeof...(I)> group_kernels(std::index_sequence<I...>) {
  return {&transform_group_avx2<static_cast<int>(I % 16), (I >= 16)>...};
}
constexpr std::array<GroupKernel, 32> kGroupKernels = group_kernels(std::make_index_sequence<32>());

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
  for (std::int64_t row = row0; row < row1; ++row) {
    const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
    for (std::int64_t tw = 0; tw < p.tiles_w; tw += 8) {
      const GroupInput g = group_input(in, p, n, th, tw);
      const std::int64_t t = (row - row0) * p.tiles_w + tw;  // the group's first tile
      const std::int64_t tiles = std::min<std::int64_t>(8, p.tiles_w - tw);
      const TileVectorStore to_v(v, t, tiles);
      kGroupKernels[g.whole + (to_v.split ? 16 : 0)](v, to_v, g, in, p, n, th, tw == 0);
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

// Steps 2 for few channels on AVX2 (fused_applies): the sixteen tiles of a tile row,
// two groups of eight, through all three steps at once, their V and M in arrays on
// the stack (L1), the products in registers. The blocked path writes V into the
// GEMM's panels (a group of eight tiles often split over two of them), multiplies
// 16 x 16 matrices through the GEMM's driver and reads M back from the L2 cache: with
// 16 channels in and out, where the products are few beside the transforms, that
// handling cost more than the products. The products are the GEMM's sums
// (kernels/cpu/gemm_kernels.cpp: one fused multiply-add per channel, in channel order,
// from zero; a single block of kGemmKc), the transforms the blocked path's arithmetic,
// so the bits are the blocked path's (tests/conv2d_winograd_cpu_test.cpp). A group's
// tiles sit in its lanes in the order 0 1 4 5 2 3 6 7, which the in-lane shuffles of
// the input transform leave and the output's unpacking turns back into pixel order,
// so neither moves floats across the vectors' 128-bit halves.
constexpr std::int64_t kFusedChannels = 16;

bool fused_applies(const Problem& p) {
  return gemm_isa() == GemmIsa::Avx2 && p.C <= kFusedChannels && p.K <= kFusedChannels &&
         p.K % 2 == 0 && p.W >= 8;
}

// V of one group into its half of fused_rows_avx2's V, at v[((e * C + c) * 2) * 8]:
// the eight tiles (in the order 0 1 4 5 2 3 6 7) of each element and channel, from
// the input that `g` describes, with transform_group_avx2's arithmetic, Whole its.
template <int Whole>
__attribute__((target("avx2,fma"))) void fused_input_avx2(float* v, const GroupInput& g,
                                                          std::int64_t channels) {
  for (std::int64_t c = 0; c < channels; ++c) {
    for (int j = 0; j < 2; ++j) {
      if (g.ahead_width[j] == 0) continue;
      const float* row = g.ahead[j] + c * g.ahead_step[j];
      for (std::int64_t x = 0; x < g.ahead_width[j]; x += 16) __builtin_prefetch(row + x);
      __builtin_prefetch(row + g.ahead_width[j] - 1);
    }
    __m256 d[4][4];
    for (int i = 0; i < 4; ++i) {
      const float* src = g.rows[i] + c * g.step[i];
      __m256 r[4];
      for (int l = 0; l < 4; ++l) {
        r[l] = (Whole >> l & 1) ? _mm256_loadu_ps(src + kGroupOffset[l])
                                : _mm256_and_ps(_mm256_permutevar8x32_ps(
                                                    _mm256_loadu_ps(src + g.at[l]), g.index[l]),
                                                _mm256_castsi256_ps(g.mask[l]));
      }
      d[i][0] = _mm256_shuffle_ps(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0));
      d[i][1] = _mm256_shuffle_ps(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1));
      d[i][2] = _mm256_shuffle_ps(r[2], r[3], _MM_SHUFFLE(2, 0, 2, 0));
      d[i][3] = _mm256_shuffle_ps(r[2], r[3], _MM_SHUFFLE(3, 1, 3, 1));
    }
    transform_input_tile(d);
    for (int e = 0; e < 16; ++e) _mm256_store_ps(v + (e * channels + c) * 16, d[e / 4][e % 4]);
  }
}

using FusedInput = void (*)(float*, const GroupInput&, std::int64_t);
template <std::size_t... I>
constexpr std::array<FusedInput, sizeof...(I)> fused_inputs(std::index_sequence<I...>) {
  return {&fused_input_avx2<static_cast<int>(I)>...};
}
constexpr std::array<FusedInput, 16> kFusedInputs = fused_inputs(std::make_index_sequence<16>());

// M = U[e] · V[e] for filters k0 .. k0 + Rows - 1 of element e, two groups of eight
// tiles: v_e [C][2][8] (V[e]), u_e [C][K] (U[e] transposed, fused_weights), m
// [K][16][2][8]. Each sum in a register, twelve at once at most (the GEMM's
// 6 x 16 micro-kernel, kernels/cpu/gemm_kernels.cpp, whose sums these are).
template <int Rows>
__attribute__((target("avx2,fma"))) inline void fused_products_avx2(float* m, const float* v_e,
                                                                    const float* u_e,
                                                                    const Problem& p, int e,
                                                                    std::int64_t k0) {
  __m256 sum[Rows][2];
  for (auto& row : sum) row[0] = row[1] = _mm256_setzero_ps();
  for (std::int64_t c = 0; c < p.C; ++c) {
    const __m256 x0 = _mm256_load_ps(v_e + c * 16), x1 = _mm256_load_ps(v_e + c * 16 + 8);
    const float* u = u_e + c * p.K + k0;
#pragma GCC unroll 6
    for (int r = 0; r < Rows; ++r) {
      const __m256 weight = _mm256_broadcast_ss(u + r);
      sum[r][0] = _mm256_fmadd_ps(weight, x0, sum[r][0]);
      sum[r][1] = _mm256_fmadd_ps(weight, x1, sum[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < Rows; ++r) {
    float* out = m + ((k0 + r) * 16 + e) * 16;
    _mm256_store_ps(out, sum[r][0]);
    _mm256_store_ps(out + 8, sum[r][1]);
  }
}

// U [16][K][C] as fused_products_avx2 reads it, [16][C][K].
void fused_weights(float* out, const float* u, const Problem& p) {
  for (int e = 0; e < 16; ++e) {
    for (std::int64_t k = 0; k < p.K; ++k) {
      for (std::int64_t c = 0; c < p.C; ++c) {
        out[(e * p.C + c) * p.K + k] = u[(e * p.K + k) * p.C + c];
      }
    }
  }
}

// The fused steps 2 for tile rows [first, last) (row = n * tiles_h + th), two groups
// of eight tiles of a row at a time. V starts as zeros, so that a missing second
// group's lanes, multiplied but never stored, hold finite values.
template <typename Out>
__attribute__((target("avx2,fma,f16c"))) void fused_rows_avx2(Out* out, const float* in,
                                                              const float* u, const float* bias,
                                                              bool accumulate, const Problem& p,
                                                              std::int64_t first,
                                                              std::int64_t last) {
  alignas(32) float v[16 * kFusedChannels * 16] = {};  // [16][C][2][8]
  alignas(32) float m[kFusedChannels * 16 * 16];       // [K][16][2][8]
  for (std::int64_t row = first; row < last; ++row) {
    const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
    const std::int64_t rows = std::min<std::int64_t>(2, p.P - 2 * th);  // output rows
    for (std::int64_t tw0 = 0; tw0 < p.tiles_w; tw0 += 16) {
      const int groups = p.tiles_w - tw0 > 8 ? 2 : 1;
      for (int h = 0; h < groups; ++h) {
        GroupInput g = group_input(in, p, n, th, tw0 + 8 * h);
        if (tw0 + h == 0 && row + 1 < p.N * p.tiles_h) {
          // The rows the next tile row reads that this one does not, a row ahead.
          const std::int64_t next_n = (row + 1) / p.tiles_h, next_th = (row + 1) % p.tiles_h;
          for (int j = 0; j < 2; ++j) {
            const std::int64_t h_next = 2 * next_th - p.pad_h + 2 + j;
            if (h_next < 0 || h_next >= p.H) continue;
            g.ahead[j] = in + (next_n * p.C * p.H + h_next) * p.W;
            g.ahead_step[j] = p.H * p.W;
            g.ahead_width[j] = p.W;
          }
        }
        kFusedInputs[g.whole](v + 8 * h, g, p.C);
      }
      for (int e = 0; e < 16; ++e) {
        const float* v_e = v + e * p.C * 16;
        const float* u_e = u + e * p.C * p.K;
        std::int64_t k0 = 0;
        for (; k0 + 6 <= p.K; k0 += 6) fused_products_avx2<6>(m, v_e, u_e, p, e, k0);
        if (p.K - k0 == 4) fused_products_avx2<4>(m, v_e, u_e, p, e, k0);
        if (p.K - k0 == 2) fused_products_avx2<2>(m, v_e, u_e, p, e, k0);
      }
      for (int h = 0; h < groups; ++h) {
        const std::int64_t tw = tw0 + 8 * h;
        const std::int64_t pixels = p.Q - 2 * tw;  // of the row, from column 2*tw
        for (std::int64_t k = 0; k < p.K; ++k) {
          const __m256 b = _mm256_set1_ps(bias != nullptr ? bias[k] : 0.0f);
          __m256 m_k[16];
          for (int e = 0; e < 16; ++e) m_k[e] = _mm256_load_ps(m + (k * 16 + e) * 16 + 8 * h);
          Out* y = out + ((n * p.K + k) * p.P + 2 * th) * p.Q + 2 * tw;
          for (int i = 0; i < rows; ++i, y += p.Q) {
            __m256 left, right;
            output_row(m_k, i, left, right);
            // Lanes 0 1 4 5 are tiles 0 .. 3, lanes 2 3 6 7 tiles 4 .. 7: pixels in order.
            add_pixels(y, _mm256_unpacklo_ps(left, right), b, accumulate, pixels);
            add_pixels(y + 8, _mm256_unpackhi_ps(left, right), b, accumulate, pixels - 8);
          }
        }
      }
    }
  }
}

template <typename Out>
void run_fused_avx2(Out* out, const float* in, const float* u_matrices, const float* bias,
                    bool accumulate, const Problem& p) {
  HostScratch<float> u(16 * p.K * p.C);
  fused_weights(u.get(), u_matrices, p);
  parallel_rows(p.N * p.tiles_h, p.tiles_w * 16 * (p.C + p.K),
                [&](std::int64_t first, std::int64_t last) {
                  fused_rows_avx2(out, in, u.get(), bias, accumulate, p, first, last);
                });
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
  // The output transform of the ISA that wrote V (transform_input), which reads M's
  // columns in the order that one left its tiles in.
  if (v.panels.isa == GemmIsa::Avx512) {  // kernels/cpu/x86.h
    transform_output_avx512(ws, out, bias, accumulate, p, row0, row1);
    return;
  }
  if (v.panels.isa == GemmIsa::Avx2) {
    transform_output_avx2(ws, out, bias, accumulate, p, row0, row1);
    return;
  }
#endif
  transform_output(ws, out, bias, accumulate, p, row0, row1);
}

// U [16][rows][cols] as 16 packed GEMM operands, packed once for all the blocks.
std::vector<PackedA> packed_weights(const float* u, std::int64_t rows, std::int64_t cols) {
  std::vector<PackedA> packed;
  packed.reserve(16);
  for (int e = 0; e < 16; ++e) packed.emplace_back(u + e * rows * cols, cols, rows, cols);
  return packed;
}

// Steps 2 over all tile rows, u the 16 matrices U[e] [K][C] of the transformed
// kernel: fused for few channels on AVX2, else in blocks spread over the caller's
// threads (each block writes its own output rows).
template <typename Out>
void run(Out* out, const float* in, const float* u_matrices, const float* bias, bool accumulate,
         const Problem& p) {
#if TL_CPU_X86
  if (fused_applies(p)) {
    run_fused_avx2(out, in, u_matrices, bias, accumulate, p);
    return;
  }
#endif
  const std::vector<PackedA> u = packed_weights(u_matrices, p.K, p.C);
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

}  // namespace

template <typename Out>
void winograd_forward(Out* y, const float* x, const float* weight, const float* bias,
                      const Conv2dShape& s) {
  const Problem p = make_problem(s.N, s.C, s.H, s.W, s.K, s.params.pad_h, s.params.pad_w);
  HostScratch<float> u(16 * s.K * s.C);     // [16][K][C]
  for (std::int64_t k = 0; k < s.K; ++k) {  // the kernels of weight[k], c a lane
    transform_weight(u.get() + k * s.C, s.K * s.C, weight + k * s.C * 9, 9, 3, 1, s.C);
  }
  run(y, x, u.get(), bias, false, p);
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
  run(grad_x, grad_y, u.get(), nullptr, accumulate, p);
}

template void winograd_forward<float>(float*, const float*, const float*, const float*,
                                      const Conv2dShape&);
template void winograd_forward<bfloat16>(bfloat16*, const float*, const float*, const float*,
                                         const Conv2dShape&);
template void winograd_forward<float16>(float16*, const float*, const float*, const float*,
                                        const Conv2dShape&);

}  // namespace towerlab::cpu
