// The CUDA reductions (internal: not installed, not in towerlab.h). Public
// contracts and dispatch in kernels/reduce.h.
#pragma once

#include <cstdint>

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/reduce.h"

namespace towerlab::cuda {

void sum(const Tensor& out, const Tensor& x, float scale, const Stream& stream);  // scale * sum(x)
void sum_squares(const Tensor& out, const Tensor& x, const Stream& stream);
std::int64_t first_nonfinite(const Tensor& x, const Stream& stream);

}  // namespace towerlab::cuda
