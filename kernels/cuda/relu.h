// CUDA backend entry points of ReLU (contracts in kernels/relu.h), called by its
// dispatch once the arguments are checked. Internal: not installed, not included
// by towerlab.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"

namespace towerlab::cuda {

void relu_forward(const Tensor& y, const Tensor& x, const Stream& stream);
void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
                   const Stream& stream);

}  // namespace towerlab::cuda
