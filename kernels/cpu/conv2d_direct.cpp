// The direct convolution for one input channel and a 3x3 kernel (contract and
// numerics in kernels/cpu/conv2d_direct.h).
//
// Each image is copied into three column-shifted, zero-padded planes
//   planes[s, row, q] = x[row - pad_h, q + s - pad_w]  (zero outside x)   [S, P+R-1, Q]
// so that the tap (r, s) of the flat output pixel i = p*Q + q reads planes[s] at
// r*Q + i: for every tap, an image's P*Q outputs read one contiguous run. Vectors
// then run over the flat pixels across row ends: a 28x28 output is 49 vectors of
// sixteen, where vectors within rows of 28 would take 56.
//
// Forward: two filters' weights stay in registers, each loaded input vector feeds
// both, and eight sums are in flight (two filters by four vectors), enough to hide
// the latency of each one's chain of nine fused multiply-adds.
// Weight gradient: image by image, two filters' eighteen (k, tap) sums in registers,
// each loaded input vector feeding both; the sums' lanes wait in a buffer from one
// image to the next and are added once per group of images, not once per image.
// In a training step grad_y (100 KiB an image in FashionNet) comes from memory, not
// from cache, and the hardware prefetcher does not keep up with a pair's two
// interleaved runs of P*Q values, so each pair prefetches the pair after next's.
#include "kernels/cpu/conv2d_direct.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

constexpr std::int64_t kR = 3, kS = 3, kTaps = kR * kS;

#if TL_CPU_X86

// Filters whose sums run side by side in the AVX-512 kernels (AVX2 has registers for one).
constexpr std::int64_t kFilters = 2;

std::int64_t plane_size(const Conv2dShape& s) {
  return (s.P + kR - 1) * s.Q;
}

// An image's strides, in floats: a row of the planes (Q), one image's outputs of one
// filter (P*Q), one plane ((P+R-1)*Q). The kernels take them by value: their stores
// may alias anything, and the shape behind a reference would be reloaded after each.
struct Strides {
  std::int64_t row, pixels, plane;
};
Strides strides(const Conv2dShape& s) {
  return {s.Q, s.P * s.Q, plane_size(s)};
}

// planes [S, P+R-1, Q] of one image x [H, W] (above).
void shift_planes(float* planes, const float* x, const Conv2dShape& s) {
  const std::int64_t rows = s.P + kR - 1;
  for (std::int64_t t = 0; t < kS; ++t) {
    // Column q reads x's column q + offset, inside x for q in [first, last).
    const std::int64_t offset = t - s.params.pad_w;
    const std::int64_t first = std::clamp<std::int64_t>(-offset, 0, s.Q);
    const std::int64_t last = std::clamp<std::int64_t>(s.W - offset, first, s.Q);
    for (std::int64_t row = 0; row < rows; ++row) {
      float* out = planes + (t * rows + row) * s.Q;  // [Q]
      const std::int64_t h = row - s.params.pad_h;
      if (h < 0 || h >= s.H) {
        std::fill(out, out + s.Q, 0.0f);
        continue;
      }
      const float* in = x + h * s.W + first + offset;
      std::fill(out, out + first, 0.0f);
      std::copy(in, in + (last - first), out + first);
      std::fill(out + last, out + s.Q, 0.0f);
    }
  }
}

#define TL_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline
// The forward's, whose float16 output rounds with F16C as it is stored.
#define TL_AVX2_F16C_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#define TL_AVX512_INLINE __attribute__((target("avx512f"), always_inline)) inline

// The sum of t's eight lanes, the end of add_lanes' tree: lanes l and l + 4, then l
// and l + 2, then the two.
__attribute__((target("avx2"), always_inline)) inline float lane_total8(__m256 t) {
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

// Makes the compiler hold v in a register: GCC would otherwise fold its load into
// each of the filters' fused multiply-adds as a memory operand, loading it once per
// filter where the kernels below load it once for all of them.
// (AVX-512 in its target: Clang checks the register constraint against the
// function's own target, which a template without one lacks.)
__attribute__((target("avx512f"), always_inline)) inline void in_register(__m512& v) {
  asm("" : "+v"(v));
}

// --- AVX2: eight pixels a vector ---------------------------------------------------

// y[kb, i + 8g .. + 7] for KB filters and G vectors of outputs: each the chain of
// the nine taps in order (r, s), from zero, then the bias, stored as Out (a 16-bit
// Out rounded once, in the store). w [KB, R*S], y [KB, P*Q].
template <int KB, int G, typename Out>
TL_AVX2_F16C_INLINE void forward_block8(Out* y, const float* planes, const __m256* w,
                                        const __m256* bias, std::int64_t i, Strides d) {
  const std::int64_t pq = d.pixels, plane = d.plane;
  __m256 acc[KB][G];
  for (int kb = 0; kb < KB; ++kb)
    for (int g = 0; g < G; ++g) acc[kb][g] = _mm256_setzero_ps();
  for (std::int64_t r = 0; r < kR; ++r) {
    for (std::int64_t t = 0; t < kS; ++t) {
      const float* in = planes + t * plane + r * d.row + i;
      for (int g = 0; g < G; ++g) {
        const __m256 v = _mm256_loadu_ps(in + 8 * g);
        for (int kb = 0; kb < KB; ++kb) {
          acc[kb][g] = _mm256_fmadd_ps(w[kb * kTaps + r * kS + t], v, acc[kb][g]);
        }
      }
    }
  }
  for (int kb = 0; kb < KB; ++kb) {
    for (int g = 0; g < G; ++g) {
      store8(y + kb * pq + i + 8 * g, _mm256_add_ps(acc[kb][g], bias[kb]));
    }
  }
}

// y [KB, P*Q] of one image from its planes, weight [KB, R*S], bias [KB] or null.
// The last vector may overlap the one before it (for_each_group's rule): those
// outputs are written twice with the same bits.
template <int KB, typename Out>
TL_AVX2_F16C_INLINE void forward_filters8(Out* y, const float* planes, const float* weight,
                                          const float* bias, Strides d) {
  __m256 w[KB * kTaps], b[KB];
  for (int j = 0; j < KB * kTaps; ++j) w[j] = _mm256_set1_ps(weight[j]);
  for (int kb = 0; kb < KB; ++kb) b[kb] = _mm256_set1_ps(bias != nullptr ? bias[kb] : 0.0f);
  const std::int64_t pq = d.pixels;
  std::int64_t i = 0;
  for (; i + 32 <= pq; i += 32) forward_block8<KB, 4>(y, planes, w, b, i, d);
  for (; i + 8 <= pq; i += 8) forward_block8<KB, 1>(y, planes, w, b, i, d);
  if (i < pq) forward_block8<KB, 1>(y, planes, w, b, pq - 8, d);
}

// y [K, P*Q] of one image, P*Q >= 8. One filter at a time: AVX2's sixteen registers
// hold one filter's nine weights and four sums, not two filters'.
template <typename Out>
__attribute__((target("avx2,fma,f16c"))) void forward_image_avx2(Out* y, const float* planes,
                                                                 const float* weight,
                                                                 const float* bias,
                                                                 const Conv2dShape& s) {
  const Strides d = strides(s);
  for (std::int64_t k = 0, filters = s.K; k < filters; ++k) {
    forward_filters8<1>(y + k * d.pixels, planes, weight + k * kTaps,
                        bias != nullptr ? bias + k : nullptr, d);
  }
}

template <bool Masked>
TL_AVX2_INLINE __m256 load8(const float* p, __m256i mask) {
  return Masked ? _mm256_maskload_ps(p, mask) : _mm256_loadu_ps(p);
}

// acc[tap] += grad_y[i ..] * the tap's run at i, eight lanes; Masked: only the
// first `count` lanes load values, the others zeros.
template <bool Masked>
TL_AVX2_INLINE void weight_grad_group8(__m256* acc, const float* gy, const float* planes,
                                       std::int64_t i, __m256i mask, Strides d) {
  const std::int64_t plane = d.plane;
  const __m256 g = load8<Masked>(gy + i, mask);
  for (std::int64_t r = 0; r < kR; ++r) {
    for (std::int64_t t = 0; t < kS; ++t) {
      const __m256 v = load8<Masked>(planes + t * plane + r * d.row + i, mask);
      acc[r * kS + t] = _mm256_fmadd_ps(g, v, acc[r * kS + t]);
    }
  }
}

// lanes [K, R*S, 16] (+)= the sixteen-lane sums of one image (= for its first image:
// `first`) from its planes and grad_y [K, P*Q]: those of the AVX-512 code as two
// halves of eight, one filter and one half at a time (AVX2's sixteen registers hold
// nine sums, not eighteen). A half's last group may hold no pixel at all where the
// AVX-512 code adds zeros to those lanes: a sum from +0 is never -0, so adding +0
// leaves its bits, and skipping it gives the same.
__attribute__((target("avx2,fma"))) void weight_grad_image_avx2(float* lanes, bool first,
                                                                const float* planes,
                                                                const float* grad_y,
                                                                std::int64_t filters, Strides d) {
  const std::int64_t pq = d.pixels;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (std::int64_t k = 0; k < filters; ++k) {
    const float* gy = grad_y + k * pq;  // [P*Q]
    for (std::int64_t h = 0; h < 2; ++h) {
      float* half = lanes + k * kTaps * 16 + 8 * h;  // [R*S, 16] from lane 8h
      __m256 acc[kTaps];
      for (std::int64_t tap = 0; tap < kTaps; ++tap) {
        acc[tap] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(half + tap * 16);
      }
      std::int64_t i = 8 * h;
      for (; i + 8 <= pq; i += 16) weight_grad_group8<false>(acc, gy, planes, i, lane, d);
      if (i < pq) {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(pq - i)), lane);
        weight_grad_group8<true>(acc, gy, planes, i, mask, d);
      }
      for (std::int64_t tap = 0; tap < kTaps; ++tap) _mm256_storeu_ps(half + tap * 16, acc[tap]);
    }
  }
}

// --- AVX-512: sixteen pixels a vector ----------------------------------------------

// forward_block8 with sixteen pixels a vector: the same chains, the same bits.
template <int KB, int G, typename Out>
TL_AVX512_INLINE void forward_block16(Out* y, const float* planes, const __m512* w,
                                      const __m512* bias, std::int64_t i, Strides d) {
  const std::int64_t pq = d.pixels, plane = d.plane;
  __m512 acc[KB][G];
  for (int kb = 0; kb < KB; ++kb)
    for (int g = 0; g < G; ++g) acc[kb][g] = _mm512_setzero_ps();
  for (std::int64_t r = 0; r < kR; ++r) {
    for (std::int64_t t = 0; t < kS; ++t) {
      const float* in = planes + t * plane + r * d.row + i;
      for (int g = 0; g < G; ++g) {
        __m512 v = _mm512_loadu_ps(in + 16 * g);
        in_register(v);
        for (int kb = 0; kb < KB; ++kb) {
          acc[kb][g] = _mm512_fmadd_ps(w[kb * kTaps + r * kS + t], v, acc[kb][g]);
        }
      }
    }
  }
  for (int kb = 0; kb < KB; ++kb) {
    for (int g = 0; g < G; ++g) {
      store16(y + kb * pq + i + 16 * g, _mm512_add_ps(acc[kb][g], bias[kb]));
    }
  }
}

template <int KB, typename Out>
TL_AVX512_INLINE void forward_filters16(Out* y, const float* planes, const float* weight,
                                        const float* bias, Strides d) {
  __m512 w[KB * kTaps], b[KB];
  for (int j = 0; j < KB * kTaps; ++j) w[j] = _mm512_set1_ps(weight[j]);
  for (int kb = 0; kb < KB; ++kb) b[kb] = _mm512_set1_ps(bias != nullptr ? bias[kb] : 0.0f);
  const std::int64_t pq = d.pixels;
  std::int64_t i = 0;
  for (; i + 64 <= pq; i += 64) forward_block16<KB, 4>(y, planes, w, b, i, d);
  for (; i + 16 <= pq; i += 16) forward_block16<KB, 1>(y, planes, w, b, i, d);
  if (i < pq) forward_block16<KB, 1>(y, planes, w, b, pq - 16, d);
}

// y [K, P*Q] of one image, P*Q >= 16: filters in pairs (kFilters), an odd last alone.
template <typename Out>
__attribute__((target("avx512f"))) void forward_image_avx512(Out* y, const float* planes,
                                                             const float* weight, const float* bias,
                                                             const Conv2dShape& s) {
  const Strides d = strides(s);
  const std::int64_t pq = d.pixels, filters = s.K;
  std::int64_t k = 0;
  for (; k + kFilters <= filters; k += kFilters) {
    forward_filters16<kFilters>(y + k * pq, planes, weight + k * kTaps,
                                bias != nullptr ? bias + k : nullptr, d);
  }
  if (k < filters) {
    forward_filters16<1>(y + k * pq, planes, weight + k * kTaps,
                         bias != nullptr ? bias + k : nullptr, d);
  }
}

template <bool Masked>
TL_AVX512_INLINE __m512 load16(const float* p, __mmask16 mask) {
  return Masked ? _mm512_maskz_loadu_ps(mask, p) : _mm512_loadu_ps(p);
}

// acc[kb*R*S + tap] += grad_y[kb, i ..] * the tap's run at i, sixteen lanes; Masked:
// the lanes past `mask` load zeros and so add zeros.
template <int KB, bool Masked>
TL_AVX512_INLINE void weight_grad_group16(__m512* acc, const float* gy, const float* planes,
                                          std::int64_t i, __mmask16 mask, Strides d) {
  const std::int64_t pq = d.pixels, plane = d.plane;
  __m512 g[KB];
  for (int kb = 0; kb < KB; ++kb) {
    g[kb] = load16<Masked>(gy + kb * pq + i, mask);
    // The same line of the filters two pairs on (in FashionNet's step faster than one
    // pair or four on); past the last filter it is the next image's, grad_y being
    // [N, K, P*Q], and past the last image a prefetch does not fault.
    _mm_prefetch(reinterpret_cast<const char*>(gy + (2 * KB + kb) * pq + i), _MM_HINT_T0);
  }
  for (std::int64_t r = 0; r < kR; ++r) {
    for (std::int64_t t = 0; t < kS; ++t) {
      __m512 v = load16<Masked>(planes + t * plane + r * d.row + i, mask);
      in_register(v);
      for (int kb = 0; kb < KB; ++kb) {
        acc[kb * kTaps + r * kS + t] = _mm512_fmadd_ps(g[kb], v, acc[kb * kTaps + r * kS + t]);
      }
    }
  }
}

// weight_grad_image_avx2's lanes for KB filters (lanes and grad_y at the first).
template <int KB>
TL_AVX512_INLINE void weight_grad_filters16(float* lanes, bool first, const float* planes,
                                            const float* grad_y, Strides d) {
  const std::int64_t pq = d.pixels;
  __m512 acc[KB * kTaps];
  for (int j = 0; j < KB * kTaps; ++j) {
    acc[j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(lanes + 16 * j);
  }
  std::int64_t i = 0;
  for (; i + 16 <= pq; i += 16) weight_grad_group16<KB, false>(acc, grad_y, planes, i, 0, d);
  if (i < pq) weight_grad_group16<KB, true>(acc, grad_y, planes, i, first_lanes(pq - i), d);
  for (int j = 0; j < KB * kTaps; ++j) _mm512_storeu_ps(lanes + 16 * j, acc[j]);
}

// weight_grad_image_avx2 with sixteen lanes a vector: filters in pairs (kFilters),
// an odd last alone.
__attribute__((target("avx512f"))) void weight_grad_image_avx512(float* lanes, bool first,
                                                                 const float* planes,
                                                                 const float* grad_y,
                                                                 std::int64_t filters, Strides d) {
  std::int64_t k = 0;
  for (; k + kFilters <= filters; k += kFilters) {
    weight_grad_filters16<kFilters>(lanes + k * kTaps * 16, first, planes, grad_y + k * d.pixels,
                                    d);
  }
  if (k < filters) {
    weight_grad_filters16<1>(lanes + k * kTaps * 16, first, planes, grad_y + k * d.pixels, d);
  }
}

// sum [R*S, K] from lanes [K, R*S, 16]: each (k, tap)'s lanes l and l + 8, then
// lane_total8's tree.
__attribute__((target("avx2"))) void add_lanes(float* sum, const float* lanes,
                                               std::int64_t filters) {
  for (std::int64_t k = 0; k < filters; ++k) {
    for (std::int64_t tap = 0; tap < kTaps; ++tap) {
      const float* l = lanes + (k * kTaps + tap) * 16;
      sum[tap * filters + k] =
          lane_total8(_mm256_add_ps(_mm256_loadu_ps(l), _mm256_loadu_ps(l + 8)));
    }
  }
}

#endif  // TL_CPU_X86

}  // namespace

bool direct_single_channel(const Conv2dShape& s, DType dtype) {
  const Conv2dParams& p = s.params;
  return TL_CPU_X86 && dtype == DType::Float32 && avx2_selected() && s.C == 1 && s.R == kR &&
         s.S == kS && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 &&
         p.dilation_w == 1 && s.Q >= 8;
}

#if TL_CPU_X86

template <typename Out>
void direct_forward(Out* y, const float* x, const float* weight, const float* bias,
                    std::int64_t images, const Conv2dShape& s) {
  const bool wide = avx512_selected() && s.P * s.Q >= 16;
  HostScratch<float> planes(kS * plane_size(s));
  for (std::int64_t n = 0; n < images; ++n) {
    shift_planes(planes.get(), x + n * s.H * s.W, s);
    Out* y_n = y + n * s.K * s.P * s.Q;  // [K, P*Q]
    if (wide) {
      forward_image_avx512(y_n, planes.get(), weight, bias, s);
    } else {
      forward_image_avx2(y_n, planes.get(), weight, bias, s);
    }
  }
}

void direct_weight_grad(float* sum, const float* x, const float* grad_y, std::int64_t images,
                        const Conv2dShape& s) {
  const Strides d = strides(s);
  const bool wide = avx512_selected();
  HostScratch<float> planes(kS * d.plane), lanes(s.K * kTaps * 16);  // lanes [K, R*S, 16]
  // Image by image, all filters each: grad_y is read in one pass, in order.
  for (std::int64_t n = 0; n < images; ++n) {
    shift_planes(planes.get(), x + n * s.H * s.W, s);
    const float* gy = grad_y + n * s.K * d.pixels;  // [K, P*Q]
    if (wide) {
      weight_grad_image_avx512(lanes.get(), n == 0, planes.get(), gy, s.K, d);
    } else {
      weight_grad_image_avx2(lanes.get(), n == 0, planes.get(), gy, s.K, d);
    }
  }
  add_lanes(sum, lanes.get(), s.K);
}

#else

// Never reached: direct_single_channel holds on x86 alone.
template <typename Out>
void direct_forward(Out*, const float*, const float*, const float*, std::int64_t,
                    const Conv2dShape&) {}
void direct_weight_grad(float*, const float*, const float*, std::int64_t, const Conv2dShape&) {}

#endif

template void direct_forward<float>(float*, const float*, const float*, const float*, std::int64_t,
                                    const Conv2dShape&);
template void direct_forward<bfloat16>(bfloat16*, const float*, const float*, const float*,
                                       std::int64_t, const Conv2dShape&);
template void direct_forward<float16>(float16*, const float*, const float*, const float*,
                                      std::int64_t, const Conv2dShape&);

}  // namespace towerlab::cpu
