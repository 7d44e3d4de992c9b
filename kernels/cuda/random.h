// The CUDA random fill (internal: not installed, not in towerlab.h). Public
// contracts and dispatch in kernels/random.h.
#pragma once

#include <cstdint>

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/cpu/random.h"  // Distribution, which both backends receive

namespace towerlab::cuda {

void random(const Tensor& x, Distribution dist, std::uint64_t seed, std::uint64_t subsequence,
            float a, float b, const Stream& stream);

}  // namespace towerlab::cuda
