// Random fills from the counter-based Philox generator (engine/philox.h).
//   random_uniform(x, seed, subsequence, low, high)    x[i] ~ U[low, high)
//   random_normal(x, seed, subsequence, mean, stddev)  x[i] ~ N(mean, stddev^2)
// Element i is a function of (seed, subsequence, i) alone, so the same call gives
// the same tensor on the CPU and on every GPU: uniform bit for bit, normal to one
// float ulp (see philox::normal). `subsequence` separates independent streams
// under one seed, e.g. one per variable.
#pragma once

#include <cstdint>

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

void random_uniform(const Tensor& x, std::uint64_t seed, std::uint64_t subsequence, float low,
                    float high, const Stream& stream);
void random_normal(const Tensor& x, std::uint64_t seed, std::uint64_t subsequence, float mean,
                   float stddev, const Stream& stream);

}  // namespace towerlab
