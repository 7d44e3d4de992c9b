// CUDA backend entry points of dropout (contract in kernels/dropout.h), float32,
// called by its dispatch once the arguments are checked; `first_element` as in
// kernels/cpu/dropout.h. Internal: not installed, not included by towerlab.h.
#pragma once

#include <cstdint>

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/grad_write.h"

namespace towerlab::cuda {

void dropout_forward(const Tensor& y, const Tensor& x, double p, std::uint64_t seed,
                     std::uint64_t subsequence, std::uint64_t first_element, const Stream& stream);
void dropout_backward(const Tensor& grad_x, const Tensor& grad_y, double p, std::uint64_t seed,
                      std::uint64_t subsequence, std::uint64_t first_element, const Stream& stream,
                      GradWrite write);

}  // namespace towerlab::cuda
