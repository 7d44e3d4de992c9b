// CPU backend entry point of slice copy (contract in kernels/slice_copy.h), called
// by its dispatch once the arguments are checked.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/slice_copy.h"

namespace towerlab::cpu {

// The runs of `plan` from src into dst, assigned or added; any of the four dtypes.
void slice_copy(const Tensor& dst, const Tensor& src, const SliceCopyPlan& plan, GradWrite write);

}  // namespace towerlab::cpu
