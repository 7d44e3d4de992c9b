// CPU dropout: the reference's masks (kernels/dropout.h), drawn many elements at a
// time. dropout_unit, the specification, runs Philox's ten rounds for every element
// and keeps one of the four words; here each draw serves the four elements that
// share it (word e % 4 of draw e / 4), and the keep test is done on the integers:
// to_unit_float(w) = (w >> 8) 2^-24 exactly, so (double)u >= p exactly when
// (w >> 8) >= ceil(p 2^24), p 2^24 being exact in double.
//
// On x86 the draws run in vector lanes, float32 only: sixteen Philox counters in an
// AVX-512 vector (eight in AVX2), each lane philox::philox4x32_10's rounds on 32-bit
// integers (a 32x32 -> 64-bit product of the even lanes and one of the odd lanes,
// taken apart into the low and high words and put back together), then the four
// words of the draws transposed into the elements' order, so that one vector draw
// serves a block of 64 (AVX-512) or 32 (AVX2) elements. The lanes hold the draws in
// the order that the transpose puts back in sequence (kDrawOfLane). Which ISA runs
// follows the GEMM's (kernels/cpu/x86.h); the elements before a range's first draw
// boundary and after its last whole block take the scalar loop, as float64 does.
//
// The forward is the backward's assignment (out = in * m); the backward accumulates
// out + in * m with the product and the sum rounded apart, as the reference does
// (TL_NO_CONTRACTION). Same masks and values as the reference on every ISA, bit for
// bit (tests/dropout_test.cpp). An element's mask depends on its global index
// alone, so the threads' split changes nothing. The backward draws the mask again
// rather than reading one the forward kept: in vector lanes the draws cost little
// beside the pass over the gradients (measured: bench/results/README.md).
#include "kernels/cpu/dropout.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "engine/philox.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/x86.h"
#include "kernels/reference/dropout.h"

namespace towerlab::cpu {

namespace {

// Which elements a dropout keeps: element e, whose word is w (word e % 4 of draw
// e / 4 of the stream (seed, subsequence)), when (w >> 8) >= threshold.
struct MaskKey {
  std::uint64_t seed, subsequence;
  std::uint32_t threshold;  // ceil(p 2^24), in [0, 2^24]
};

MaskKey mask_key(double p, std::uint64_t seed, std::uint64_t subsequence) {
  return {seed, subsequence, static_cast<std::uint32_t>(std::ceil(std::ldexp(p, 24)))};
}

// out[i] = in[i] * m(first + i) (ASSIGNED), or out[i] + in[i] * m(first + i) with
// GradWrite::Accumulate, for i in [0, n); m is `scale` where kept, else 0.
template <typename T>
void apply_scalar(T* out, const T* in, T scale, const MaskKey& k, std::uint64_t first,
                  std::int64_t n, GradWrite write) {
  std::int64_t i = 0;
  while (i < n) {
    const std::uint64_t e = first + static_cast<std::uint64_t>(i);
    const philox::Uint4 r = philox::draw(k.seed, k.subsequence, e / 4);
    const std::uint32_t words[4] = {r.x, r.y, r.z, r.w};
    for (std::uint64_t w = e % 4; w < 4 && i < n; ++w, ++i) {
      const T v = in[i] * ((words[w] >> 8) >= k.threshold ? scale : T(0));
      out[i] = write == GradWrite::Assign ? v : out[i] + v;
    }
  }
}

#if TL_CPU_X86
// GCC 12's AVX-512 intrinsics pass an uninitialized vector as the unused operand of
// their masked builtins, and -Wmaybe-uninitialized then warns at every inlined call.
#if !defined(__clang__)  // a GCC warning; Clang does not know it
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Lane j of a vector of counters holds draw d + kDrawOfLane[j] of a block starting
// at draw d: the unpacks below take lanes (j, j + 4, j + 8, j + 12) of the four words
// into output vector j % 4 (sixteen lanes), so lane 4 b + v holds draw 4 v + b, and
// output vector v gets draws 4 v .. 4 v + 3 in order. With eight lanes, lane 4 b + v
// holds draw 2 v + b.
alignas(64) constexpr std::int32_t kDrawOfLane16[16] = {0, 4, 8,  12, 1, 5, 9,  13,
                                                        2, 6, 10, 14, 3, 7, 11, 15};
alignas(32) constexpr std::int32_t kDrawOfLane8[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// The low and high words of a * k, lane by lane, for sixteen 32-bit lanes.
__attribute__((target("avx512f"))) inline void mulhilo16(__m512i a, __m512i k, __m512i& lo,
                                                         __m512i& hi) {
  const __m512i even = _mm512_mul_epu32(a, k);                        // lanes 0, 2, ..
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), k);  // lanes 1, 3, ..
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

// The words of draws d .. d + 15 in the elements' order: words[v] holds elements
// 4 d + 16 v .. 4 d + 16 v + 15.
__attribute__((target("avx512f"))) inline void draw16(const MaskKey& k, std::uint64_t d,
                                                      __m512i words[4]) {
  const __m512i offsets = _mm512_load_si512(kDrawOfLane16);
  __m512i x = _mm512_add_epi32(_mm512_set1_epi32(static_cast<std::int32_t>(d)), offsets);
  const __mmask16 carry = _mm512_cmplt_epu32_mask(x, offsets);  // d's low word wrapped
  const __m512i high = _mm512_set1_epi32(static_cast<std::int32_t>(d >> 32));
  __m512i y = _mm512_mask_add_epi32(high, carry, high, _mm512_set1_epi32(1));
  __m512i z = _mm512_set1_epi32(static_cast<std::int32_t>(k.subsequence));
  __m512i w = _mm512_set1_epi32(static_cast<std::int32_t>(k.subsequence >> 32));
  const __m512i mul0 = _mm512_set1_epi32(static_cast<std::int32_t>(philox::kMul0));
  const __m512i mul1 = _mm512_set1_epi32(static_cast<std::int32_t>(philox::kMul1));
  auto key0 = static_cast<std::uint32_t>(k.seed), key1 = static_cast<std::uint32_t>(k.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    __m512i lo0, hi0, lo1, hi1;
    mulhilo16(x, mul0, lo0, hi0);
    mulhilo16(z, mul1, lo1, hi1);
    // 0x96: the three inputs' exclusive or.
    x = _mm512_ternarylogic_epi32(hi1, y, _mm512_set1_epi32(static_cast<std::int32_t>(key0)), 0x96);
    y = lo1;
    z = _mm512_ternarylogic_epi32(hi0, w, _mm512_set1_epi32(static_cast<std::int32_t>(key1)), 0x96);
    w = lo0;
    key0 += philox::kWeyl0;
    key1 += philox::kWeyl1;
  }
  const __m512i xy_lo = _mm512_unpacklo_epi32(x, y), xy_hi = _mm512_unpackhi_epi32(x, y);
  const __m512i zw_lo = _mm512_unpacklo_epi32(z, w), zw_hi = _mm512_unpackhi_epi32(z, w);
  words[0] = _mm512_unpacklo_epi64(xy_lo, zw_lo);
  words[1] = _mm512_unpackhi_epi64(xy_lo, zw_lo);
  words[2] = _mm512_unpacklo_epi64(xy_hi, zw_hi);
  words[3] = _mm512_unpackhi_epi64(xy_hi, zw_hi);
}

// apply_scalar on `blocks` blocks of 64 elements, the first being draw d's first.
TL_NO_CONTRACTION __attribute__((target("avx512f"))) void apply_avx512(
    float* out, const float* in, float scale, const MaskKey& k, std::uint64_t d,
    std::int64_t blocks, GradWrite write) {
  const __m512 kept_scale = _mm512_set1_ps(scale);
  const __m512i threshold = _mm512_set1_epi32(static_cast<std::int32_t>(k.threshold));
  for (std::int64_t b = 0; b < blocks; ++b, d += 16, in += 64, out += 64) {
    __m512i words[4];
    draw16(k, d, words);
    for (int v = 0; v < 4; ++v) {
      const __mmask16 kept = _mm512_cmpge_epu32_mask(_mm512_srli_epi32(words[v], 8), threshold);
      __m512 value =
          _mm512_mul_ps(_mm512_loadu_ps(in + 16 * v), _mm512_maskz_mov_ps(kept, kept_scale));
      if (write == GradWrite::Accumulate)
        value = _mm512_add_ps(_mm512_loadu_ps(out + 16 * v), value);
      _mm512_storeu_ps(out + 16 * v, value);
    }
  }
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// mulhilo16 for eight lanes.
__attribute__((target("avx2"))) inline void mulhilo8(__m256i a, __m256i k, __m256i& lo,
                                                     __m256i& hi) {
  const __m256i even = _mm256_mul_epu32(a, k);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), k);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// draw16 for draws d .. d + 7: words[v] holds elements 4 d + 8 v .. 4 d + 8 v + 7.
__attribute__((target("avx2"))) inline void draw8(const MaskKey& k, std::uint64_t d,
                                                  __m256i words[4]) {
  const __m256i offsets = _mm256_load_si256(reinterpret_cast<const __m256i*>(kDrawOfLane8));
  __m256i x = _mm256_add_epi32(_mm256_set1_epi32(static_cast<std::int32_t>(d)), offsets);
  // d's low word wrapped where x < offsets as unsigned: compared as signed with the
  // sign bits flipped, all ones there.
  const __m256i sign = _mm256_set1_epi32(std::int32_t(0x80000000u));
  const __m256i carry =
      _mm256_cmpgt_epi32(_mm256_xor_si256(offsets, sign), _mm256_xor_si256(x, sign));
  __m256i y = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<std::int32_t>(d >> 32)), carry);
  __m256i z = _mm256_set1_epi32(static_cast<std::int32_t>(k.subsequence));
  __m256i w = _mm256_set1_epi32(static_cast<std::int32_t>(k.subsequence >> 32));
  const __m256i mul0 = _mm256_set1_epi32(static_cast<std::int32_t>(philox::kMul0));
  const __m256i mul1 = _mm256_set1_epi32(static_cast<std::int32_t>(philox::kMul1));
  auto key0 = static_cast<std::uint32_t>(k.seed), key1 = static_cast<std::uint32_t>(k.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    __m256i lo0, hi0, lo1, hi1;
    mulhilo8(x, mul0, lo0, hi0);
    mulhilo8(z, mul1, lo1, hi1);
    x = _mm256_xor_si256(_mm256_xor_si256(hi1, y),
                         _mm256_set1_epi32(static_cast<std::int32_t>(key0)));
    y = lo1;
    z = _mm256_xor_si256(_mm256_xor_si256(hi0, w),
                         _mm256_set1_epi32(static_cast<std::int32_t>(key1)));
    w = lo0;
    key0 += philox::kWeyl0;
    key1 += philox::kWeyl1;
  }
  const __m256i xy_lo = _mm256_unpacklo_epi32(x, y), xy_hi = _mm256_unpackhi_epi32(x, y);
  const __m256i zw_lo = _mm256_unpacklo_epi32(z, w), zw_hi = _mm256_unpackhi_epi32(z, w);
  words[0] = _mm256_unpacklo_epi64(xy_lo, zw_lo);
  words[1] = _mm256_unpackhi_epi64(xy_lo, zw_lo);
  words[2] = _mm256_unpacklo_epi64(xy_hi, zw_hi);
  words[3] = _mm256_unpackhi_epi64(xy_hi, zw_hi);
}

// apply_avx512 in blocks of 32 elements.
TL_NO_CONTRACTION __attribute__((target("avx2"))) void apply_avx2(float* out, const float* in,
                                                                  float scale, const MaskKey& k,
                                                                  std::uint64_t d,
                                                                  std::int64_t blocks,
                                                                  GradWrite write) {
  const __m256 kept_scale = _mm256_set1_ps(scale);
  // (w >> 8) < 2^24 is positive as a signed word: kept where it exceeds threshold - 1.
  const __m256i below = _mm256_set1_epi32(static_cast<std::int32_t>(k.threshold) - 1);
  for (std::int64_t b = 0; b < blocks; ++b, d += 8, in += 32, out += 32) {
    __m256i words[4];
    draw8(k, d, words);
    for (int v = 0; v < 4; ++v) {
      const __m256i kept = _mm256_cmpgt_epi32(_mm256_srli_epi32(words[v], 8), below);
      const __m256 m = _mm256_and_ps(_mm256_castsi256_ps(kept), kept_scale);
      __m256 value = _mm256_mul_ps(_mm256_loadu_ps(in + 8 * v), m);
      if (write == GradWrite::Accumulate)
        value = _mm256_add_ps(_mm256_loadu_ps(out + 8 * v), value);
      _mm256_storeu_ps(out + 8 * v, value);
    }
  }
}
#endif

// apply_scalar on the range [0, n) whose element 0 is global element `first`: the
// vector blocks where the ISA has them, the rest (and float64) by the scalar loop.
template <typename T>
void apply(T* out, const T* in, T scale, const MaskKey& k, std::uint64_t first, std::int64_t n,
           GradWrite write) {
  std::int64_t done = 0;
#if TL_CPU_X86
  if constexpr (std::is_same_v<T, float>) {
    const std::int64_t width = avx512_selected() ? 64 : avx2_selected() ? 32 : 0;
    // The elements before the first draw boundary, then whole blocks from there.
    const auto head = std::min<std::int64_t>(n, static_cast<std::int64_t>((4 - first % 4) % 4));
    const std::int64_t blocks = width > 0 ? (n - head) / width : 0;
    if (blocks > 0) {
      apply_scalar(out, in, scale, k, first, head, write);
      (width == 64 ? apply_avx512 : apply_avx2)(out + head, in + head, scale, k,
                                                (first + static_cast<std::uint64_t>(head)) / 4,
                                                blocks, write);
      done = head + blocks * width;
    }
  }
#endif
  apply_scalar(out + done, in + done, scale, k, first + static_cast<std::uint64_t>(done), n - done,
               write);
}

}  // namespace

void dropout_forward(const Tensor& y, const Tensor& x, double p, std::uint64_t seed,
                     std::uint64_t subsequence, std::uint64_t first_element) {
  with_dtype(x.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    const T scale = reference::dropout_scale<T>(p);
    const MaskKey k = mask_key(p, seed, subsequence);
    parallel_rows(x.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      apply(out + lo, in + lo, scale, k, first_element + static_cast<std::uint64_t>(lo), hi - lo,
            GradWrite::Assign);
    });
  });
}

void dropout_backward(const Tensor& grad_x, const Tensor& grad_y, double p, std::uint64_t seed,
                      std::uint64_t subsequence, std::uint64_t first_element, GradWrite write) {
  with_dtype(grad_y.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [n]
    const T* gy = grad_y.data<T>();  // [n]
    const T scale = reference::dropout_scale<T>(p);
    const MaskKey k = mask_key(p, seed, subsequence);
    parallel_rows(grad_y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      apply(gx + lo, gy + lo, scale, k, first_element + static_cast<std::uint64_t>(lo), hi - lo,
            write);
    });
  });
}

}  // namespace towerlab::cpu
