// The forward of conv2d on bfloat16 operands from zero-padded planes of channel
// pairs, split into phases at a stride of 2 (kernels/cpu/conv2d_planes_bf16.h tells
// the design; the weight gradient is in conv2d_planes_bf16_weight_grad.cpp).
#include "kernels/cpu/conv2d_planes_bf16.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/conv2d_lowering.h"
#include "kernels/cpu/convert16.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

// The tile: kFilters filters by kVecs vectors of sixteen grid positions, 24 of the
// 32 zmm registers as accumulators, as the vdpbf16ps GEMM's 12 x 32 tile; 8 rows
// rather than 12 because the layers this path is for have K = 16, 32 or 64 (12
// would leave a 4-row tile a block), and three vectors of B a step to 8 broadcasts
// keep the loads below the products.
constexpr int kFilters = 8, kVecs = 3, kTile = 16 * kVecs;

// The padded grid of one image (planes_grid), the tiles covering its positions, the
// words each phase takes, enough that the last tile's farthest tap reads inside it,
// and a channel pair's, its sh x sw phases one after another.
struct Grid : PlanesGrid {
  std::int64_t tiles, phase_words, plane_words;
};

Grid grid_of(const Conv2dShape& s) {
  Grid g{planes_grid(s), 0, 0, 0};
  g.tiles = (g.outputs + kTile - 1) / kTile;
  const std::int64_t words = std::max(g.hp * g.wp, g.tiles * kTile + g.farthest);
  g.phase_words = (words + 15) / 16 * 16;
  g.plane_words = g.sh * g.sw * g.phase_words;
  return g;
}

std::int64_t channel_pairs(const Conv2dShape& s) {
  return (s.C + 1) / 2;
}

#if TL_CPU_X86

// planes [ceil(C/2), plane_words] <- image x [C, H, W]: pair c' holds, at padded
// pixel (h + pad_h, w + pad_w) of its phases (planes_grid), x[2c', h, w] in the
// word's low half and x[2c' + 1, h, w] (zero past C) in its high half. Only the
// image's own pixels are written: the padding was zeroed with the scratch and stays
// zero. Across a stride of 2 the sixteen words of a load go to two phases, the even
// and the odd padded columns, eight and eight, by one permute.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void fill_planes(std::uint32_t* planes,
                                                                      const bfloat16* x,
                                                                      const Conv2dShape& s,
                                                                      const Grid& g) {
  const std::int64_t hw = s.H * s.W, pad_h = s.params.pad_h, pad_w = s.params.pad_w;
  // Lanes 0-7 the even lanes of a load, 8-15 the odd ones.
  const __m512i evens_then_odds =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (std::int64_t cp = 0; cp < channel_pairs(s); ++cp) {
    const bfloat16* even = x + 2 * cp * hw;
    const bfloat16* odd = 2 * cp + 1 < s.C ? even + hw : nullptr;
    std::uint32_t* pair = planes + cp * g.plane_words;
    for (std::int64_t h = 0; h < s.H; ++h) {
      // Padded row h + pad_h: row (h + pad_h) / sh of phase row (h + pad_h) % sh.
      std::uint32_t* row =
          pair + (h + pad_h) % g.sh * g.sw * g.phase_words + (h + pad_h) / g.sh * g.wp;
      for (std::int64_t w = 0; w < s.W; w += 16) {
        const std::int64_t n = std::min<std::int64_t>(16, s.W - w);
        const __mmask16 lanes = first_lanes(n);
        const __m512i lo =
            _mm512_maskz_cvtepu16_epi32(lanes, _mm256_maskz_loadu_epi16(lanes, even + h * s.W + w));
        __m512i word = lo;
        if (odd != nullptr) {
          const __m512i hi = _mm512_maskz_cvtepu16_epi32(
              lanes, _mm256_maskz_loadu_epi16(lanes, odd + h * s.W + w));
          word = _mm512_or_si512(lo, _mm512_maskz_slli_epi32(lanes, hi, 16));
        }
        const std::int64_t column = w + pad_w;  // the load's first padded column
        if (g.sw == 1) {
          _mm512_mask_storeu_epi32(row + column, lanes, word);
          continue;
        }
        // Lane l is padded column column + l: phase (column + l) % 2, at (column + l) / 2.
        // The even lanes (ceil(n / 2) of them) start phase column % 2 at column / 2,
        // the odd ones (n / 2) the other phase at (column + 1) / 2.
        // (Zero-masking forms keeping every lane: GCC 12's unmasked ones warn of an
        // uninitialized operand.)
        const __m512i split = _mm512_maskz_permutexvar_epi32(0xFFFF, evens_then_odds, word);
        std::uint32_t* first = row + column % 2 * g.phase_words + column / 2;
        std::uint32_t* second = row + (column + 1) % 2 * g.phase_words + (column + 1) / 2;
        _mm512_mask_storeu_epi32(first, first_lanes((n + 1) / 2), split);
        _mm256_mask_storeu_epi32(second, static_cast<__mmask8>(first_lanes(n / 2)),
                                 _mm512_maskz_extracti64x4_epi64(0xFF, split, 1));
      }
    }
  }
}

// Where one vector of sixteen grid positions lands in a plane of y: its real lanes
// (o < outputs, q < Q) and how many real positions come before its first lane. The
// real positions in grid order are y's, one after another, so a vector's real lanes
// compressed to the front of the register go to y + start as one run, the first
// popcount(real) lanes (`run`).
struct VectorPlace {
  std::int64_t start;
  __mmask16 real, run;
};

// The places of the grid's tiles * kVecs vectors.
void place_vectors(VectorPlace* places, const Conv2dShape& s, const Grid& g) {
  for (std::int64_t u = 0; u < g.tiles * kVecs; ++u) {
    const std::int64_t o0 = 16 * u;
    places[u].start = o0 / g.wp * s.Q + std::min(o0 % g.wp, s.Q);
    places[u].real = 0;
    for (std::int64_t j = 0; j < 16; ++j) {
      const std::int64_t o = o0 + j;
      if (o < g.outputs && o % g.wp < s.Q) places[u].real |= __mmask16(1u << j);
    }
    places[u].run = __mmask16((1u << __builtin_popcount(places[u].real)) - 1);
  }
}

// Where one tile's outputs go: `filters` (at most kFilters) planes of one image's y,
// `pq` apart from y (the tile block's first filter's), each with its bias (null: 0),
// or added onto (`accumulate`, float32 y only, bias null).
template <typename Out>
struct TileOut {
  Out* y;
  std::int64_t pq;
  int filters;
  const float* bias;
  bool accumulate;
};

// One tile: sums[i, o0 + j] = Σ over channel pairs c' and taps t of
// packed[c', t, i] · plane_c'[o0 + j + offset[t]], the products of each word's pair
// exact and added in float32 by vdpbf16ps, then each vector's real lanes compressed
// to the front of a register (vcompressps) and stored under the mask of its first
// lanes as bias + sums, y + sums, or a bfloat16 y rounded once from bias + sums. `planes`
// points at o0 in plane 0, `w` at the tile's filter block, `places` at its first
// vector's place.
template <typename Out>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void tile(
    const std::uint32_t* planes, std::int64_t plane_words, std::int64_t pairs,
    const std::uint32_t* w, const std::int64_t* offsets, std::int64_t taps,
    const VectorPlace* places, const TileOut<Out>& out) {
  __m512 acc[kFilters][kVecs];
  for (int i = 0; i < kFilters; ++i) {
    for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (std::int64_t cp = 0; cp < pairs; ++cp) {
    const std::uint32_t* plane = planes + cp * plane_words;
    for (std::int64_t t = 0; t < taps; ++t) {
      const std::uint32_t* at = plane + offsets[t];
      __m512bh b[kVecs];
      for (int v = 0; v < kVecs; ++v) b[v] = (__m512bh)_mm512_loadu_si512(at + 16 * v);
#pragma GCC unroll 8
      for (int i = 0; i < kFilters; ++i) {
        const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(w[i]));
        for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
      }
      w += kFilters;
    }
  }
  for (int v = 0; v < kVecs; ++v) {
    const __mmask16 real = places[v].real, run = places[v].run;
    if (real == 0) continue;  // past the grid's last output
#pragma GCC unroll 8
    for (int i = 0; i < kFilters; ++i) {
      if (i == out.filters) break;
      Out* to = out.y + i * out.pq + places[v].start;
      const __m512 sum = _mm512_maskz_compress_ps(real, acc[i][v]);
      const __m512 base = _mm512_set1_ps(out.bias != nullptr ? out.bias[i] : 0.0f);
      if constexpr (std::is_same_v<Out, float>) {
        const __m512 onto = out.accumulate ? _mm512_maskz_loadu_ps(run, to) : base;
        _mm512_mask_storeu_ps(to, run, _mm512_add_ps(onto, sum));
      } else {
        const __m512i bits = float_to_bfloat16_16(_mm512_add_ps(base, sum));
        _mm256_mask_storeu_epi16(to, run, _mm512_maskz_cvtepi32_epi16(run, bits));
      }
    }
  }
}

// The images [first, last), each image's tiles straight into its y: float32 (bias +,
// or +=), or a 16-bit y rounded once from bias + the sums.
template <typename Out>
void forward_images(Out* y, const bfloat16* x, const std::uint32_t* packed, const float* bias,
                    bool accumulate, std::int64_t first, std::int64_t last, const Conv2dShape& s) {
  const Grid g = grid_of(s);
  const std::int64_t pairs = channel_pairs(s), taps = s.R * s.S, pq = s.P * s.Q;
  const std::int64_t blocks = (s.K + kFilters - 1) / kFilters;
  HostScratch<std::int64_t> offsets(taps);  // from a pair's first phase
  for (std::int64_t r = 0; r < s.R; ++r) {
    for (std::int64_t c = 0; c < s.S; ++c) {
      offsets.get()[r * s.S + c] =
          planes_tap_phase(s, g, r, c) * g.phase_words + planes_tap_offset(s, g, r, c);
    }
  }
  HostScratch<VectorPlace> places(g.tiles * kVecs);
  place_vectors(places.get(), s, g);
  HostScratch<std::uint32_t> planes(pairs * g.plane_words);
  std::memset(planes.get(), 0,
              static_cast<std::size_t>(pairs * g.plane_words) * sizeof(std::uint32_t));
  const std::int64_t chw = s.C * s.H * s.W, kpq = s.K * pq;
  for (std::int64_t n = first; n < last; ++n) {
    fill_planes(planes.get(), x + n * chw, s, g);
    // While image n's tiles run, the next image's x and image n's y come into cache
    // (kernels/cpu/prefetch.h): in a training step neither was there when the fill and
    // the tiles' stores reached it, neither pass a stream the hardware prefetcher
    // followed in time (bench/results/conv2d_bf16_planes_prefetch_zen5_5b227cb.md).
    SpreadPrefetch next_x(x + (n + 1) * chw,
                          n + 1 < last ? chw * std::int64_t{sizeof(bfloat16)} : 0,
                          blocks * g.tiles);
    SpreadPrefetch this_y(y + n * kpq, kpq * std::int64_t{sizeof(Out)}, blocks * g.tiles);
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::uint32_t* w = packed + b * pairs * taps * kFilters;
      const TileOut<Out> out{y + n * kpq + b * kFilters * pq, pq,
                             static_cast<int>(std::min<std::int64_t>(kFilters, s.K - b * kFilters)),
                             bias != nullptr ? bias + b * kFilters : nullptr, accumulate};
      for (std::int64_t t = 0; t < g.tiles; ++t) {
        next_x.load();
        this_y.store();
        tile(planes.get() + t * kTile, g.plane_words, pairs, w, offsets.get(), taps,
             places.get() + t * kVecs, out);
      }
    }
  }
}

#endif  // TL_CPU_X86

}  // namespace

bool bf16_planes_apply(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  const auto one_or_two = [](std::int64_t stride) { return stride == 1 || stride == 2; };
  if (!one_or_two(p.stride_h) || !one_or_two(p.stride_w) || p.groups != 1 ||
      !cpu_has_avx512_bf16() || conv2d_algorithm() != Conv2dAlgorithm::Auto || !needs_lowering(s)) {
    return false;  // a layer that needs no lowering multiplies x as it is
  }
  // Each tile's stores and each image's planes are paid for by its sums: a
  // reduction of fewer than 32 pair steps (FashionNet's first layer, one channel
  // of 3x3 taps: 9) or a block of eight filters mostly empty (that layer's input
  // gradient, one filter) ran slower than the lowering. A grid mostly thrown away
  // (ResNet-20's 7x7 layers, rows of 9 and a last tile past the grid: 60 % real)
  // would spend the products it saves on positions nobody reads, where its 14x14
  // and 28x28 layers throw a quarter or less away (bench/results/conv2d_bf16_planes_*.md).
  // The same holds on the phases of a stride of 2: its first stage's downsampling
  // layer (14x14 outputs in rows of 15) takes them, the second's (7x7 in rows of 8)
  // does not.
  const Grid g = grid_of(s);
  return s.K >= kFilters && channel_pairs(s) * s.R * s.S >= 32 &&
         4 * s.P * s.Q >= 3 * g.tiles * kTile;
}

bool bf16_planes_weight_grad_applies(const Conv2dShape& s) {
  return s.K <= 32 && bf16_planes_apply(s);
}

std::int64_t bf16_planes_packed_words(const Conv2dShape& s) {
  return (s.K + kFilters - 1) / kFilters * channel_pairs(s) * s.R * s.S * kFilters;
}

void bf16_planes_pack(const bfloat16* weight, std::uint32_t* packed, const Conv2dShape& s) {
  const std::int64_t pairs = channel_pairs(s), taps = s.R * s.S;
  const std::int64_t blocks = (s.K + kFilters - 1) / kFilters;
  for (std::int64_t b = 0; b < blocks; ++b) {
    for (std::int64_t cp = 0; cp < pairs; ++cp) {
      for (std::int64_t t = 0; t < taps; ++t) {
        for (std::int64_t i = 0; i < kFilters; ++i) {
          const std::int64_t k = b * kFilters + i;
          std::uint32_t word = 0;
          if (k < s.K) {
            const bfloat16* w = weight + (k * s.C + 2 * cp) * taps + t;
            word = w[0].bits;
            if (2 * cp + 1 < s.C) word |= std::uint32_t(w[taps].bits) << 16;
          }
          packed[((b * pairs + cp) * taps + t) * kFilters + i] = word;
        }
      }
    }
  }
}

void bf16_planes_forward(float* y, const bfloat16* x, const std::uint32_t* packed,
                         const float* bias, bool accumulate, std::int64_t first, std::int64_t last,
                         const Conv2dShape& s) {
#if TL_CPU_X86
  forward_images(y, x, packed, bias, accumulate, first, last, s);
#else
  (void)y, (void)x, (void)packed, (void)bias, (void)accumulate, (void)first, (void)last, (void)s;
  std::abort();  // bf16_planes_apply is false off x86: never called
#endif
}

void bf16_planes_forward(bfloat16* y, const bfloat16* x, const std::uint32_t* packed,
                         const float* bias, std::int64_t first, std::int64_t last,
                         const Conv2dShape& s) {
#if TL_CPU_X86
  forward_images(y, x, packed, bias, false, first, last, s);
#else
  (void)y, (void)x, (void)packed, (void)bias, (void)first, (void)last, (void)s;
  std::abort();  // bf16_planes_apply is false off x86: never called
#endif
}

}  // namespace towerlab::cpu
