// CUDA backend entry point of slice copy (contract in kernels/slice_copy.h), called
// by its dispatch once the arguments are checked.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/slice_copy.h"

namespace towerlab::cuda {

// The runs of `plan` from src into dst, assigned or added; float32, bfloat16 or float16.
void slice_copy(const Tensor& dst, const Tensor& src, const SliceCopyPlan& plan, GradWrite write,
                const Stream& stream);

}  // namespace towerlab::cuda
