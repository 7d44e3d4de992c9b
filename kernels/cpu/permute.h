// CPU backend entry point of permute (contract in kernels/permute.h), called by its
// dispatch once the arguments are checked and the layout merged.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/permute_plan.h"

namespace towerlab::cpu {

// y = (or +=) x moved as `plan` says; any of the four dtypes.
void permute(const Tensor& y, const Tensor& x, const PermutePlan& plan, GradWrite write);

}  // namespace towerlab::cpu
