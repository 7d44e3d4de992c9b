// The blocked path's input and output transforms of CPU Winograd on AVX2 and AVX-512
// (steps 2 of kernels/cpu/winograd.cpp's header, which chooses among them; what the
// files share: kernels/cpu/winograd_steps.h). The input transforms write V straight
// into the GEMM's panels of B, the output transforms read M once into the output
// rows; each lane does the portable transforms' arithmetic in their order.
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/winograd_steps.h"
#include "kernels/cpu/x86.h"

#if TL_CPU_X86

namespace towerlab::cpu::winograd {

namespace {

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

}  // namespace

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

namespace {

// transform_output_avx2's plane k where a tile row has four tiles (ResNet-20's 7x7
// stage, P and Q of 7 or 8): two tile rows a vector, row's tiles in lanes 0 .. 3 and
// row + 1's in lanes 4 .. 7 (M holds a block's tiles end to end), where one row a
// vector left half the lanes unused. Each lane's arithmetic is output_row's, as
// before: the same bits. The last row of an odd count reads four columns of M past
// the block's tiles (winograd.cpp's run() leaves room) and writes only its own pixels.
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

}  // namespace

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

template void transform_output_avx2<float>(const Workspace&, float*, const float*, bool,
                                           const Problem&, std::int64_t, std::int64_t);
template void transform_output_avx2<bfloat16>(const Workspace&, bfloat16*, const float*, bool,
                                              const Problem&, std::int64_t, std::int64_t);
template void transform_output_avx2<float16>(const Workspace&, float16*, const float*, bool,
                                             const Problem&, std::int64_t, std::int64_t);
template void transform_output_avx512<float>(const Workspace&, float*, const float*, bool,
                                             const Problem&, std::int64_t, std::int64_t);
template void transform_output_avx512<bfloat16>(const Workspace&, bfloat16*, const float*, bool,
                                                const Problem&, std::int64_t, std::int64_t);
template void transform_output_avx512<float16>(const Workspace&, float16*, const float*, bool,
                                               const Problem&, std::int64_t, std::int64_t);

}  // namespace towerlab::cpu::winograd

#endif  // TL_CPU_X86
