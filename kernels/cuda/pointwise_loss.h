// CUDA backend entry points of the pointwise losses (contract in
// kernels/pointwise_loss.h), called by its dispatch once the arguments are checked;
// `scale` is r (1/n or 1). Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/pointwise_loss.h"

namespace towerlab::cuda {

void pointwise_loss_forward(const Tensor& loss, const Tensor& pred, const Tensor& target,
                            const PointwiseLossOp& op, float scale, const Stream& stream);
void pointwise_loss_backward(const Tensor& grad_pred, const Tensor& grad_target,
                             const Tensor& grad_loss, const Tensor& pred, const Tensor& target,
                             const PointwiseLossOp& op, float scale, const Stream& stream);

}  // namespace towerlab::cuda
