// The CPU reductions (internal: not installed, not in towerlab.h). Public
// contracts and dispatch in kernels/reduce.h.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "kernels/reduce.h"

namespace towerlab::cpu {

void sum(const Tensor& out, const Tensor& x, double scale);  // out[0] = scale * sum(x)
void sum_squares(const Tensor& out, const Tensor& x);
std::int64_t first_nonfinite(const Tensor& x);

}  // namespace towerlab::cpu
