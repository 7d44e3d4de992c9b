// CPU backend entry points of the losses (contracts in kernels/loss.h), called by
// its dispatch once the arguments are checked. `scale` is r (1/n or 1) and, for
// L2, coeff / 2 in the forward and coeff in the backward. Internal: not
// installed, not included by towerlab.h.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace towerlab::cpu {

void squared_error_sum(const Tensor& loss, const Tensor& pred, const Tensor& target, double scale);
void mse_backward(const Tensor& grad_pred, const Tensor& grad_target, const Tensor& grad_loss,
                  const Tensor& pred, const Tensor& target, double scale);
void softmax_cross_entropy_forward(const Tensor& loss, const Tensor& probs,
                                   const Tensor& predictions, const Tensor& logits,
                                   const Tensor& labels, double scale, double label_smoothing);
void softmax_cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                    const Tensor& logits, const Tensor& labels, double scale,
                                    double label_smoothing);
void softmax_cross_entropy_backward_from_probs(const Tensor& grad_logits, const Tensor& grad_loss,
                                               const Tensor& probs, const Tensor& labels,
                                               double scale, double label_smoothing);
// The index of the first label that is not a class id in [0, num_classes), or -1.
std::int64_t first_invalid_label(const Tensor& labels, std::int64_t num_classes);
void square_sum(const Tensor& loss, const Tensor& w, double scale);
void l2_loss_backward(const Tensor& grad_w, const Tensor& grad_loss, const Tensor& w, double scale);

}  // namespace towerlab::cpu
