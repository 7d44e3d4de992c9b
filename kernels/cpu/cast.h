// CPU backend entry point of the cast (contracts in kernels/cast.h), called by its
// dispatch once the arguments are checked. Internal: not installed, not included
// by towerlab.h.
#pragma once

#include "engine/tensor.h"

namespace towerlab::cpu {

void cast(const Tensor& dst, const Tensor& src);

}  // namespace towerlab::cpu
