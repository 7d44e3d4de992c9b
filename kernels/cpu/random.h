// The CPU random fill, and the distribution code both backends receive (internal:
// not installed, not in towerlab.h). Public contracts and dispatch in
// kernels/random.h.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "kernels/random.h"

namespace towerlab {

// (a, b) are (low, high) for Uniform and (mean, stddev) for Normal.
enum class Distribution { Uniform, Normal };

namespace cpu {
void random(const Tensor& x, Distribution dist, std::uint64_t seed, std::uint64_t subsequence,
            float a, float b);
}  // namespace cpu

}  // namespace towerlab
