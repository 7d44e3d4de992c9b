// CUDA backend entry point of permute (contract in kernels/permute.h), called by
// its dispatch once the arguments are checked and the layout merged.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/permute_plan.h"

namespace towerlab::cuda {

// y = (or +=) x moved as `plan` says; float32, bfloat16 or float16.
void permute(const Tensor& y, const Tensor& x, const PermutePlan& plan, GradWrite write,
             const Stream& stream);

}  // namespace towerlab::cuda
