// CPU cast: the plain reference (kernels/reference/cast.h) on each thread's range,
// for each of the 16 pairs of dtypes, except the four between float32 and a 16-bit
// dtype, which run eight values at a time where the CPU kernels run AVX2 code
// (avx2_selected(), kernels/cpu/x86.h).
//
// Those four are what a bf16 or fp16 tower casts every step: its working copy of
// the variables, each GEMM-class op's activation and output gradient rounded to 16
// bits, and the widening of conv2d's operands into float32 scratch. Run element by
// element (engine/half.h's branchy conversions, which the compiler does not
// vectorize) they were, after the GEMMs, the largest cost of a 16-bit step
// (bench/results/precision_cpu_f488152.md). The vector code gives the reference's
// bits for every input, NaN payloads, infinities, subnormals and ties included
// (CastCpu.EveryIsaGivesTheReferenceBits), by these means:
//   float32 -> bfloat16  integer round to nearest even on the 32-bit pattern, NaNs
//                        quieted with their top payload bits, as the reference;
//   bfloat16 -> float32  the pattern shifted up 16 bits (exact);
//   float32 -> float16   F16C's vcvtps2ph with round-to-nearest-even, which gives
//                        the reference's bits (overflow to infinity from 65520, exact
//                        subnormals, quiet NaN with the top payload bits; a float32
//                        subnormal is a signed zero in float16 with or without
//                        MXCSR.DAZ);
//   float16 -> float32   integer rebias of exponent and mantissa, subnormals as
//                        mantissa * 2^-24 by one exact float subtraction, infinities
//                        and NaNs with the payload moved up unchanged (vcvtph2ps
//                        would quiet a signaling NaN, which the reference keeps).
#include "kernels/cpu/cast.h"

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/x86.h"
#include "kernels/reference/cast.h"

#if TL_CPU_X86
#include <cpuid.h>
#endif

namespace towerlab::cpu {
namespace {

#if TL_CPU_X86

__attribute__((target("avx2"))) __m256i load8(const std::uint16_t* p) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The low 16 bits of eight 32-bit lanes, packed into eight 16-bit values in order.
__attribute__((target("avx2"))) void store8(std::uint16_t* p, __m256i lanes) {
  const __m128i lo = _mm256_castsi256_si128(lanes), hi = _mm256_extracti128_si256(lanes, 1);
  const __m128i packed = _mm_packus_epi32(_mm_and_si128(lo, _mm_set1_epi32(0xffff)),
                                          _mm_and_si128(hi, _mm_set1_epi32(0xffff)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

__attribute__((target("avx2"))) __m256i float_to_bfloat16_8(__m256i x) {
  const __m256i magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  // Adding 0x7fff plus the kept part's lowest bit carries into bit 16 exactly when
  // the dropped half is above one half, or one half with an odd kept part.
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

__attribute__((target("avx2,f16c"))) __m128i float_to_float16_8(__m256 x) {
  return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

__attribute__((target("avx2"))) __m256 float16_to_float_8(__m256i h) {
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
  const __m256i shifted = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7fff)), 13);
  const __m256i exponent = _mm256_and_si256(shifted, _mm256_set1_epi32(0x0f800000));
  const __m256i rebiased = _mm256_add_epi32(shifted, _mm256_set1_epi32((127 - 15) << 23));
  // Infinity and NaN: float16's largest exponent becomes float32's.
  const __m256i special = _mm256_cmpeq_epi32(exponent, _mm256_set1_epi32(0x0f800000));
  const __m256i normal_or_special = _mm256_blendv_epi8(
      rebiased, _mm256_or_si256(shifted, _mm256_set1_epi32(0x7f800000)), special);
  // Zero and subnormals: (1 + m / 1024) 2^-14 - 2^-14 = m 2^-24, exactly.
  const __m256i tiny = _mm256_cmpeq_epi32(exponent, _mm256_setzero_si256());
  const __m256 two_to_minus_14 = _mm256_castsi256_ps(_mm256_set1_epi32(113 << 23));
  const __m256 subnormal =
      _mm256_sub_ps(_mm256_castsi256_ps(_mm256_add_epi32(shifted, _mm256_set1_epi32(113 << 23))),
                    two_to_minus_14);
  const __m256i magnitude =
      _mm256_blendv_epi8(normal_or_special, _mm256_castps_si256(subnormal), tiny);
  return _mm256_castsi256_ps(_mm256_or_si256(magnitude, sign));
}

// dst[i] = cast_value<D>(src[i]) for one of the four pairs, eight at a time; the
// last n % 8 by the reference.
template <typename D, typename S>
__attribute__((target("avx2,f16c"))) void cast_avx2(D* dst, const S* src, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if constexpr (std::is_same_v<S, float>) {
      const __m256 x = _mm256_loadu_ps(src + i);
      auto* out = reinterpret_cast<std::uint16_t*>(dst + i);
      if constexpr (std::is_same_v<D, bfloat16>) {
        store8(out, float_to_bfloat16_8(_mm256_castps_si256(x)));
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), float_to_float16_8(x));
      }
    } else {
      const __m256i h = load8(reinterpret_cast<const std::uint16_t*>(src + i));
      if constexpr (std::is_same_v<S, bfloat16>) {
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
      } else {
        _mm256_storeu_ps(dst + i, float16_to_float_8(h));
      }
    }
  }
  reference::cast(dst + i, src + i, n - i);
}

// CPUID leaf 1, ECX bit 29 (GCC's __builtin_cpu_supports knows "f16c", Clang's
// does not).
bool f16c_present() {
  static const bool present = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  }();
  return present;
}

#endif  // TL_CPU_X86

template <typename D, typename S>
constexpr bool kVectorPair = (std::is_same_v<D, float> &&
                              (std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>)) ||
                             (std::is_same_v<S, float> &&
                              (std::is_same_v<D, bfloat16> || std::is_same_v<D, float16>));

}  // namespace

void cast(const Tensor& dst, const Tensor& src) {
  with_any_dtype(dst.dtype(), [&]<typename D>() {
    with_any_dtype(src.dtype(), [&]<typename S>() {
      D* out = dst.data<D>();       // [n]
      const S* in = src.data<S>();  // [n]
#if TL_CPU_X86
      if constexpr (kVectorPair<D, S>) {
        if (avx2_selected() && f16c_present()) {
          parallel_rows(dst.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
            cast_avx2(out + lo, in + lo, hi - lo);
          });
          return;
        }
      }
#endif
      parallel_rows(dst.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
        reference::cast(out + lo, in + lo, hi - lo);
      });
    });
  });
}

}  // namespace towerlab::cpu
