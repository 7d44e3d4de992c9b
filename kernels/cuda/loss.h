// CUDA backend entry points of the losses (contracts in kernels/loss.h), called
// by its dispatch once the arguments are checked; `scale` as in kernels/cpu/loss.h.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include <cstdint>

#include "engine/stream.h"
#include "engine/tensor.h"

namespace towerlab::cuda {

void squared_error_sum(const Tensor& loss, const Tensor& pred, const Tensor& target, float scale,
                       const Stream& stream);
void mse_backward(const Tensor& grad_pred, const Tensor& grad_target, const Tensor& grad_loss,
                  const Tensor& pred, const Tensor& target, float scale, const Stream& stream);
void softmax_cross_entropy_forward(const Tensor& loss, const Tensor& probs,
                                   const Tensor& predictions, const Tensor& logits,
                                   const Tensor& labels, float scale, float label_smoothing,
                                   const Stream& stream);
void softmax_cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                    const Tensor& logits, const Tensor& labels, float scale,
                                    float label_smoothing, const Stream& stream);
void softmax_cross_entropy_backward_from_probs(const Tensor& grad_logits, const Tensor& grad_loss,
                                               const Tensor& probs, const Tensor& labels,
                                               float scale, float label_smoothing,
                                               const Stream& stream);
std::int64_t first_invalid_label(const Tensor& labels, std::int64_t num_classes,
                                 const Stream& stream);  // waits for the stream
void square_sum(const Tensor& loss, const Tensor& w, float scale, const Stream& stream);
void l2_loss_backward(const Tensor& grad_w, const Tensor& grad_loss, const Tensor& w, float scale,
                      const Stream& stream);

}  // namespace towerlab::cuda
