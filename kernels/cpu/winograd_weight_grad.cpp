// The weight gradient of Winograd's 3x3 layers on the CPU, F(3x3, 2x2) (the forward
// and backward-data: kernels/cpu/winograd.cpp; the interface and numerics:
// kernels/cpu/winograd.h).
//
// The weight gradient is a correlation too: grad_weight[k,c] (3x3) sums over the
// images and output pixels grad_y[n,k,p,q] · x[n,c,p+r-pad,q+s-pad]. Over one 2x2
// tile of grad_y it is a 3x3 result from a 2x2 "kernel" (the tile) and the tile's
// 4x4 input, Winograd F(3x3, 2x2): with the forward's Bᵀ and
//   G₂ = [1    0  ]    A₂ᵀ = [1  1  1  0]
//        [1/2  1/2]          [0  1 -1  0]
//        [1/2 -1/2]          [0  1  1  1]
//        [0   -1  ]
// the tile adds A₂ᵀ [ (G₂ dy G₂ᵀ) ⊙ (Bᵀ d B) ] A₂ (G₂'s last row is the usual one's
// negative, as this Bᵀ's is). The sum over tiles comes before A₂ᵀ . A₂, so it is 16
// matrix products again, now reducing over the tiles:
//   S[e] (+)= V[e]ᵀ · Y[e]      [C, K] = [C, tiles] · [tiles, K]
// with V = Bᵀ d B as the forward's and Y = G₂ dy G₂ᵀ: 16 multiplications per tile and
// (c, k) pair where im2col takes 36. Here the reduction runs over the tiles, so V and
// Y keep a tile's channels together, both written straight into the GEMM's panels,
// which it reads without packing: V into its panels of A (GemmAPanels, runs of 6 or
// 12 channels by tile), Y into its panels of B (GemmBPanels, runs of 16 or 32
// filters by tile). (The forward's layout, tiles contiguous, cost this pass about as
// much in packing as in products; V [tiles][C], which the GEMM packed by copying runs
// of channels, still cost a share of the pass.)
//
// For a caller's group of images:
//   for each block of tiles, in order:
//      transforms        V[e](c, t) = (Bᵀ d[t,c] B)[e],  Y[e](t, k) = (G₂ dy[t,k] G₂ᵀ)[e]
//                        (V in the GEMM's panels of A, Y in its panels of B)
//      16 GEMMs          S[e] (+)= V[e]ᵀ · Y[e]                  [16][C][K]
//   then                 partial[c,r,s][k] = (A₂ᵀ S[c,k] A₂)[r][s]
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/winograd.h"
#include "kernels/cpu/winograd_tiles.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

using namespace winograd;  // kernels/cpu/winograd_tiles.h

// u [4][4] = G₂ d G₂ᵀ for a 2x2 tile d of grad_y, one tile a lane of V (or V = float).
// Halving and negating are exact: the rounding is the adds'.
template <typename V>
[[gnu::always_inline]] inline void transform_gradient_tile(V (&u)[16], const V (&d)[2][2]) {
  V gd[4][2];  // G₂ d
  for (int s = 0; s < 2; ++s) {
    const V d0 = d[0][s], d1 = d[1][s];
    gd[0][s] = d0;
    gd[1][s] = 0.5f * (d0 + d1);
    gd[2][s] = 0.5f * (d0 - d1);
    gd[3][s] = -d1;
  }
  for (int i = 0; i < 4; ++i) {
    const V g0 = gd[i][0], g1 = gd[i][1];
    u[i * 4 + 0] = g0;
    u[i * 4 + 1] = 0.5f * (g0 + g1);
    u[i * 4 + 2] = 0.5f * (g0 - g1);
    u[i * 4 + 3] = -g1;
  }
}

// The weight gradient's transforms of one block of tile rows [row0, row1): tile t of
// the block is tile tw of tile row row0 + t / tiles_w.
struct GradientBlock {
  float* v;  // [16][v_stride]: Bᵀ d B of x, V[e] A [C, tiles] of the products
  float* y;  // [16][y_stride]: G₂ dy G₂ᵀ of grad_y, Y[e] B [tiles, K] of the products
  GemmAPanels v_panels;             // k: the block's tiles
  GemmBPanels y_panels;             // k: the block's tiles
  std::int64_t v_stride, y_stride;  // spread_stride of a whole block's V[e] and Y[e]

  float* v_of(int e) const { return v + e * v_stride; }
  float* y_of(int e) const { return y + e * y_stride; }
  // V[e]'s element (c, t).
  float* v_at(int e, std::int64_t c, std::int64_t t) const { return v_of(e) + v_panels.at(c, t); }
  // Y[e]'s element (t, k).
  float* y_at(int e, std::int64_t t, std::int64_t k) const { return y_of(e) + y_panels.at(t, k); }
};

// The block's V and Y one tile and channel at a time (zero outside the image and
// past P, Q), for any channel counts.
void transform_block(const GradientBlock& b, const float* x, const float* grad_y, const Problem& p,
                     std::int64_t row0, std::int64_t row1) {
  for (std::int64_t row = row0; row < row1; ++row) {
    const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
    for (std::int64_t tw = 0; tw < p.tiles_w; ++tw) {
      const std::int64_t t = (row - row0) * p.tiles_w + tw;
      for (std::int64_t c = 0; c < p.C; ++c) {
        const float* plane = x + (n * p.C + c) * p.H * p.W;  // [H,W]
        float d[4][4];
        for (int i = 0; i < 4; ++i) {
          for (int j = 0; j < 4; ++j) {
            const std::int64_t h = 2 * th - p.pad_h + i, w = 2 * tw - p.pad_w + j;
            d[i][j] = h >= 0 && h < p.H && w >= 0 && w < p.W ? plane[h * p.W + w] : 0.0f;
          }
        }
        transform_input_tile(d);
        for (int e = 0; e < 16; ++e) *b.v_at(e, c, t) = d[e / 4][e % 4];
      }
      for (std::int64_t k = 0; k < p.K; ++k) {
        const float* plane = grad_y + (n * p.K + k) * p.P * p.Q;  // [P,Q]
        float d[2][2], u[16];
        for (int i = 0; i < 2; ++i) {
          for (int j = 0; j < 2; ++j) {
            const std::int64_t h = 2 * th + i, w = 2 * tw + j;
            d[i][j] = h < p.P && w < p.Q ? plane[h * p.Q + w] : 0.0f;
          }
        }
        transform_gradient_tile(u, d);
        for (int e = 0; e < 16; ++e) *b.y_at(e, t, k) = u[e];
      }
    }
  }
}

#if TL_CPU_X86
// cols[x][lane] = plane_lane[x0 + x] for x < 8 * loads, lane the 8 planes
// `plane_stride` apart from `row` (columns outside [0, width) read as zeros): eight
// rows of a tile row's input turned into vectors of eight channels, an 8x8
// transpose per eight columns. A load that would cross the row's ends reads the
// eight columns inside it instead and the transposed columns are renamed (masked
// loads, vmaskmovps, were the transforms' hottest instructions on the AVX2 machine);
// rows narrower than eight columns take masked loads.
__attribute__((target("avx2,fma"))) inline void load_channel_columns(
    float (*cols)[8], const float* row, std::int64_t plane_stride, std::int64_t x0,
    std::int64_t width, int loads) {
  for (int l = 0; l < loads; ++l) {
    const std::int64_t x = x0 + 8 * l;
    float(*out)[8] = cols + 8 * l;
    if (x >= width || x + 8 <= 0) {
      std::fill(&out[0][0], &out[0][0] + 64, 0.0f);
      continue;
    }
    __m256 r[8];
    if (width < 8) {
      const __m256i mask = _mm256_andnot_si256(first_lanes8(-x), first_lanes8(width - x));
      for (int lane = 0; lane < 8; ++lane) {
        r[lane] = _mm256_maskload_ps(row + lane * plane_stride + x, mask);
      }
      transpose8x8(r);
      for (int q = 0; q < 8; ++q) _mm256_store_ps(out[q], r[q]);
      continue;
    }
    const std::int64_t base = std::clamp<std::int64_t>(x, 0, width - 8);
    for (int lane = 0; lane < 8; ++lane) {
      r[lane] = _mm256_loadu_ps(row + lane * plane_stride + base);
    }
    transpose8x8(r);  // r[q]: column base + q
    for (std::int64_t q = 0; q < 8; ++q) {
      const std::int64_t column = x + q;
      _mm256_store_ps(out[q],
                      column >= 0 && column < width ? r[column - base] : _mm256_setzero_ps());
    }
  }
}

// Asks for row h of the eight planes `plane_stride` apart from `plane` (a row of
// `width` floats): each plane is a short stretch of memory (FashionNet's 14x14, twelve
// cache lines) whose rows the hardware prefetcher does not see coming. Asking one
// tile row ahead made the weight gradient of FashionNet's conv2 faster
// (bench/results/cpu_levers_avx2.md).
inline void prefetch_channel_row(const float* plane, std::int64_t plane_stride, std::int64_t h,
                                 std::int64_t width) {
  for (int lane = 0; lane < 8; ++lane) {
    const float* row = plane + lane * plane_stride + h * width;
    __builtin_prefetch(row);
    __builtin_prefetch(row + width - 1);
  }
}

// Eight channels' vector into V's panels of A: its first `First` lanes at `a` (the
// rest of one panel's row), the others at `b` (the next panel's row). With an even
// panel height of at least 6 (AVX2's 6, AVX-512's 12) and c0 a multiple of 8, the
// eight channels c0 .. c0 + 7 leave 2, 4, 6 or all 8 in the first panel and the rest
// fit in the next; each case its own stores, two or three halves and quarters.
template <int First>
[[gnu::always_inline]] __attribute__((target("avx2,fma"))) inline void store_channels(float* a,
                                                                                      float* b,
                                                                                      __m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  if constexpr (First == 8) {
    _mm256_storeu_ps(a, v);
  } else if constexpr (First == 6) {
    _mm_storeu_ps(a, lo);
    _mm_storel_pi(reinterpret_cast<__m64*>(a + 4), hi);
    _mm_storeh_pi(reinterpret_cast<__m64*>(b), hi);
  } else if constexpr (First == 4) {
    _mm_storeu_ps(a, lo);
    _mm_storeu_ps(b, hi);
  } else {
    static_assert(First == 2);
    _mm_storel_pi(reinterpret_cast<__m64*>(a), lo);
    _mm_storeh_pi(reinterpret_cast<__m64*>(b), lo);
    _mm_storeu_ps(b + 2, hi);
  }
}

// One tile's V (d, Bᵀ d B of eight channels) into the 16 V[e], at offsets at_a and
// at_b of each (store_channels). A function with AVX2 as its target, not a lambda
// (which would not inherit it, and took the vectors through memory).
template <int First>
[[gnu::always_inline]] __attribute__((target("avx2,fma"))) inline void store_tile(
    float* v, std::int64_t v_stride, std::int64_t at_a, std::int64_t at_b,
    const __m256 (&d)[4][4]) {
  for (int e = 0; e < 16; ++e) {
    store_channels<First>(v + e * v_stride + at_a, v + e * v_stride + at_b, d[e / 4][e % 4]);
  }
}

// Whether transform_block_avx2 can write V's panels: store_channels' heights.
bool avx2_v_panels(const GemmAPanels& a) {
  return a.height >= 6 && a.height % 2 == 0;
}

// transform_block on AVX2 for C and K multiples of 8: eight channels a vector, their
// input columns turned into channel vectors by load_channel_columns, eight tiles of
// a tile row at a time. Eight channels go through all the block's tile rows before
// the next eight, so that their planes are read from start to end, the next tile
// row's rows asked for ahead (prefetch_channel_row).
__attribute__((target("avx2,fma"))) void transform_block_avx2(const GradientBlock& block,
                                                              const float* x, const float* grad_y,
                                                              const Problem& problem,
                                                              std::int64_t row0,
                                                              std::int64_t row1) {
  // Copies the stores cannot reach: through the references, the compiler read the
  // sizes from memory again after every store of a tile.
  const GradientBlock b = block;
  const Problem p = problem;
  // Tile tw0 + u of a group of eight reads input columns 2u .. 2u + 3 and grad_y
  // columns 2u, 2u + 1 from the group's first: how many loads of eight columns a
  // group of `tiles` needs.
  auto loads = [](std::int64_t columns) { return static_cast<int>((columns + 7) / 8); };
  alignas(32) float in_cols[4][24][8];  // input rows 2*th - pad_h + i, columns x0 + x
  const std::int64_t height = b.v_panels.height, v_panels = b.v_panels.panels();
  for (std::int64_t c0 = 0; c0 < p.C; c0 += 8) {
    // Channel c0's panel starts at channel panel_c0; `first` of c0 .. c0 + 7 lie in it.
    const std::int64_t panel_c0 = c0 / height * height;
    const int first = static_cast<int>(std::min<std::int64_t>(8, panel_c0 + height - c0));
    for (std::int64_t row = row0; row < row1; ++row) {
      const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
      if (row + 1 < row1) {  // the rows the next tile row reads first
        const std::int64_t next_n = (row + 1) / p.tiles_h, next_th = (row + 1) % p.tiles_h;
        for (int i = next_th == 0 ? 0 : 2; i < 4; ++i) {
          const std::int64_t h = 2 * next_th - p.pad_h + i;
          if (h >= 0 && h < p.H) {
            prefetch_channel_row(x + (next_n * p.C + c0) * p.H * p.W, p.H * p.W, h, p.W);
          }
        }
      }
      for (std::int64_t tw0 = 0; tw0 < p.tiles_w; tw0 += 8) {
        const std::int64_t tiles = std::min<std::int64_t>(8, p.tiles_w - tw0);
        const int count = loads(2 * tiles + 2);
        for (int i = 0; i < 4; ++i) {
          const std::int64_t h = 2 * th - p.pad_h + i;
          if (h < 0 || h >= p.H) {
            std::fill(&in_cols[i][0][0], &in_cols[i][0][0] + 64 * count, 0.0f);
            continue;
          }
          load_channel_columns(in_cols[i], x + ((n * p.C + c0) * p.H + h) * p.W, p.H * p.W,
                               2 * tw0 - p.pad_w, p.W, count);
        }
        for (std::int64_t u = 0; u < tiles; ++u) {
          __m256 d[4][4];
          for (int i = 0; i < 4; ++i) {
            for (int j = 0; j < 4; ++j) d[i][j] = _mm256_load_ps(in_cols[i][2 * u + j]);
          }
          transform_input_tile(d);
          // Tile t's channels c0 .. in V[e]'s panels (GemmAPanels::at without its
          // divisions): `first` of them in the panel of c0, the rest in the next.
          const std::int64_t t = (row - row0) * p.tiles_w + tw0 + u;
          const std::int64_t block = t / kGemmKc * kGemmKc;
          const std::int64_t kc = std::min(kGemmKc, b.v_panels.k - block);
          const std::int64_t base = block * v_panels * height + (t - block) * height;
          const std::int64_t at_a = base + panel_c0 * kc + c0 - panel_c0;
          const std::int64_t at_b = base + (panel_c0 + height) * kc;
          switch (first) {
            case 8:
              store_tile<8>(b.v, b.v_stride, at_a, at_b, d);
              break;
            case 6:
              store_tile<6>(b.v, b.v_stride, at_a, at_b, d);
              break;
            case 4:
              store_tile<4>(b.v, b.v_stride, at_a, at_b, d);
              break;
            default:
              store_tile<2>(b.v, b.v_stride, at_a, at_b, d);
          }
        }
      }
    }
  }
  alignas(32) float dy_cols[2][16][8];  // grad_y rows 2*th + i, columns 2*tw0 + x
  for (std::int64_t k0 = 0; k0 < p.K; k0 += 8) {
    for (std::int64_t row = row0; row < row1; ++row) {
      const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
      if (row + 1 < row1) {
        const std::int64_t next_n = (row + 1) / p.tiles_h, next_th = (row + 1) % p.tiles_h;
        for (std::int64_t h = 2 * next_th; h < std::min(p.P, 2 * next_th + 2); ++h) {
          prefetch_channel_row(grad_y + (next_n * p.K + k0) * p.P * p.Q, p.P * p.Q, h, p.Q);
        }
      }
      for (std::int64_t tw0 = 0; tw0 < p.tiles_w; tw0 += 8) {
        const std::int64_t tiles = std::min<std::int64_t>(8, p.tiles_w - tw0);
        const int count = loads(2 * tiles);
        for (int i = 0; i < 2; ++i) {
          const std::int64_t h = 2 * th + i;
          if (h >= p.P) {
            std::fill(&dy_cols[i][0][0], &dy_cols[i][0][0] + 64 * count, 0.0f);
            continue;
          }
          load_channel_columns(dy_cols[i], grad_y + ((n * p.K + k0) * p.P + h) * p.Q, p.P * p.Q,
                               2 * tw0, p.Q, count);
        }
        const std::int64_t t0 = (row - row0) * p.tiles_w + tw0;
        for (std::int64_t u = 0; u < tiles; ++u) {
          __m256 d[2][2], g[16];
          for (int i = 0; i < 2; ++i) {
            for (int j = 0; j < 2; ++j) d[i][j] = _mm256_load_ps(dy_cols[i][2 * u + j]);
          }
          transform_gradient_tile(g, d);
          // Filters k0 .. k0 + 7 lie together in a panel (8 divides its width).
          float* y = b.y_at(0, t0 + u, k0);
          for (int e = 0; e < 16; ++e) _mm256_storeu_ps(y + e * b.y_stride, g[e]);
        }
      }
    }
  }
}
#endif

// The block's V and Y on the selected ISA: eight channels a vector where AVX2 runs
// and both channel counts are multiples of 8, one at a time otherwise (the same
// operations, so the same bits).
void transform_gradient_block(const GradientBlock& b, const float* x, const float* grad_y,
                              const Problem& p, std::int64_t row0, std::int64_t row1) {
#if TL_CPU_X86
  if (avx2_selected() && p.C % 8 == 0 && p.K % 8 == 0 && avx2_v_panels(b.v_panels)) {
    transform_block_avx2(b, x, grad_y, p, row0, row1);
    return;
  }
#endif
  transform_block(b, x, grad_y, p, row0, row1);
}

// w [3][3] = A₂ᵀ m A₂ for the 16 sums m of one (c, k) pair, one pair a lane of V (or
// V = float). Adds only: the same bits whatever the vector width.
template <typename V>
[[gnu::always_inline]] inline void transform_sums(V (&w)[9], const V (&m)[16]) {
  V t[3][4];  // A₂ᵀ m
  for (int j = 0; j < 4; ++j) {
    t[0][j] = m[j] + m[4 + j] + m[8 + j];
    t[1][j] = m[4 + j] - m[8 + j];
    t[2][j] = m[4 + j] + m[8 + j] + m[12 + j];
  }
  for (int r = 0; r < 3; ++r) {  // (A₂ᵀ m) A₂
    w[r * 3 + 0] = t[r][0] + t[r][1] + t[r][2];
    w[r * 3 + 1] = t[r][1] - t[r][2];
    w[r * 3 + 2] = t[r][1] + t[r][2] + t[r][3];
  }
}

#if TL_CPU_X86
// transform_weight_gradient's filters k < K / 8 * 8 of every channel, eight a vector
// (AVX2): the four-wide loop ran out of registers for the 16 rows' addresses and
// took a sixth of the weight gradient of 64 channels, once for each group of images.
// Returns the filters done.
__attribute__((target("avx2,fma"))) std::int64_t transform_weight_gradient_avx2(float* partial,
                                                                                const float* sums,
                                                                                const Problem& p) {
  const std::int64_t plane = p.C * p.K, whole = p.K / 8 * 8;  // S[e]'s size
  for (std::int64_t c = 0; c < p.C; ++c) {
    const float* m_c = sums + c * p.K;
    float* out = partial + c * 9 * p.K;
    for (std::int64_t k = 0; k < whole; k += 8) {
      __m256 m[16], w[9];
      for (int e = 0; e < 16; ++e) m[e] = _mm256_loadu_ps(m_c + e * plane + k);
      transform_sums(w, m);
      for (int i = 0; i < 9; ++i) _mm256_storeu_ps(out + i * p.K + k, w[i]);
    }
  }
  return whole;
}
#endif

// partial[(c*9 + r*3 + s) * K + k] = (A₂ᵀ S[c,k] A₂)[r][s] from S [16][C][K]: the
// weight gradient in the transposed layout of conv2d.cpp's partials, eight filters a
// vector on AVX2, then four, then one.
void transform_weight_gradient(float* partial, const float* sums, const Problem& p) {
  const std::int64_t plane = p.C * p.K;  // S[e]'s size
  std::int64_t done = 0;                 // the filters of every channel done
#if TL_CPU_X86
  if (avx2_selected()) done = transform_weight_gradient_avx2(partial, sums, p);
#endif
  for (std::int64_t c = 0; c < p.C; ++c) {
    const float* m_c = sums + c * p.K;
    float* out = partial + c * 9 * p.K;
    std::int64_t k = done;
    for (; k + 4 <= p.K; k += 4) {
      Vec4 m[16], w[9];
      for (int e = 0; e < 16; ++e) m[e] = load4(m_c + e * plane + k);
      transform_sums(w, m);
      for (int i = 0; i < 9; ++i) store4(out + i * p.K + k, w[i]);
    }
    for (; k < p.K; ++k) {
      float m[16], w[9];
      for (int e = 0; e < 16; ++e) m[e] = m_c[e * plane + k];
      transform_sums(w, m);
      for (int i = 0; i < 9; ++i) out[i * p.K + k] = w[i];
    }
  }
}

// The sizes of the weight gradient's workspace: V and Y of a whole block of tile
// rows (in the GEMM's panels), then S.
struct GradientWorkspace {
  std::int64_t per_block;  // tile rows a block
  GemmAPanels whole_v;     // a whole block's V[e]
  GemmBPanels whole;       // a whole block's Y[e]
  std::int64_t v_stride, y_stride, sum_floats;

  explicit GradientWorkspace(const Problem& p)
      : per_block(rows_per_block(p)),
        whole_v(gemm_a_panels(p.C, per_block * p.tiles_w)),
        whole(gemm_b_panels(per_block * p.tiles_w, p.K)),
        v_stride(spread_stride(whole_v.floats())),
        y_stride(spread_stride(whole.floats())),
        sum_floats(16 * p.C * p.K) {}
  std::int64_t floats() const { return 16 * (v_stride + y_stride) + sum_floats; }
};

Problem weight_problem(std::int64_t images, const Conv2dShape& s) {
  return make_problem(images, s.C, s.H, s.W, s.K, s.params.pad_h, s.params.pad_w);
}

}  // namespace

std::int64_t winograd_weight_grad_scratch(const Conv2dShape& s) {
  return GradientWorkspace(weight_problem(1, s)).floats();
}

void winograd_weight_grad(float* partial, const float* x, const float* grad_y, std::int64_t images,
                          const Conv2dShape& s, float* workspace) {
  const Problem p = weight_problem(images, s);
  const GradientWorkspace sizes(p);
  const std::int64_t all_rows = p.N * p.tiles_h;
  float* v = workspace;
  float* y = v + 16 * sizes.v_stride;
  float* sums = y + 16 * sizes.y_stride;  // S [16][C][K]
  if (all_rows == 0) std::fill(sums, sums + sizes.sum_floats, 0.0f);
  // The panels' rows past C and columns past K may be read, their products never
  // used: zeros to begin with (where a shorter last block's panels lie otherwise, an
  // earlier block's values).
  if (p.C % sizes.whole_v.height != 0) std::fill(v, y, 0.0f);
  if (p.K % sizes.whole.width != 0) std::fill(y, sums, 0.0f);
  for (std::int64_t row0 = 0; row0 < all_rows; row0 += sizes.per_block) {
    const std::int64_t row1 = std::min(all_rows, row0 + sizes.per_block);
    const std::int64_t tiles = (row1 - row0) * p.tiles_w;
    GemmAPanels v_panels = sizes.whole_v;
    GemmBPanels y_panels = sizes.whole;
    v_panels.k = y_panels.k = tiles;
    const GradientBlock b{v, y, v_panels, y_panels, sizes.v_stride, sizes.y_stride};
    transform_gradient_block(b, x, grad_y, p, row0, row1);
    for (int e = 0; e < 16; ++e) {
      gemm_packed_ab(v_panels, b.v_of(e), y_panels, b.y_of(e), row0 == 0 ? 0.0f : 1.0f,
                     sums + e * p.C * p.K, p.K);
    }
  }
  transform_weight_gradient(partial, sums, p);
}

}  // namespace towerlab::cpu
