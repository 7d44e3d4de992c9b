// The weight gradient of a conv2d of stride 1 or 2 on bfloat16 operands from
// zero-padded planes (kernels/cpu/conv2d_planes_bf16.h tells the design and the
// contract; the forward is in conv2d_planes_bf16.cpp).
//
// For each image, grad_y[k] is copied onto the padded grid (rows Wp apart, zeros at
// the thrown-away positions q >= Q and up to a whole vector past the last row) and
// x[c] into a plane padded by (pad_h, pad_w); then
//   partial[k, (c, r, s)] = Σ_n Σ_o grid_k[o] · plane_c[o + r dilation_h Wp + s dilation_w],
// thirty-two o a step: one aligned load of the grid and one unaligned load of the
// plane (an odd offset is a two-byte shift, nothing more) are sixteen matching
// pairs for vdpbf16ps. At a stride of 2 the plane is split into its four phases, as
// the forward splits it (planes_grid: rows Wq apart, the grid's too), and tap (r, s)
// reads its phase at o + planes_tap_offset: the same sums over the same grid. A tile
// is kFilters filters by kTaps taps (c, r, s), each accumulator a vector of sixteen
// lane sums that runs over every step of every image of the call, in order, before
// its lanes are added up in one fixed tree.
//
// All the images of a call are prepared first, then every tile runs over all of them:
// the products outnumber the copies by K or C times R S, and a tile reads its grids
// and planes well enough from the last-level cache. Only a call with more images than
// kBlockBytes holds is cut into blocks, to bound the scratch; between blocks the
// accumulators rest in `lanes` as float32 vectors, stored and reloaded exactly, so
// each lane still adds its products image by image in order and the bits do not
// depend on the blocks. (Blocks small enough for the L2 cache were tried: they gain
// little, storing and reloading the lanes costing about what the cache saves.)
//
// A hazard the lowering does not have: a thrown-away position multiplies a zero of
// the grid by a real pixel (the next row's), so an infinite or NaN x reaches taps
// that the definition never pairs it with (0 · inf is NaN). Finite values add
// exact zeros there.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "kernels/cpu/conv2d_planes_bf16.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

#if TL_CPU_X86

// The tile: 24 accumulators of the 32 zmm registers, as the vdpbf16ps GEMM's; the
// four grid vectors of a step stay in registers while each tap's plane vector is
// loaded once and used four times, ten loads for 24 products.
constexpr int kFilters = 4, kTaps = 6;
constexpr std::int64_t kStep = 32;  // bfloat16 values of one vector: sixteen pairs
// The most bytes of grids and planes a block of images takes (at least one image).
constexpr std::int64_t kBlockBytes = 4096 * 1024;

// One image's padded grid and planes, in bfloat16 values, and the images of a block.
struct Layout {
  std::int64_t sh, sw, wp, hp;  // planes_grid's: the phases, each hp rows wp apart
  std::int64_t grid;            // values of a grid: (P-1) Wp + Q, rounded up to whole steps
  std::int64_t phase;           // values of a phase: Hp Wp, or what the farthest tap reads
  std::int64_t plane;           // values of a plane: its sh x sw phases one after another
  std::int64_t images;          // images a block
};

Layout layout_of(const Conv2dShape& s, std::int64_t count) {
  const PlanesGrid g = planes_grid(s);
  Layout l{};
  l.sh = g.sh;
  l.sw = g.sw;
  l.wp = g.wp;
  l.hp = g.hp;
  const auto whole_steps = [](std::int64_t v) { return (v + kStep - 1) / kStep * kStep; };
  l.grid = whole_steps(g.outputs);
  l.phase = whole_steps(std::max(l.hp * l.wp, l.grid + g.farthest));
  l.plane = l.sh * l.sw * l.phase;
  const std::int64_t image_bytes = 2 * (s.K * l.grid + s.C * l.plane);
  const std::int64_t most = std::clamp<std::int64_t>(kBlockBytes / image_bytes, 1, count);
  const std::int64_t blocks = (count + most - 1) / most;
  l.images = (count + blocks - 1) / blocks;  // blocks of nearly equal size
  return l;
}

// The first `count` (at least 1) of 32 lanes.
__attribute__((target("avx512f,avx512bw"))) inline __mmask32 first_values(std::int64_t count) {
  return _cvtu32_mask32(count >= kStep ? ~0u : (1u << count) - 1);
}

// to[0, count) <- from[0, count).
__attribute__((target("avx512f,avx512bw"))) inline void copy_row(std::uint16_t* to,
                                                                 const std::uint16_t* from,
                                                                 std::int64_t count) {
  for (std::int64_t j = 0; j < count; j += kStep) {
    const __mmask32 lanes = first_values(count - j);
    _mm512_mask_storeu_epi16(to + j, lanes, _mm512_maskz_loadu_epi16(lanes, from + j));
  }
}

// to[0, count) <- zeros, count a whole number of steps and `to` 64-byte aligned. Each
// grid and plane is zeroed so, then its rows copied in: fewer stores, and full
// aligned ones, than writing the zeros between the rows alone.
__attribute__((target("avx512f"))) inline void zero_steps(std::uint16_t* to, std::int64_t count) {
  for (std::int64_t j = 0; j < count; j += kStep)
    _mm512_store_si512(to + j, _mm512_setzero_si512());
}

// The fills below copy an array [images, outers, count] plane by plane in another
// order, outer index outer, image inner: short runs far apart, which the hardware
// prefetcher did not follow in time. Each copy of (outer, n) asks for the plane two
// on in that order, image n + 2 or the next outer index's first, if there is one
// (bench/results/conv2d_bf16_planes_prefetch_zen5_5b227cb.md).
inline void prefetch_two_on(const std::uint16_t* array, std::int64_t outer, std::int64_t n,
                            std::int64_t outers, std::int64_t images, std::int64_t count) {
  const std::int64_t ahead = outer * images + n + 2;
  if (ahead < outers * images) {
    prefetch_bytes(array + (ahead % images * outers + ahead / images) * count, 2 * count);
  }
}

// grids [K][images][grid] <- grad_y [images, K, P, Q]: row p at p Wp, zeros at
// q >= Q and after the last row.
__attribute__((target("avx512f,avx512bw"))) void fill_grids(std::uint16_t* grids,
                                                            const bfloat16* grad_y,
                                                            std::int64_t images,
                                                            const Conv2dShape& s, const Layout& l) {
  const auto* g = reinterpret_cast<const std::uint16_t*>(grad_y);
  const std::int64_t pq = s.P * s.Q;
  for (std::int64_t k = 0; k < s.K; ++k) {
    for (std::int64_t n = 0; n < images; ++n) {
      std::uint16_t* grid = grids + (k * l.images + n) * l.grid;
      const std::uint16_t* rows = g + (n * s.K + k) * pq;
      prefetch_two_on(g, k, n, s.K, images, pq);
      zero_steps(grid, l.grid);
      for (std::int64_t p = 0; p < s.P; ++p) copy_row(grid + p * l.wp, rows + p * s.Q, s.Q);
    }
  }
}

// A padded row across a stride of 2: from[j], j < count, is padded column column + j,
// which lies in phase (column + j) % 2 at (column + j) / 2; `row` points at the row in
// the plane's first phase, the second `phase` values after it. One permute a load
// puts its even values in its low half and its odd ones in its high half, each half
// a run of one phase.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void copy_row_phases(
    std::uint16_t* row, std::int64_t phase, const std::uint16_t* from, std::int64_t count,
    std::int64_t column) {
  alignas(64) static constexpr std::uint16_t kEvensThenOdds[kStep] = {
      0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
      1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const __m512i order = _mm512_load_si512(kEvensThenOdds);
  for (std::int64_t j = 0; j < count; j += kStep, column += kStep) {
    const std::int64_t n = std::min(kStep, count - j);
    // (Zero-masking forms keeping every lane: GCC 12's unmasked ones warn of an
    // uninitialized operand.)
    const __m512i split = _mm512_maskz_permutexvar_epi16(
        ~__mmask32{0}, order, _mm512_maskz_loadu_epi16(first_values(n), from + j));
    _mm256_mask_storeu_epi16(row + column % 2 * phase + column / 2, first_lanes((n + 1) / 2),
                             _mm512_maskz_extracti64x4_epi64(0xFF, split, 0));
    _mm256_mask_storeu_epi16(row + (column + 1) % 2 * phase + (column + 1) / 2, first_lanes(n / 2),
                             _mm512_maskz_extracti64x4_epi64(0xFF, split, 1));
  }
}

// planes [C][images][plane] <- x [images, C, H, W]: pixel (h, w) at padded row
// h + pad_h and column w + pad_w, in its phase (planes_grid), zeros around it.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void fill_planes(std::uint16_t* planes,
                                                                      const bfloat16* x,
                                                                      std::int64_t images,
                                                                      const Conv2dShape& s,
                                                                      const Layout& l) {
  const auto* pixels = reinterpret_cast<const std::uint16_t*>(x);
  const std::int64_t pad_h = s.params.pad_h, pad_w = s.params.pad_w;
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t n = 0; n < images; ++n) {
      std::uint16_t* plane = planes + (c * l.images + n) * l.plane;
      const std::uint16_t* rows = pixels + (n * s.C + c) * s.H * s.W;
      prefetch_two_on(pixels, c, n, s.C, images, s.H * s.W);
      zero_steps(plane, l.plane);
      for (std::int64_t h = 0; h < s.H; ++h) {
        // Padded row h + pad_h: row (h + pad_h) / sh of the phases (h + pad_h) % sh.
        std::uint16_t* row =
            plane + (h + pad_h) % l.sh * l.sw * l.phase + (h + pad_h) / l.sh * l.wp;
        if (l.sw == 1) {
          copy_row(row + pad_w, rows + h * s.W, s.W);
        } else {
          copy_row_phases(row, l.phase, rows + h * s.W, s.W, pad_w);
        }
      }
    }
  }
}

// Sixteen totals at once: lane q of the result is the sum of v[q]'s sixteen lanes,
// added in one fixed tree, the same for every q (lane j and j + 8, then j and j + 4,
// then j and j + 2, then lanes 0 and 1). Between the steps shuffles pack the halves
// of two, four, eight, then sixteen sums into one vector, so that a tile's totals cost
// a few instructions each: one reduction a sum cost as much as the products of a call
// of a few small images.
__attribute__((target("avx512f"))) inline __m512 lane_totals(const __m512 (&v)[16]) {
  __m512 eight[8], four[4], two[2];
  for (int m = 0; m < 8; ++m) {  // j + (j + 8): sums 2m and 2m + 1, eight lanes each
    eight[m] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, v[2 * m], v[2 * m + 1], 0x44),
                             _mm512_maskz_shuffle_f32x4(0xFFFF, v[2 * m], v[2 * m + 1], 0xEE));
  }
  for (int m = 0; m < 4; ++m) {  // j + (j + 4): sums 4m .. 4m + 3, a quarter each
    four[m] =
        _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, eight[2 * m], eight[2 * m + 1], 0x88),
                      _mm512_maskz_shuffle_f32x4(0xFFFF, eight[2 * m], eight[2 * m + 1], 0xDD));
  }
  for (int m = 0; m < 2; ++m) {  // j + (j + 2): quarter b, sums 8m + b and 8m + b + 4
    two[m] = _mm512_add_ps(
        _mm512_maskz_shuffle_ps(0xFFFF, four[2 * m], four[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
        _mm512_maskz_shuffle_ps(0xFFFF, four[2 * m], four[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // 0 + 1: quarter b holds sums b, b + 4, b + 8, b + 12; then lane q back at q.
  const __m512 one =
      _mm512_add_ps(_mm512_maskz_shuffle_ps(0xFFFF, two[0], two[1], _MM_SHUFFLE(2, 0, 2, 0)),
                    _mm512_maskz_shuffle_ps(0xFFFF, two[0], two[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_maskz_permutexvar_ps(
      0xFFFF, _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), one);
}

// Where a tile's sums start and end. Between blocks its accumulators rest in `lanes`
// [K][C*R*S][16] (the tile's at k0 C*R*S + t0, rows C*R*S vectors apart); after the
// call's last block their totals go to partial[k0, t0 ..] (rows C*R*S apart).
struct TileOut {
  float* lanes;      // the tile's first vector
  bool resume;       // start from the lanes (an earlier block's), not from zero
  float* partial;    // the tile's first total, or null: another block follows
  std::int64_t row;  // C*R*S
};

// The sums of filters k0 .. k0 + Filters - 1 by taps t0 .. t0 + Taps - 1 over a block's
// images: grid points at filter k0's grid of image 0 (filters `filter_stride` apart),
// tap[j] at tap t0 + j's plane of image 0, shifted by the tap's offset. The loops over
// i and j are unrolled by pragma: at -O2 (RelWithDebInfo) GCC leaves some rolled, and
// the accumulators then live in memory.
template <int Filters, int Taps>
__attribute__((target("avx512f,avx512bf16"))) void tile_sums(const std::uint16_t* grid,
                                                             std::int64_t filter_stride,
                                                             const std::uint16_t* const* tap,
                                                             const Layout& l, std::int64_t images,
                                                             const TileOut& out) {
  // The starting values loaded through one pointer, from zeros or from the lanes: a
  // choice per accumulator made the compiler build them on the stack.
  alignas(64) static constexpr float kZeros[kFilters * kTaps * 16] = {};
  const float* start = out.resume ? out.lanes : kZeros;
  const std::int64_t start_ld = out.resume ? 16 * out.row : 16 * kTaps;
  __m512 acc[Filters][Taps];
#pragma GCC unroll 4
  for (int i = 0; i < Filters; ++i) {
#pragma GCC unroll 6
    for (int j = 0; j < Taps; ++j) acc[i][j] = _mm512_loadu_ps(start + i * start_ld + 16 * j);
  }
  // One loop over the steps of all the images, which lie end to end in the grids; in
  // the planes each image is `skip` values longer, added to `shift` at an image's
  // last step without a branch (an exit from a loop over one image's few steps is a
  // misprediction an image).
  const std::int64_t steps = l.grid / kStep, skip = l.plane - l.grid, end = images * l.grid;
  std::int64_t u = 0, shift = 0, left = steps;
  do {
    __m512bh a[Filters];
#pragma GCC unroll 4
    for (int i = 0; i < Filters; ++i)
      a[i] = (__m512bh)_mm512_load_si512(grid + i * filter_stride + u);
#pragma GCC unroll 6
    for (int j = 0; j < Taps; ++j) {
      const __m512bh b = (__m512bh)_mm512_loadu_si512(tap[j] + u + shift);
#pragma GCC unroll 4
      for (int i = 0; i < Filters; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a[i], b);
    }
    u += kStep;
    const bool last_step = --left == 0;
    shift += last_step ? skip : 0;
    left = last_step ? steps : left;
  } while (u < end);
  if (out.partial == nullptr) {
#pragma GCC unroll 4
    for (int i = 0; i < Filters; ++i) {
#pragma GCC unroll 6
      for (int j = 0; j < Taps; ++j) {
        _mm512_storeu_ps(out.lanes + i * 16 * out.row + 16 * j, acc[i][j]);
      }
    }
    return;
  }
  // The totals, sixteen accumulators at a time in (i, j) order, zeros after the last.
  constexpr int kSums = Filters * Taps, kGroups = (kSums + 15) / 16;
  alignas(64) float totals[kGroups * 16];
#pragma GCC unroll 2
  for (int g = 0; g < kGroups; ++g) {
    __m512 group[16];
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) {
      const int a = 16 * g + q;
      group[q] = a < kSums ? acc[a / Taps][a % Taps] : _mm512_setzero_ps();
    }
    _mm512_store_ps(totals + 16 * g, lane_totals(group));
  }
  for (int i = 0; i < Filters; ++i) {
    for (int j = 0; j < Taps; ++j) out.partial[i * out.row + j] = totals[i * Taps + j];
  }
}

// The tile for Filters x Taps, the full one or a smaller one at the edges: every
// size adds the same products in the same order, so a sum's bits do not depend on
// which tile computed it.
using TileSums = void (*)(const std::uint16_t*, std::int64_t, const std::uint16_t* const*,
                          const Layout&, std::int64_t, const TileOut&);

template <std::size_t... F, std::size_t... T>
constexpr auto tile_table(std::index_sequence<F...>, std::index_sequence<T...>) {
  const auto row = []<std::size_t Fi>(std::integral_constant<std::size_t, Fi>) {
    return std::array<TileSums, kTaps>{&tile_sums<int(Fi) + 1, int(T) + 1>...};
  };
  return std::array<std::array<TileSums, kTaps>, kFilters>{
      row(std::integral_constant<std::size_t, F>{})...};
}

TileSums tile_for(std::int64_t filters, std::int64_t taps) {
  static constexpr auto table =
      tile_table(std::make_index_sequence<kFilters>{}, std::make_index_sequence<kTaps>{});
  return table[filters - 1][taps - 1];
}

// The call in its steps: the layout and the scratch, the taps' plane pointers, then
// for each block its grids, its planes and every tile over them.
void weight_grad_planes(float* partial, const bfloat16* x, const bfloat16* grad_y,
                        std::int64_t first, std::int64_t last, const Conv2dShape& s) {
  const Layout l = layout_of(s, last - first);
  const PlanesGrid g = planes_grid(s);
  const std::int64_t taps = s.C * s.R * s.S;
  HostScratch<std::uint16_t> grids(s.K * l.images * l.grid);
  HostScratch<std::uint16_t> planes(s.C * l.images * l.plane);
  const bool blocks = last - first > l.images;
  HostScratch<float> lanes(blocks ? s.K * taps * 16 : 0);
  // Tap t = (c, r, s)'s plane of image 0 in the block, shifted by the tap's offset.
  HostScratch<const std::uint16_t*> tap(taps);
  const std::uint16_t** next = tap.get();
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t r = 0; r < s.R; ++r) {
      for (std::int64_t j = 0; j < s.S; ++j) {
        *next++ = planes.get() + c * l.images * l.plane + planes_tap_phase(s, g, r, j) * l.phase +
                  planes_tap_offset(s, g, r, j);
      }
    }
  }
  for (std::int64_t n0 = first; n0 < last; n0 += l.images) {
    const std::int64_t images = std::min(l.images, last - n0);
    fill_grids(grids.get(), grad_y + n0 * s.K * s.P * s.Q, images, s, l);
    fill_planes(planes.get(), x + n0 * s.C * s.H * s.W, images, s, l);
    const bool resume = n0 > first, finish = n0 + images >= last;
    for (std::int64_t k0 = 0; k0 < s.K; k0 += kFilters) {
      const std::int64_t filters = std::min<std::int64_t>(kFilters, s.K - k0);
      const std::uint16_t* grid = grids.get() + k0 * l.images * l.grid;
      for (std::int64_t t0 = 0; t0 < taps; t0 += kTaps) {
        const std::int64_t width = std::min<std::int64_t>(kTaps, taps - t0);
        const TileOut out{blocks ? lanes.get() + (k0 * taps + t0) * 16 : nullptr, resume,
                          finish ? partial + k0 * taps + t0 : nullptr, taps};
        tile_for(filters, width)(grid, l.images * l.grid, tap.get() + t0, l, images, out);
      }
    }
  }
}

#endif  // TL_CPU_X86

}  // namespace

void bf16_planes_weight_grad(float* partial, const bfloat16* x, const bfloat16* grad_y,
                             std::int64_t first, std::int64_t last, const Conv2dShape& s) {
  if (last <= first) {  // no images: a sum of nothing
    std::fill(partial, partial + s.K * s.C * s.R * s.S, 0.0f);
    return;
  }
#if TL_CPU_X86
  weight_grad_planes(partial, x, grad_y, first, last, s);
#else
  (void)x, (void)grad_y;
  std::abort();  // bf16_planes_apply is false off x86: never called
#endif
}

}  // namespace towerlab::cpu
