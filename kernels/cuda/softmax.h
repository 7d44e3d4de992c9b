// CUDA backend entry points of softmax and log-softmax (contracts in
// kernels/softmax.h), called by their dispatch once the arguments are checked.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/softmax.h"

namespace towerlab::cuda {

void softmax_forward(const Tensor& y, const Tensor& x, SoftmaxKind kind, SoftmaxMask mask,
                     const Stream& stream);
void softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, SoftmaxKind kind,
                      SoftmaxMask mask, const Stream& stream, GradWrite write);

}  // namespace towerlab::cuda
