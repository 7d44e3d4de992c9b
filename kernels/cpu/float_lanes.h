// Float32 math in vector lanes for the CPU's elementwise and row kernels (the
// activations, softmax): exp, the normal distribution's tail, the logistic
// function and tanh, each written once on GCC/Clang vector extensions of W lanes,
// and run_float_lanes(), which runs a kernel body with W = 16 (AVX-512), 8 (AVX2
// and FMA) or 4 (portable: SSE on x86-64, NEON or scalar code elsewhere), chosen at
// run time as kernels/cpu/x86.h chooses (the GEMM's ISA, so TOWERLAB_GEMM_ISA pins
// these too). The body is inlined whole into a function compiled for its ISA
// (__attribute__((flatten))), so one source gives the three machine codes.
//
// Accuracy. These replace the double references' std::exp and std::erfc where the
// contract allows float32 math: their results stay within 1e-6 + 1e-5 |reference|
// of the double reference (the tolerance kernels/activation.h and
// kernels/softmax.h state), tested on every ISA (tests/activation_test.cpp,
// tests/softmax_test.cpp). The approximations are our own fits, made with numpy
// and mpmath (40 digits) by weighted least squares on Chebyshev nodes iterated
// towards minimax (Lawson's reweighting); each error below is the fit's own over its
// interval (tools/float_lanes_fit.py prints the fits and their errors again):
//   exp_lanes        e^r = 1 + r + r^2 P(r), |r| <= ln2 / 2, P of degree 4: the fit's
//                    relative error 1.1e-8, below float32's rounding.
//   normal_tail      Phi(-a) exp(a^2 / 2) = t Q(t), t = 4 / (4 + a), a >= 0, Q of
//                    degree 9: the fit 5.7e-8, evaluated in float32 (numpy, t rounded) 3.6e-7
//                    relative, for every a, so Phi(-a) is accurate relative to its value
//                    in the whole tail (Cody's idea of a rational in 1 / a for erfc,
//                    here as a polynomial in a bounded variable).
//   tanh_lanes       tanh(a) = a + a^3 R(a^2) for a < 0.625, R of degree 4: the fit
//                    1.8e-8 relative; above, (1 - e) / (1 + e), e = exp(-2a), which
//                    does not cancel there.
// The worst errors of the kernels against the double reference, measured on every
// ISA, are in bench/results (vit_cpu_activations_*.md).
//
// Special values follow the references: a NaN stays a NaN (no clamp swallows it:
// clamps are selections on comparisons, false for a NaN), exp(-inf) = 0,
// exp(+inf) = +inf, and no exp of a positive argument is taken where the contract
// promises no overflow (the logistic takes exp(-|x|)).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

// A 64-byte vector passed by value in code compiled without AVX-512 would change
// the calling convention, and GCC warns at every such signature, here and in the
// lane functions of the kernels that include this header (so the warning stays off
// to the end of their file); every one of them is inlined into its ISA's
// run_float_lanes_*, so none is ever called with one.
#pragma GCC diagnostic ignored "-Wpsabi"

// W float32 lanes, the integer lanes of their bits and comparisons, and W doubles. Spelled out
// per width: GCC drops vector_size from an alias template whose size depends on W.
template <int W>
struct LaneTypes;
#define TL_LANE_TYPES(W)                                          \
  template <>                                                     \
  struct LaneTypes<W> {                                           \
    typedef float Float __attribute__((vector_size(4 * W)));      \
    typedef std::int32_t Int __attribute__((vector_size(4 * W))); \
    typedef double Double __attribute__((vector_size(8 * W)));    \
  };
TL_LANE_TYPES(4)
TL_LANE_TYPES(8)
TL_LANE_TYPES(16)
#undef TL_LANE_TYPES

template <int W>
using FloatLanes = typename LaneTypes<W>::Float;
template <int W>
using IntLanes = typename LaneTypes<W>::Int;
template <int W>
using DoubleLanes = typename LaneTypes<W>::Double;  // W doubles, for sums of float lanes

template <int W>
inline DoubleLanes<W> widen_lanes(FloatLanes<W> v) {
  return __builtin_convertvector(v, DoubleLanes<W>);
}

// v in every lane, a -0 kept (adding v to a zero vector would make it +0).
template <int W>
inline FloatLanes<W> splat_lanes(float v) {
  FloatLanes<W> lanes;
  for (int i = 0; i < W; ++i) lanes[i] = v;
  return lanes;
}

// m ? a : b, lane by lane (m all ones or zeros), as a bitwise blend: the same code
// for GCC and Clang, whose vector ?: differ.
template <int W>
inline FloatLanes<W> select_lanes(IntLanes<W> m, FloatLanes<W> a, FloatLanes<W> b) {
  return reinterpret_cast<FloatLanes<W>>((m & reinterpret_cast<IntLanes<W>>(a)) |
                                         (~m & reinterpret_cast<IntLanes<W>>(b)));
}

template <int W>
inline FloatLanes<W> abs_lanes(FloatLanes<W> x) {
  return reinterpret_cast<FloatLanes<W>>(reinterpret_cast<IntLanes<W>>(x) & 0x7FFFFFFF);
}

// b == 0 ? 0 : a * b: a factor x times one that has saturated to 0, which would be
// the NaN of inf * 0 at x = +-inf (the references' times_unless_zero).
template <int W>
inline FloatLanes<W> times_unless_zero(FloatLanes<W> a, FloatLanes<W> b) {
  return select_lanes<W>(b == 0.0f, splat_lanes<W>(0.0f), a * b);
}

// Copies the first `count` (0 to 2W - 1) floats from src to dst in pieces of W, W / 2,
// .., 1 as count's bits ask: each a copy of a constant size (a memcpy of a variable
// size becomes `rep movsb`, whose start-up cost took most of a short row).
template <int W>
inline void copy_first(float* dst, const float* src, std::int64_t count) {
  for (int piece = W; piece >= 1; piece /= 2) {
    if (count & piece) {
      std::memcpy(dst, src, piece * sizeof(float));
      dst += piece;
      src += piece;
    }
  }
}

#if TL_CPU_X86
// The partial groups' masked loads and stores, compiled for their ISA: lanes[16]
// (or [8]) holds the group in memory, since a vector argument between functions of
// different targets is refused (Clang) and intrinsics do not inline into the
// generic templates below; run_float_lanes_* inline all of it.
__attribute__((target("avx512f"))) inline void load_partial16(float* lanes, const float* p,
                                                              std::int64_t count, float fill) {
  _mm512_storeu_ps(lanes, _mm512_mask_loadu_ps(_mm512_set1_ps(fill), first_lanes(count), p));
}
__attribute__((target("avx2"))) inline void load_partial8(float* lanes, const float* p,
                                                          std::int64_t count, float fill) {
  const __m256i mask = first_lanes8(count);
  _mm256_storeu_ps(lanes, _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, mask),
                                           _mm256_castsi256_ps(mask)));
}
__attribute__((target("avx512f"))) inline void store_partial16(float* p, const float* lanes,
                                                               std::int64_t count) {
  _mm512_mask_storeu_ps(p, first_lanes(count), _mm512_loadu_ps(lanes));
}
// x86.h's store_first_lanes: AVX2's masked store is slow on AMD.
__attribute__((target("avx2"))) inline void store_partial8(float* p, const float* lanes,
                                                           std::int64_t count) {
  store_first_lanes(p, _mm256_loadu_ps(lanes), count);
}
#endif

// `count` (1 to W) values from p, `fill` in the other lanes; reads only those. A
// partial group is a masked load with AVX-512 and AVX2, pieces of constant size in
// the portable lanes.
template <int W>
inline FloatLanes<W> load_lanes(const float* p, std::int64_t count, float fill = 0.0f) {
  FloatLanes<W> v;
  if (count == W) {
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  float lanes[W];
#if TL_CPU_X86
  if constexpr (W == 16) {
    load_partial16(lanes, p, count, fill);
  } else if constexpr (W == 8) {
    load_partial8(lanes, p, count, fill);
  } else
#endif
  {
    for (int i = 0; i < W; ++i) lanes[i] = fill;
    copy_first<W>(lanes, p, count);
  }
  std::memcpy(&v, lanes, sizeof v);
  return v;
}

// The first `count` (1 to W) lanes of v to p; writes nothing past them.
template <int W>
inline void store_lanes(float* p, FloatLanes<W> v, std::int64_t count) {
  if (count == W) {
    std::memcpy(p, &v, sizeof v);
    return;
  }
  float lanes[W];
  std::memcpy(lanes, &v, sizeof lanes);
#if TL_CPU_X86
  if constexpr (W == 16) {
    store_partial16(p, lanes, count);
  } else if constexpr (W == 8) {
    store_partial8(p, lanes, count);
  } else
#endif
  {
    copy_first<W>(p, lanes, count);
  }
}

// fn(first, count) for the groups of W values that cover [0, n) in order, the last
// one partial (count < W) where W does not divide n.
template <int W, typename Fn>
inline void for_each_lane_group(std::int64_t n, const Fn& fn) {
  for (std::int64_t i = 0; i < n; i += W) fn(i, n - i < W ? n - i : std::int64_t(W));
}

// exp(hi + lo) for |lo| much smaller than 1: lo carries what the float hi could not
// hold (normal_tail's -a^2 / 2 is exact only as two parts). Cody and Waite's
// reduction: n = round(hi / ln 2), r = hi - n ln2_hi - n ln2_lo + lo (ln2_hi has 9
// significant bits, so n ln2_hi and hi - n ln2_hi are exact), e^r by the fit above,
// times 2^n as two powers of two so that results down in the subnormals round
// once. hi is clamped to [-110, 89] first, beyond which the result is 0 or +inf.
template <int W>
inline FloatLanes<W> exp_lanes(FloatLanes<W> hi, FloatLanes<W> lo = FloatLanes<W>{}) {
  using F = FloatLanes<W>;
  using I = IntLanes<W>;
  hi = select_lanes<W>(hi < -110.0f, splat_lanes<W>(-110.0f), hi);
  hi = select_lanes<W>(hi > 89.0f, splat_lanes<W>(89.0f), hi);
  // Adding 1.5 2^23 rounds to an integer, which the low bits of the sum then hold.
  constexpr float kRound = 12582912.0f;
  const F shifted = hi * 1.44269504088896341f + kRound;
  const I n = reinterpret_cast<I>(shifted) - reinterpret_cast<I>(splat_lanes<W>(kRound));
  const F nf = shifted - kRound;
  const F r = (hi - nf * 0.693359375f) - nf * -2.12194440e-4f + lo;
  F p = splat_lanes<W>(0.00139411096f);
  p = p * r + 0.00836317521f;
  p = p * r + 0.0416663736f;
  p = p * r + 0.166665763f;
  p = p * r + 0.5f;
  p = (p * r) * r + r + 1.0f;
  const I half = n >> 1;
  const F scale_a = reinterpret_cast<F>((half + 127) << 23);
  const F scale_b = reinterpret_cast<F>((n - half + 127) << 23);
  return p * scale_a * scale_b;
}

// The logistic function s(x) = 1 / (1 + exp(-x)) and its derivative s (1 - s),
// both from e = exp(-|x|) (never exp of a positive argument): s = 1 / (1 + e) for
// x >= 0, e / (1 + e) below, and s (1 - s) = e / (1 + e)^2, which keeps its value
// relative to itself in both tails where 1 - s would round to 0.
template <int W>
struct Logistic {
  FloatLanes<W> value, derivative;
};

template <int W>
inline Logistic<W> logistic_lanes(FloatLanes<W> x) {
  const FloatLanes<W> e = exp_lanes<W>(-abs_lanes<W>(x));
  const FloatLanes<W> inv = 1.0f / (1.0f + e);
  return {select_lanes<W>(x >= 0.0f, inv, e * inv), e * inv * inv};
}

// tanh(x) and its derivative 1 - tanh(x)^2: the odd fit below 0.625, and
// (1 - e) / (1 + e) with derivative 4 e / (1 + e)^2, e = exp(-2 |x|), above it.
template <int W>
struct Tanh {
  FloatLanes<W> value, derivative;
};

template <int W>
inline Tanh<W> tanh_lanes(FloatLanes<W> x) {
  using F = FloatLanes<W>;
  const F a = abs_lanes<W>(x);
  const F a2 = a * a;
  F q = splat_lanes<W>(-0.00611318834f);
  q = q * a2 + 0.0210100785f;
  q = q * a2 - 0.0538540706f;
  q = q * a2 + 0.133327946f;
  q = q * a2 - 0.333333284f;
  const F small = a + a * a2 * q;
  const F e = exp_lanes<W>(-2.0f * a);
  const F inv = 1.0f / (1.0f + e);
  const auto is_small = a < 0.625f;
  const F t = select_lanes<W>(is_small, small, (1.0f - e) * inv);
  const auto sign = reinterpret_cast<IntLanes<W>>(x) & std::int32_t(0x80000000u);
  return {reinterpret_cast<F>(reinterpret_cast<IntLanes<W>>(t) | sign),
          select_lanes<W>(is_small, 1.0f - small * small, 4.0f * e * inv * inv)};
}

// Phi(-|x|) (Phi the standard normal distribution function) and the density
// phi(x) = exp(-x^2 / 2) / sqrt(2 pi), sharing one exp. exp(-a^2 / 2) takes a^2
// exactly as two parts: a_hi (a's 12 leading bits, so a_hi^2 is exact) and
// a_lo = a - a_hi, a^2 = a_hi^2 + a_lo (a + a_hi). Past a = 20 both are 0 in
// float32, so a is clamped there (which keeps +-inf from making inf - inf).
template <int W>
struct NormalTail {
  FloatLanes<W> lower_tail, density;
};

template <int W>
inline NormalTail<W> normal_tail(FloatLanes<W> x) {
  using F = FloatLanes<W>;
  F a = abs_lanes<W>(x);
  a = select_lanes<W>(a > 20.0f, splat_lanes<W>(20.0f), a);
  const F a_hi = reinterpret_cast<F>(reinterpret_cast<IntLanes<W>>(a) & std::int32_t(0xFFFFF000u));
  const F a_lo = a - a_hi;
  const F e = exp_lanes<W>(-0.5f * (a_hi * a_hi), -0.5f * (a_lo * (a + a_hi)));
  const F t = 4.0f / (4.0f + a);
  F q = splat_lanes<W>(0.0200522244f);
  q = q * t - 0.0819316432f;
  q = q * t + 0.0972568095f;
  q = q * t - 0.0330561921f;
  q = q * t + 0.0642718300f;
  q = q * t + 0.0588606782f;
  q = q * t + 0.0816058889f;
  q = q * t + 0.0934686586f;
  q = q * t + 0.0997361764f;
  q = q * t + 0.0997355729f;
  return {e * (t * q), e * 0.398942280401432678f};
}

// Runs body.template operator()<W>() with the W of the ISA that runs (the file's
// opening comment); the body and all it calls are inlined into the function
// compiled for that ISA.
#if TL_CPU_X86
template <typename Body>
__attribute__((target("avx512f"), flatten)) void run_float_lanes_avx512(const Body& body) {
  body.template operator()<16>();
}
template <typename Body>
__attribute__((target("avx2,fma"), flatten)) void run_float_lanes_avx2(const Body& body) {
  body.template operator()<8>();
}
#endif
template <typename Body>
__attribute__((flatten)) void run_float_lanes_portable(const Body& body) {
  body.template operator()<4>();
}

template <typename Body>
void run_float_lanes(const Body& body) {
#if TL_CPU_X86
  if (avx512_selected()) return run_float_lanes_avx512(body);
  if (avx2_selected()) return run_float_lanes_avx2(body);
#endif
  run_float_lanes_portable(body);
}

}  // namespace towerlab::cpu
