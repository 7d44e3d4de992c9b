// The float32 row sums of the CPU batch norm (kernels/cpu/batchnorm.cpp and
// batchnorm_backward.cpp): 32 float lanes folded in one fixed tree, the same bits on
// every ISA, with the AVX-512 and AVX2 forms the batch norm picks at run time
// (kernels/cpu/x86.h); the AVX-512 form also reads 16-bit rows, widened in registers
// (the bits of their float32 copies).
// Internal: not installed, not included by towerlab.h.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

#if TL_CPU_X86

// a * b, rounded once, which the compiler may not fuse with a following add: GCC
// contracts _mm512_mul_ps then _mm512_add_ps into one FMA (C++ allows it), which
// rounds once where the portable code rounds twice, and so changes the bits. The
// explicit rounding mode (the default one) makes it an operation of its own. (The
// zero-masking forms here and below, with every lane kept, because GCC 12's
// unmasked ones warn of an uninitialized value.)
__attribute__((target("avx512f"))) inline __m512 mul_exact(__m512 a, __m512 b) {
  return _mm512_maskz_mul_round_ps(0xFFFF, a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// Lanes 0-7 (Half = 0) or 8-15 (Half = 1) of v.
template <int Half>
__attribute__((target("avx512f"))) inline __m256 half_of(__m512 v) {
  return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, _mm512_castps_pd(v), Half));
}

// The last four float lanes of a sum, added in double in the portable code's order.
inline double sum_in_double(__m128 q) {
  alignas(16) float l[4];
  _mm_store_ps(l, q);
  return (double(l[0]) + double(l[1])) + (double(l[2]) + double(l[3]));
}

#endif  // TL_CPU_X86

// Sums of a float32 row of S values in 32 float lanes: value s goes to lane s % 32
// (in order of s), then the lanes fold in one fixed tree: lane j and j + 16, then
// j and j + 8, then j and j + 4, in float, and the last four in double as
// (0 + 1) + (2 + 3). Every ISA keeps this order, so every ISA gives the same bits:
// the portable code holds the lanes as eight Vec4 per sum, AVX2 as four 8-lane
// vectors, AVX-512 as two 16-lane vectors (test
// BatchNormMaxPoolTest.EveryIsaGivesThePortableBits). Each lane adds
// at most S / 32 + 1 values (25 for FashionNet's first layer), where a double sum
// over the channel cost a conversion and a double add per value, and the
// independent vectors keep several adds in flight where one would wait on the
// add's latency.
// f maps the lanes of each input row to `Sums` vectors of terms; in the last,
// partial block the lanes past the row are left out after f (f of a zero need not
// be zero). A function of S alone, not of the threads: the same bits on any thread.
template <int Sums, typename F, typename... Rows>
std::array<double, Sums> float_lane_sums(std::int64_t S, const F& f, const Rows*... rows) {
  std::array<std::array<Vec4, 8>, Sums> lanes{};  // lanes[i][j]: lanes 4j .. 4j + 3 of sum i
  std::int64_t s = 0;
  for (; s + 32 <= S; s += 32) {
    for (int j = 0; j < 8; ++j) {
      const std::array<Vec4, Sums> t = f(load4(rows + s + 4 * j)...);
      for (int i = 0; i < Sums; ++i) lanes[i][j] += t[i];
    }
  }
  for (int j = 0; s < S; s += 4, ++j) {
    const std::int64_t count = std::min<std::int64_t>(4, S - s);
    const std::array<Vec4, Sums> t = f(load_first(rows + s, count)...);
    for (int i = 0; i < Sums; ++i) lanes[i][j] += keep(lanes_below(count), t[i]);
  }
  std::array<double, Sums> out;
  for (int i = 0; i < Sums; ++i) {
    const std::array<Vec4, 8>& l = lanes[i];
    const Vec4 q = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    out[i] = (double(q[0]) + double(q[1])) + (double(q[2]) + double(q[3]));
  }
  return out;
}

#if TL_CPU_X86

// The AVX-512 form of float_lane_sums: lanes 0-15 and 16-31 of each sum in two
// vectors; f maps 16-lane vectors. The last block's lanes past the row keep their
// sums (a masked add), as the portable code adds +0 to them: the same bits. A row
// may be float32 or 16-bit (load16: widened exactly as it is loaded), so a 16-bit
// row gives its float32 copy's sums without the copy.
template <int Sums>
struct Zmm {
  __m512 v[Sums];
};

template <int Sums, typename F, typename... Rows>
__attribute__((target("avx512f"))) std::array<double, Sums> float_lane_sums_avx512(
    std::int64_t S, const F& f, const Rows*... rows) {
  Zmm<Sums> lo, hi;  // lanes 0-15 and 16-31
  for (int i = 0; i < Sums; ++i) lo.v[i] = hi.v[i] = _mm512_setzero_ps();
  std::int64_t s = 0;
  for (; s + 32 <= S; s += 32) {
    const Zmm<Sums> t0 = f(load16(rows + s)...);
    const Zmm<Sums> t1 = f(load16(rows + s + 16)...);
    for (int i = 0; i < Sums; ++i) {
      lo.v[i] = _mm512_add_ps(lo.v[i], t0.v[i]);
      hi.v[i] = _mm512_add_ps(hi.v[i], t1.v[i]);
    }
  }
  if (s < S) {
    const __mmask16 m0 = first_lanes(S - s), m1 = first_lanes(S - s - 16);
    const Zmm<Sums> t0 = f(load_first16(rows + s, S - s)...);
    const Zmm<Sums> t1 = f(load_first16(rows + s + 16, S - s - 16)...);
    for (int i = 0; i < Sums; ++i) {
      lo.v[i] = _mm512_mask_add_ps(lo.v[i], m0, lo.v[i], t0.v[i]);
      hi.v[i] = _mm512_mask_add_ps(hi.v[i], m1, hi.v[i], t1.v[i]);
    }
  }
  std::array<double, Sums> out;
  for (int i = 0; i < Sums; ++i) {
    const __m512 m = _mm512_add_ps(lo.v[i], hi.v[i]);
    const __m256 p = _mm256_add_ps(half_of<0>(m), half_of<1>(m));
    out[i] = sum_in_double(_mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps(p, 1)));
  }
  return out;
}

// The AVX2 form of float_lane_sums (machines without AVX-512, where eight Vec4 per
// sum would not fit the registers): lanes 8k .. 8k + 7 of each sum in vector k of
// four; f maps 8-lane vectors. The last block's lanes past the row are cleared
// after f and add +0, as in the portable code: the same bits. (No FMA in this
// target, so the compiler cannot fuse f's products with the adds.)
template <int Sums>
struct Ymm {
  __m256 v[Sums];
};

template <int Sums, typename F, typename... Rows>
__attribute__((target("avx2"))) std::array<double, Sums> float_lane_sums_avx2(std::int64_t S,
                                                                              const F& f,
                                                                              const Rows*... rows) {
  Ymm<Sums> lanes[4];
  for (Ymm<Sums>& l : lanes) {
    for (int i = 0; i < Sums; ++i) l.v[i] = _mm256_setzero_ps();
  }
  std::int64_t s = 0;
  for (; s + 32 <= S; s += 32) {
    for (int k = 0; k < 4; ++k) {
      const Ymm<Sums> t = f(_mm256_loadu_ps(rows + s + 8 * k)...);
      for (int i = 0; i < Sums; ++i) lanes[k].v[i] = _mm256_add_ps(lanes[k].v[i], t.v[i]);
    }
  }
  for (int k = 0; s < S; s += 8, ++k) {
    const auto count = static_cast<int>(std::min<std::int64_t>(8, S - s));
    const __m256i keep =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const Ymm<Sums> t = f(_mm256_maskload_ps(rows + s, keep)...);
    for (int i = 0; i < Sums; ++i) {
      lanes[k].v[i] =
          _mm256_add_ps(lanes[k].v[i], _mm256_and_ps(_mm256_castsi256_ps(keep), t.v[i]));
    }
  }
  std::array<double, Sums> out;
  for (int i = 0; i < Sums; ++i) {
    const __m256 p = _mm256_add_ps(_mm256_add_ps(lanes[0].v[i], lanes[2].v[i]),
                                   _mm256_add_ps(lanes[1].v[i], lanes[3].v[i]));
    out[i] = sum_in_double(_mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps(p, 1)));
  }
  return out;
}

#endif  // TL_CPU_X86

}  // namespace towerlab::cpu
