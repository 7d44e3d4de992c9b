// CUDA backend entry point of the cast (contracts in kernels/cast.h), called by
// its dispatch once the arguments are checked. Internal: not installed, not
// included by towerlab.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"

namespace towerlab::cuda {

void cast(const Tensor& dst, const Tensor& src, const Stream& stream);

}  // namespace towerlab::cuda
