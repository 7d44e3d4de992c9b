// CPU backend entry point of the cast (contracts in kernels/cast.h), called by its
// dispatch once the arguments are checked. Internal: not installed, not included
// by towerlab.h.
#pragma once

#include "engine/tensor.h"

namespace towerlab::cpu {

void cast(const Tensor& dst, const Tensor& src);
// float32 dst = float32(round(float32 src to `through`)), through 16-bit.
void round_through(const Tensor& dst, const Tensor& src, DType through);

}  // namespace towerlab::cpu
