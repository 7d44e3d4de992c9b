// Conversions between float32 and the 16-bit storage types (bfloat16, float16) in
// vectors: the one implementation the CPU kernels use wherever they read or write
// 16-bit tensors (the cast, ReLU, bias add, the activations, and the ring's
// bfloat16 contributions). Each gives engine/half.h's bits for every input, NaN
// payloads, infinities, subnormals and ties included (checked on every pattern and
// on floats of every exponent around both formats' ties: CastCpu.EveryIsaGivesTheReferenceBits):
//   float32 -> bfloat16  integer round to nearest even on the 32-bit pattern, NaNs
//                        quieted with their top payload bits, as the reference;
//   bfloat16 -> float32  the pattern shifted up 16 bits (exact);
//   float32 -> float16   vcvtps2ph with round-to-nearest-even, which gives the
//                        reference's bits (overflow to infinity from 65520, exact
//                        subnormals, quiet NaN with the top payload bits; a float32
//                        subnormal is a signed zero in float16 with or without
//                        MXCSR.DAZ);
//   float16 -> float32   integer rebias of exponent and mantissa, subnormals as
//                        mantissa * 2^-24 by one exact float subtraction, infinities
//                        and NaNs with the payload moved up unchanged (vcvtph2ps
//                        would quiet a signaling NaN, which the reference keeps).
// AVX-512BW's vcvtneps2bf16 is not used: it flushes float32 subnormals to zero.
//
// Two levels. In registers: round_store_first4 (four lanes, portable), and per ISA
// load_widen16 / round_store16 (sixteen lanes,
// AVX-512 F) and load_widen8 / round_store8 (eight lanes, AVX2 with F16C), and
// store8 / store16 for kernels whose output is float32 or 16-bit (conv2d's forward
// stores, which round the float32 sums where they are written), and load16 for
// kernels whose input is (batch norm's rows, widened as they are read). On
// arrays, whichever ISA runs (kernels/cpu/x86.h's rule: TOWERLAB_GEMM_ISA=avx2 or
// set_gemm_isa pins the eight-lane code, Portable the reference's scalar code):
// widen_16bit and round_to_16bit, which the element-wise kernels apply to blocks of
// kConvertBlock values held in float32 scratch on the stack, computing on the
// block as their float32 paths do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "engine/half.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/x86.h"

#if TL_CPU_X86
#include <cpuid.h>
#endif

namespace towerlab::cpu {

// dst[i] = float(src[i]), exact; T bfloat16 or float16; dst [n], src [n].
template <typename T>
void widen_16bit(float* dst, const T* src, std::int64_t n);

// dst[i] = T(src[i]), rounded as engine/half.h rounds; dst [n], src [n].
template <typename T>
void round_to_16bit(T* dst, const float* src, std::int64_t n);

// dst[i] = engine/half.h's round_to_odd(src[i]): float64 to float32 truncated toward
// zero, with the lowest bit set when anything was dropped (a NaN converted as the
// compiler's cast converts it), the first step of rounding float64 to a 16-bit type
// once; round_to_16bit is the second. dst [n], src [n].
void round_to_odd_float(float* dst, const double* src, std::int64_t n);

// The values a 16-bit element-wise kernel converts at a time: 4 KiB of float32
// scratch per operand, in L1 with the 16-bit block it came from.
inline constexpr std::int64_t kConvertBlock = 1024;

// Calls fn(first, count) for the blocks of at most kConvertBlock values that cover
// [0, n), in order.
template <typename Fn>
void for_each_block(std::int64_t n, const Fn& fn) {
  for (std::int64_t first = 0; first < n; first += kConvertBlock) {
    fn(first, n - first < kConvertBlock ? n - first : kConvertBlock);
  }
}

// Four lanes in portable vector arithmetic (kernels/cpu/simd.h's Vec4, any ISA): the
// first `count` (0 to 4) of v rounded to bfloat16 as float_to_bfloat16_8 rounds (to
// nearest even on the pattern, a NaN quieted with its top payload bits) and stored at
// p, nothing past them. For kernels that hold their values four to a vector, in code
// compiled for every ISA (Winograd F(4x4)'s rows of output pixels).
inline void round_store_first4(bfloat16* p, Vec4 v, int count) {
  typedef std::uint32_t Bits4 __attribute__((vector_size(16)));
  Bits4 x;
  std::memcpy(&x, &v, sizeof x);
  const Bits4 nan = reinterpret_cast<Bits4>((x & 0x7fffffffu) > 0x7f800000u);
  const Bits4 rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const Bits4 quiet = (x >> 16) | 0x0040u;
  const Bits4 bits = (nan & quiet) | (~nan & rounded);
  const std::uint16_t halves[4] = {
      static_cast<std::uint16_t>(bits[0]), static_cast<std::uint16_t>(bits[1]),
      static_cast<std::uint16_t>(bits[2]), static_cast<std::uint16_t>(bits[3])};
  std::memcpy(p, halves, sizeof(std::uint16_t) * static_cast<std::size_t>(count));
}

#if TL_CPU_X86

// CPUID leaf 1, ECX bit 29 (GCC's __builtin_cpu_supports knows "f16c", Clang's
// does not). The eight-lane code runs where avx2_selected() and this hold.
inline bool f16c_present() {
  static const bool present = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  }();
  return present;
}

inline const std::uint16_t* bits_of(const bfloat16* p) {
  return reinterpret_cast<const std::uint16_t*>(p);
}
inline const std::uint16_t* bits_of(const float16* p) {
  return reinterpret_cast<const std::uint16_t*>(p);
}

// ---- AVX-512 F: sixteen lanes, a 16-bit pattern in the low half of each 32-bit lane.
// GCC 12's AVX-512 intrinsics pass an uninitialized vector as the unused operand of
// their masked builtins, and -Wmaybe-uninitialized then warns at every inlined call
// (Clang has no such warning, and would warn about the unknown name).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

__attribute__((target("avx512f"))) inline __m512i load_lanes16(const std::uint16_t* p) {
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

__attribute__((target("avx512f"))) inline void store_lanes16(void* p, __m512i lanes) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(lanes));
}

__attribute__((target("avx512f"))) inline __m512i float_to_bfloat16_16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i magnitude = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  // Adding 0x7fff plus the kept part's lowest bit carries into bit 16 exactly when
  // the dropped half is above one half, or one half with an odd kept part.
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x0040));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}

__attribute__((target("avx512f"))) inline __m512 float16_to_float_16(__m512i h) {
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(h, _mm512_set1_epi32(0x8000)), 16);
  const __m512i shifted = _mm512_slli_epi32(_mm512_and_si512(h, _mm512_set1_epi32(0x7fff)), 13);
  const __m512i exponent = _mm512_and_si512(shifted, _mm512_set1_epi32(0x0f800000));
  __m512i magnitude = _mm512_add_epi32(shifted, _mm512_set1_epi32((127 - 15) << 23));
  // Infinity and NaN: float16's largest exponent becomes float32's.
  const __mmask16 special = _mm512_cmpeq_epi32_mask(exponent, _mm512_set1_epi32(0x0f800000));
  magnitude = _mm512_mask_or_epi32(magnitude, special, shifted, _mm512_set1_epi32(0x7f800000));
  // Zero and subnormals: (1 + m / 1024) 2^-14 - 2^-14 = m 2^-24, exactly.
  const __mmask16 tiny = _mm512_cmpeq_epi32_mask(exponent, _mm512_setzero_si512());
  const __m512 two_to_minus_14 = _mm512_castsi512_ps(_mm512_set1_epi32(113 << 23));
  const __m512 subnormal =
      _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(shifted, _mm512_set1_epi32(113 << 23))),
                    two_to_minus_14);
  magnitude = _mm512_mask_mov_epi32(magnitude, tiny, _mm512_castps_si512(subnormal));
  return _mm512_castsi512_ps(_mm512_or_si512(magnitude, sign));
}

__attribute__((target("avx512f"))) inline __m512 load_widen16(const bfloat16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(load_lanes16(bits_of(p)), 16));
}
__attribute__((target("avx512f"))) inline __m512 load_widen16(const float16* p) {
  return float16_to_float_16(load_lanes16(bits_of(p)));
}

__attribute__((target("avx512f"))) inline void round_store16(bfloat16* p, __m512 v) {
  store_lanes16(p, float_to_bfloat16_16(v));
}
__attribute__((target("avx512f"))) inline void round_store16(float16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Eight doubles rounded to odd: truncated by the conversion's own rounding mode,
// then the lowest bit set where the truncation is inexact (an ordered compare: a
// NaN keeps the conversion's quiet NaN).
__attribute__((target("avx512f,avx2"))) inline __m256 round_to_odd8(__m512d d) {
  const __m256 truncated = _mm512_cvt_roundpd_ps(d, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask8 inexact = _mm512_cmp_pd_mask(_mm512_cvtps_pd(truncated), d, _CMP_NEQ_OQ);
  const __m256i odd = _mm512_cvtepi64_epi32(_mm512_maskz_set1_epi64(inexact, 1));
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(truncated), odd));
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// ---- AVX2 and F16C: eight lanes, a 16-bit pattern in the low half of each 32-bit lane.

__attribute__((target("avx2"))) inline __m256i load_lanes8(const std::uint16_t* p) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The lanes hold values below 2^16, which the unsigned saturating pack keeps.
__attribute__((target("avx2"))) inline void store_lanes8(void* p, __m256i lanes) {
  const __m128i lo = _mm256_castsi256_si128(lanes), hi = _mm256_extracti128_si256(lanes, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(lo, hi));
}

__attribute__((target("avx2"))) inline __m256i float_to_bfloat16_8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  // The carry rule of float_to_bfloat16_16.
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

__attribute__((target("avx2"))) inline __m256 float16_to_float_8(__m256i h) {
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
  const __m256i shifted = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7fff)), 13);
  const __m256i exponent = _mm256_and_si256(shifted, _mm256_set1_epi32(0x0f800000));
  const __m256i rebiased = _mm256_add_epi32(shifted, _mm256_set1_epi32((127 - 15) << 23));
  // The cases of float16_to_float_16.
  const __m256i special = _mm256_cmpeq_epi32(exponent, _mm256_set1_epi32(0x0f800000));
  const __m256i normal_or_special = _mm256_blendv_epi8(
      rebiased, _mm256_or_si256(shifted, _mm256_set1_epi32(0x7f800000)), special);
  const __m256i tiny = _mm256_cmpeq_epi32(exponent, _mm256_setzero_si256());
  const __m256 two_to_minus_14 = _mm256_castsi256_ps(_mm256_set1_epi32(113 << 23));
  const __m256 subnormal =
      _mm256_sub_ps(_mm256_castsi256_ps(_mm256_add_epi32(shifted, _mm256_set1_epi32(113 << 23))),
                    two_to_minus_14);
  const __m256i magnitude =
      _mm256_blendv_epi8(normal_or_special, _mm256_castps_si256(subnormal), tiny);
  return _mm256_castsi256_ps(_mm256_or_si256(magnitude, sign));
}

__attribute__((target("avx2"))) inline __m256 load_widen8(const bfloat16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(load_lanes8(bits_of(p)), 16));
}
__attribute__((target("avx2"))) inline __m256 load_widen8(const float16* p) {
  return float16_to_float_8(load_lanes8(bits_of(p)));
}

__attribute__((target("avx2"))) inline void round_store8(bfloat16* p, __m256 v) {
  store_lanes8(p, float_to_bfloat16_8(v));
}
__attribute__((target("avx2,f16c"))) inline void round_store8(float16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Stores for a kernel templated on its output type Out: float32 lanes stored as
// they are, or as bfloat16 or float16 rounded once as they are stored (the bits of
// storing float32 and then casting). The float16 ones need F16C beside AVX2: the
// caller's target names it, and its dispatch asks f16c_present().
__attribute__((target("avx2"))) inline void store8(float* p, __m256 v) {
  _mm256_storeu_ps(p, v);
}
__attribute__((target("avx2"))) inline void store8(bfloat16* p, __m256 v) {
  round_store8(p, v);
}
__attribute__((target("avx2,f16c"))) inline void store8(float16* p, __m256 v) {
  round_store8(p, v);
}

// The first `count` (0 to 7) lanes of v to p, nothing past them.
__attribute__((target("avx2"))) inline void store_first8(float* p, __m256 v, std::int64_t count) {
  store_first_lanes(p, v, count);
}
template <typename T>
__attribute__((target("avx2,f16c"))) inline void store_first8(T* p, __m256 v, std::int64_t count) {
  T lanes[8];
  round_store8(lanes, v);
  for (std::int64_t l = 0; l < count; ++l) p[l] = lanes[l];
}

// (The same warning as above; load_first16's vector of a stack array draws it as
// -Wuninitialized.)
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

__attribute__((target("avx512f"))) inline void store16(float* p, __m512 v) {
  _mm512_storeu_ps(p, v);
}
template <typename T>
__attribute__((target("avx512f"))) inline void store16(T* p, __m512 v) {
  round_store16(p, v);
}

// The first `count` (0 to 16) lanes of v to p, nothing past them (AVX-512 F has no
// 16-bit masked store: a 16-bit T goes through the stack).
__attribute__((target("avx512f"))) inline void store_first16(float* p, __m512 v,
                                                             std::int64_t count) {
  _mm512_mask_storeu_ps(p, first_lanes(count), v);
}
template <typename T>
__attribute__((target("avx512f"))) inline void store_first16(T* p, __m512 v, std::int64_t count) {
  T lanes[16];
  round_store16(lanes, v);
  for (std::int64_t l = 0; l < count && l < 16; ++l) p[l] = lanes[l];
}

// The loads of a kernel templated on its input type In, store16's counterparts:
// sixteen float32 lanes as they are, or sixteen 16-bit values widened exactly
// (load_widen16), so a 16-bit row is read as its float32 copy would be.
// load_first16 reads the first `count` (none for count <= 0, sixteen from 16) and
// gives zeros past them, reading nothing past them.
__attribute__((target("avx512f"))) inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
template <typename T>
__attribute__((target("avx512f"))) inline __m512 load16(const T* p) {
  return load_widen16(p);
}
__attribute__((target("avx512f"))) inline __m512 load_first16(const float* p, std::int64_t count) {
  return _mm512_maskz_loadu_ps(first_lanes(count), p);
}
template <typename T>
__attribute__((target("avx512f"))) inline __m512 load_first16(const T* p, std::int64_t count) {
  if (count >= 16) return load_widen16(p);
  if (count <= 0) return _mm512_setzero_ps();
  T lanes[16] = {};  // AVX-512 F has no 16-bit masked load: a part goes through the stack
  std::memcpy(lanes, p, static_cast<std::size_t>(count) * sizeof(T));
  return load_widen16(lanes);
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Four doubles rounded to odd, engine/half.h's way (AVX2 has no per-instruction
// rounding mode): rounded to nearest, one ulp back toward zero where that went away
// from zero, and the lowest bit set where inexact (ordered compares: a NaN keeps the
// conversion's quiet NaN).
__attribute__((target("avx2"))) inline __m128 round_to_odd4(__m256d d) {
  const __m128 nearest = _mm256_cvtpd_ps(d);
  const __m256d back = _mm256_cvtps_pd(nearest);
  const __m256d sign = _mm256_set1_pd(-0.0);
  const __m256d away =
      _mm256_cmp_pd(_mm256_andnot_pd(sign, back), _mm256_andnot_pd(sign, d), _CMP_GT_OQ);
  const __m256d inexact = _mm256_cmp_pd(back, d, _CMP_NEQ_OQ);
  // The 64-bit masks' low halves as four 32-bit masks (all ones or zeros).
  const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m128i away32 =
      _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(away), low_halves));
  const __m128i inexact32 =
      _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), low_halves));
  const __m128i bits = _mm_add_epi32(_mm_castps_si128(nearest), away32);  // - 1 where away
  return _mm_castsi128_ps(_mm_or_si128(bits, _mm_srli_epi32(inexact32, 31)));
}

#endif  // TL_CPU_X86

}  // namespace towerlab::cpu
