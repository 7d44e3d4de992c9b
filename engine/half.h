// bfloat16 and float16: the 16-bit storage types of DType::BFloat16 and
// DType::Float16, with their exact conversions, for host code and for the CUDA
// kernels (the same functions run in both, so the two cannot round differently).
//
//   bfloat16  sign, 8 exponent bits (float32's), 7 mantissa bits: float32 with the
//             low 16 bits dropped; the range of float32, about 3 significant digits
//   float16   IEEE 754 binary16: sign, 5 exponent bits (bias 15), 10 mantissa bits;
//             largest finite 65504, smallest normal 2^-14, smallest subnormal 2^-24
//
// The rounding rule, for every conversion into a 16-bit type:
//   - round to nearest, ties to even (IEEE 754's default, and PyTorch's);
//   - a NaN stays a NaN of the same sign, made quiet, keeping the top bits of its
//     payload (a signalling NaN whose payload sits only in the low bits would
//     otherwise become an infinity);
//   - +-infinity stays +-infinity, and a finite value that rounds past the largest
//     finite one becomes an infinity of its sign (float16: |x| >= 65520);
//   - float16 subnormals are produced exactly (rounded to multiples of 2^-24), and
//     values at or below 2^-25 in magnitude become a zero of their sign.
// Widening to float32 is exact. From float64 the value is rounded once, directly
// (through a float32 rounded to odd, which cannot double-round: float32 keeps at
// least two more bits than either 16-bit type, subnormals included).
//
// The structs hold the bits only: there is no arithmetic on them. Kernels widen to
// float, compute, and round once when they store.
#pragma once

#include <bit>
#include <cstdint>

#include "host_device.h"

namespace towerlab {

namespace half_detail {

TL_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}

TL_HOST_DEVICE inline float bits_float(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

// `kept` rounded to nearest even after dropping `dropped_bits` low bits of `value`
// (the caller has already shifted `kept` = value >> dropped_bits).
TL_HOST_DEVICE inline std::uint32_t round_even(std::uint32_t kept, std::uint32_t value,
                                               unsigned dropped_bits) {
  const std::uint32_t rest = value & ((1u << dropped_bits) - 1u);
  const std::uint32_t half = 1u << (dropped_bits - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

TL_HOST_DEVICE inline std::uint16_t float_to_bfloat16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the sign and the top payload bits, set the quiet bit.
    return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  }
  // An infinity has zero low bits and stays; the largest finite floats round up
  // into the exponent field, which is the infinity they should become.
  return static_cast<std::uint16_t>(round_even(x >> 16, x, 16));
}

TL_HOST_DEVICE inline std::uint16_t float_to_float16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) {  // NaN: quiet, sign and top payload bits kept
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x03ffu));
  }
  if (mag >= 0x477ff000u) {  // >= 65520 (halfway from 65504 to 2^16, ties to even: up)
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (mag >= 0x38800000u) {  // >= 2^-14: a normal float16
    // Rebias the exponent from float32's 127 to float16's 15 and drop 13 mantissa
    // bits; a carry out of the mantissa correctly bumps the exponent.
    const std::uint32_t rebased = mag - ((127u - 15u) << 23);
    return static_cast<std::uint16_t>(sign | round_even(rebased >> 13, rebased, 13));
  }
  if (mag <= 0x33000000u) {  // <= 2^-25: half the smallest subnormal or less, a tie to 0
    return static_cast<std::uint16_t>(sign);
  }
  // A float16 subnormal: the value in units of 2^-24, rounded. With the implicit
  // bit m = 1.mantissa * 2^23 and biased exponent e (102 < e < 113), the value is
  // m * 2^(e - 150) = (m >> (126 - e)) units; the shift is 14 to 24. Rounding up
  // from the largest subnormal gives 0x0400, the smallest normal, as it should.
  const std::uint32_t m = (mag & 0x007fffffu) | 0x00800000u;
  const unsigned shift = 126u - (mag >> 23);
  return static_cast<std::uint16_t>(sign | round_even(m >> shift, m, shift));
}

TL_HOST_DEVICE inline float float16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x03ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32 (a power-of-two scale).
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return bits_float(sign | float_bits(magnitude));
  }
  return bits_float(sign | ((exponent + 127u - 15u) << 23) | (mantissa << 13));
}

// float64 to float32 rounded to odd: truncated toward zero, with the lowest bit set
// when anything was dropped. Host only (float64 tensors live on the CPU).
inline float round_to_odd(double d) {
  float f = static_cast<float>(d);                      // to nearest
  if (d != d || static_cast<double>(f) == d) return f;  // NaN, or exact (infinities too)
  std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  // Rounded away from zero (an overflow to infinity too): one ulp back toward 0.
  // A value that rounded to zero was truncated already.
  const double rounded = static_cast<double>(f);
  if ((rounded < 0 ? -rounded : rounded) > (d < 0 ? -d : d)) bits -= 1u;
  return std::bit_cast<float>(bits | 1u);
}

}  // namespace half_detail

struct bfloat16 {
  std::uint16_t bits;

  bfloat16() = default;
  TL_HOST_DEVICE explicit bfloat16(float f) : bits(half_detail::float_to_bfloat16_bits(f)) {}
  explicit bfloat16(double d) : bfloat16(half_detail::round_to_odd(d)) {}
  TL_HOST_DEVICE explicit operator float() const {
    return half_detail::bits_float(static_cast<std::uint32_t>(bits) << 16);
  }
  explicit operator double() const { return static_cast<double>(static_cast<float>(*this)); }
  TL_HOST_DEVICE static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 v;
    v.bits = b;
    return v;
  }
};

struct float16 {
  std::uint16_t bits;

  float16() = default;
  TL_HOST_DEVICE explicit float16(float f) : bits(half_detail::float_to_float16_bits(f)) {}
  explicit float16(double d) : float16(half_detail::round_to_odd(d)) {}
  TL_HOST_DEVICE explicit operator float() const {
    return half_detail::float16_bits_to_float(bits);
  }
  explicit operator double() const { return static_cast<double>(static_cast<float>(*this)); }
  TL_HOST_DEVICE static float16 from_bits(std::uint16_t b) {
    float16 v;
    v.bits = b;
    return v;
  }
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2, "16-bit storage types");

// One value of float, double, bfloat16 or float16 converted to another of them,
// rounded once by the rule above. Between the two 16-bit types it goes through
// float32, which holds either type's value exactly. Host only (it takes float64);
// the CUDA cast kernels write static_cast<To>(static_cast<float>(v)), which is the
// same for every pair a GPU has.
template <typename To, typename From>
To cast_value(From v) {
  if constexpr (sizeof(From) == 2 && sizeof(To) == 2) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace towerlab
