// CPU backend entry points of softmax and log-softmax (contracts in
// kernels/softmax.h), called by their dispatch once the arguments are checked.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/softmax.h"

namespace towerlab::cpu {

void softmax_forward(const Tensor& y, const Tensor& x, SoftmaxKind kind, SoftmaxMask mask);
void softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, SoftmaxKind kind,
                      SoftmaxMask mask, GradWrite write);

}  // namespace towerlab::cpu
