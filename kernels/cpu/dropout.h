// CPU backend entry points of dropout (contract in kernels/dropout.h), called by
// its dispatch once the arguments are checked; `first_element` is the global index
// of element 0 (key.first_row * D). Internal: not installed, not included by
// towerlab.h.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "kernels/grad_write.h"

namespace towerlab::cpu {

void dropout_forward(const Tensor& y, const Tensor& x, double p, std::uint64_t seed,
                     std::uint64_t subsequence, std::uint64_t first_element);
void dropout_backward(const Tensor& grad_x, const Tensor& grad_y, double p, std::uint64_t seed,
                      std::uint64_t subsequence, std::uint64_t first_element, GradWrite write);

}  // namespace towerlab::cpu
