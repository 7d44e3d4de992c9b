// CPU backend entry points of ReLU (contracts in kernels/relu.h), called by its
// dispatch once the arguments are checked. Internal: not installed, not included
// by towerlab.h.
#pragma once

#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/reference/relu.h"

namespace towerlab::cpu {

// ReLU's backward mask, for the fused backwards too: kernels/reference/relu.h.
using reference::relu_mask;

void relu_forward(const Tensor& y, const Tensor& x);
void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, GradWrite write);

}  // namespace towerlab::cpu
