// CPU cast: the plain reference (kernels/reference/cast.h) on each thread's range,
// for each of the 16 pairs of dtypes, except the four between float32 and a 16-bit
// dtype, which run kernels/cpu/convert16.h's vector conversions (sixteen values at
// a time where the CPU kernels run AVX-512 code, eight where they run AVX2: x86.h).
//
// Those four are what a bf16 or fp16 tower casts every step: its working copy of
// the variables, each GEMM-class op's activation and output gradient rounded to 16
// bits, and the widening of conv2d's operands into float32 scratch. Run element by
// element (engine/half.h's branchy conversions, which the compiler does not
// vectorize) they were, after the GEMMs, the largest cost of a 16-bit step
// (bench/results/precision_cpu_f488152.md). This file also defines convert16.h's
// array conversions, which the other 16-bit element-wise kernels call.
#include "kernels/cpu/cast.h"

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/x86.h"
#include "kernels/reference/cast.h"

namespace towerlab::cpu {
namespace {

#if TL_CPU_X86

// The array conversions per ISA, whole vectors first and the last n % lanes by the
// reference.
template <typename T>
__attribute__((target("avx512f"))) void widen_avx512(float* dst, const T* src, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_widen16(src + i));
  reference::cast(dst + i, src + i, n - i);
}

template <typename T>
__attribute__((target("avx512f"))) void round_avx512(T* dst, const float* src, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) round_store16(dst + i, _mm512_loadu_ps(src + i));
  reference::cast(dst + i, src + i, n - i);
}

template <typename T>
__attribute__((target("avx2,f16c"))) void widen_avx2(float* dst, const T* src, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_widen8(src + i));
  reference::cast(dst + i, src + i, n - i);
}

template <typename T>
__attribute__((target("avx2,f16c"))) void round_avx2(T* dst, const float* src, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) round_store8(dst + i, _mm256_loadu_ps(src + i));
  reference::cast(dst + i, src + i, n - i);
}

__attribute__((target("avx512f,avx2"))) void round_to_odd_avx512(float* dst, const double* src,
                                                                 std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, round_to_odd8(_mm512_loadu_pd(src + i)));
  for (; i < n; ++i) dst[i] = half_detail::round_to_odd(src[i]);
}

__attribute__((target("avx2"))) void round_to_odd_avx2(float* dst, const double* src,
                                                       std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(dst + i, round_to_odd4(_mm256_loadu_pd(src + i)));
  for (; i < n; ++i) dst[i] = half_detail::round_to_odd(src[i]);
}

#endif  // TL_CPU_X86

template <typename D, typename S>
constexpr bool kVectorPair = (std::is_same_v<D, float> &&
                              (std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>)) ||
                             (std::is_same_v<S, float> &&
                              (std::is_same_v<D, bfloat16> || std::is_same_v<D, float16>));

}  // namespace

template <typename T>
void widen_16bit(float* dst, const T* src, std::int64_t n) {
#if TL_CPU_X86
  if (avx512_selected()) return widen_avx512(dst, src, n);
  if (avx2_selected() && f16c_present()) return widen_avx2(dst, src, n);
#endif
  reference::cast(dst, src, n);
}

template <typename T>
void round_to_16bit(T* dst, const float* src, std::int64_t n) {
#if TL_CPU_X86
  if (avx512_selected()) return round_avx512(dst, src, n);
  if (avx2_selected() && f16c_present()) return round_avx2(dst, src, n);
#endif
  reference::cast(dst, src, n);
}

void round_to_odd_float(float* dst, const double* src, std::int64_t n) {
#if TL_CPU_X86
  if (avx512_selected()) return round_to_odd_avx512(dst, src, n);
  if (avx2_selected()) return round_to_odd_avx2(dst, src, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) dst[i] = half_detail::round_to_odd(src[i]);
}

template void widen_16bit<bfloat16>(float*, const bfloat16*, std::int64_t);
template void widen_16bit<float16>(float*, const float16*, std::int64_t);
template void round_to_16bit<bfloat16>(bfloat16*, const float*, std::int64_t);
template void round_to_16bit<float16>(float16*, const float*, std::int64_t);

void cast(const Tensor& dst, const Tensor& src) {
  with_any_dtype(dst.dtype(), [&]<typename D>() {
    with_any_dtype(src.dtype(), [&]<typename S>() {
      D* out = dst.data<D>();       // [n]
      const S* in = src.data<S>();  // [n]
      parallel_rows(dst.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
        if constexpr (!kVectorPair<D, S>) {
          reference::cast(out + lo, in + lo, hi - lo);
        } else if constexpr (std::is_same_v<D, float>) {
          widen_16bit(out + lo, in + lo, hi - lo);
        } else {
          round_to_16bit(out + lo, in + lo, hi - lo);
        }
      });
    });
  });
}

// Block by block through a 16-bit buffer on the stack, in L1 between its two
// conversions: one pass over the tensors.
void round_through(const Tensor& dst, const Tensor& src, DType through) {
  const auto rounded = [&]<typename T>() {
    float* out = dst.data<float>();       // [n]
    const float* in = src.data<float>();  // [n]
    parallel_rows(dst.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      T block[kConvertBlock];
      for_each_block(hi - lo, [&](std::int64_t first, std::int64_t count) {
        round_to_16bit(block, in + lo + first, count);
        widen_16bit(out + lo + first, block, count);
      });
    });
  };
  if (through == DType::BFloat16) {
    rounded.template operator()<bfloat16>();
  } else {
    rounded.template operator()<float16>();
  }
}

}  // namespace towerlab::cpu
