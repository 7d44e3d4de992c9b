// Differentiable losses (kernels/loss.h) and the total loss as TensorFlow 1.x's
// tf.losses.get_total_loss forms it: the sum of the data losses and the
// regularization losses.
#pragma once

#include <vector>

#include "../kernels/loss.h"
#include "../kernels/pointwise_loss.h"
#include "tape.h"

namespace towerlab::ag {

// mean((pred - target)^2) (or the sum): tf.losses.mean_squared_error.
Var mse(const Var& pred, const Var& target, Reduction reduction = Reduction::Mean);

// Softmax cross-entropy of logits [N,K] against class ids [N] (float values, see
// kernels/loss.h). If `predictions` is given it receives argmax_k logits [N].
// label_smoothing eps in [0, 1] (PyTorch's): the target is (1 - eps) one-hot + eps / K.
Var softmax_cross_entropy(const Var& logits, const Var& labels,
                          Reduction reduction = Reduction::Mean, Tensor* predictions = nullptr,
                          double label_smoothing = 0.0);

// The pointwise losses of kernels/pointwise_loss.h, PyTorch's names and defaults.
// pred and target have one shape; target may need a gradient too.
// binary_cross_entropy_with_logits: logits against target probabilities in [0, 1]
// (torch.nn.functional.binary_cross_entropy_with_logits), for multi-label heads.
Var binary_cross_entropy_with_logits(const Var& logits, const Var& target,
                                     Reduction reduction = Reduction::Mean);
// mean(|pred - target|) (torch.nn.functional.l1_loss).
Var l1_loss(const Var& pred, const Var& target, Reduction reduction = Reduction::Mean);
// d^2/2 within delta of the target, delta (|d| - delta/2) beyond it
// (torch.nn.functional.huber_loss; delta 1 is smooth_l1_loss).
Var huber_loss(const Var& pred, const Var& target, double delta = 1.0,
               Reduction reduction = Reduction::Mean);

// coeff * sum(w^2) / 2: tf.nn.l2_loss(w) * coeff.
Var l2_loss(const Var& w, double coeff);

// The sum of the given losses (each with one element):
// tf.add_n(losses + regularization_losses).
Var add_n(const std::vector<Var>& terms);

}  // namespace towerlab::ag
