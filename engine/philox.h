// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based generator. Output i of a stream is a pure function of
// (seed, subsequence, i), so any element can be drawn on any device in any order
// and the CPU and CUDA backends produce the same numbers for the same seed. That
// is what makes initial weights independent of the device they are created on.
//
// Header-only and usable from host and device code.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace towerlab::philox {

struct Uint4 {
  std::uint32_t x, y, z, w;
};

TL_HOST_DEVICE inline std::uint32_t mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t* hi) {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  *hi = static_cast<std::uint32_t>(product >> 32);
  return static_cast<std::uint32_t>(product);
}

// The round constants of the paper: the multipliers of words x and z, and the
// increments of the key's two words after each round (kernels/cpu/dropout.cpp runs
// the same rounds in vector lanes).
inline constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

// Ten rounds of Philox4x32 on `counter` under `key`.
TL_HOST_DEVICE inline Uint4 philox4x32_10(Uint4 counter, std::uint32_t key0, std::uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, hi1;
    const std::uint32_t lo0 = mulhilo(kMul0, counter.x, &hi0);
    const std::uint32_t lo1 = mulhilo(kMul1, counter.z, &hi1);
    counter = {hi1 ^ counter.y ^ key0, lo1, hi0 ^ counter.w ^ key1, lo0};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// The four 32-bit words for element `index` of stream (seed, subsequence).
TL_HOST_DEVICE inline Uint4 draw(std::uint64_t seed, std::uint64_t subsequence,
                                 std::uint64_t index) {
  Uint4 counter{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                static_cast<std::uint32_t>(subsequence),
                static_cast<std::uint32_t>(subsequence >> 32)};
  return philox4x32_10(counter, static_cast<std::uint32_t>(seed),
                       static_cast<std::uint32_t>(seed >> 32));
}

// A float in [0, 1) from the top 24 bits: exact in float32, identical on every device.
TL_HOST_DEVICE inline float to_unit_float(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// A double in (0, 1] from 53 bits of two words (never 0, so that log() is finite).
TL_HOST_DEVICE inline double to_open_unit_double(std::uint32_t hi, std::uint32_t lo) {
  const std::uint64_t bits = (static_cast<std::uint64_t>(hi) << 21) ^ (lo >> 11);
  return (static_cast<double>(bits & ((1ull << 53) - 1)) + 1.0) * (1.0 / 9007199254740992.0);
}

// Uniform in [low, high): element `index` of the stream, fma(high - low, u, low)
// rounded once. Written as an fma on purpose: nvcc fuses `low + (high - low) * u`
// into one fma while a host compiler fuses it or not depending on its flags
// (-ffp-contract, -mfma), so the plain expression gives the CPU and the GPU values
// an ulp apart whenever (high - low) * u is not exact in float (most ranges other
// than a power-of-two width). An fma is one correctly rounded IEEE operation that
// no compiler splits or contracts further: the same bits on every device.
//
// The rounding can still reach `high` (u = 1 - 2^-24 on [2, 3.3) gives 3.3f), or
// pass it when high - low itself rounded up ([1, 1.1)), so such a value is
// replaced by the largest float below `high`: the interval stays half-open.
TL_HOST_DEVICE inline float uniform_from_unit(float u, float low, float high) {
  const float v = ::fmaf(high - low, u, low);
  return v < high ? v : ::nextafterf(high, low);
}

TL_HOST_DEVICE inline float uniform(std::uint64_t seed, std::uint64_t subsequence,
                                    std::uint64_t index, float low, float high) {
  return uniform_from_unit(to_unit_float(draw(seed, subsequence, index).x), low, high);
}

// Normal(mean, stddev) by Box-Muller on two 53-bit uniforms, computed in double
// and rounded once to float, so the CPU and CUDA results agree to the last bit
// except where the two libraries' double log/cos differ by an ulp exactly at a
// float rounding boundary (the tests allow one float ulp for that). The final
// scale and shift is an fma for the reason given at uniform().
TL_HOST_DEVICE inline float normal(std::uint64_t seed, std::uint64_t subsequence,
                                   std::uint64_t index, float mean, float stddev) {
  const Uint4 r = draw(seed, subsequence, index);
  const double u1 = to_open_unit_double(r.x, r.y);
  const double u2 = to_open_unit_double(r.z, r.w);
  const double z = ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586476925 * u2);
  return static_cast<float>(::fma(static_cast<double>(stddev), z, static_cast<double>(mean)));
}

}  // namespace towerlab::philox
