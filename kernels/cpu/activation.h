// CPU backend entry points of the activations (contracts in kernels/activation.h),
// called by their dispatch once the arguments are checked. Internal: not
// installed, not included by towerlab.h.
#pragma once

#include "engine/tensor.h"
#include "kernels/activation.h"
#include "kernels/grad_write.h"

namespace towerlab::cpu {

void activation_forward(const Tensor& y, const Tensor& x, const ActivationOp& act);
void activation_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const ActivationOp& act, GradWrite write);

}  // namespace towerlab::cpu
