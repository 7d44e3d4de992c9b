// The plain reference of the cast (contracts in kernels/cast.h), on n values: each
// value converted by engine/half.h's cast_value, which states the rounding rule.
// The CPU backend runs it on each thread's range (kernels/cpu/cast.cpp); the CUDA
// kernel is tested against it. D and S are float, double, bfloat16 or float16.
#pragma once

#include <cstdint>

#include "engine/half.h"

namespace towerlab::reference {

// dst[i] = cast_value<D>(src[i]); dst [n], src [n], not overlapping.
template <typename D, typename S>
void cast(D* dst, const S* src, std::int64_t n);

}  // namespace towerlab::reference
