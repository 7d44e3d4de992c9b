// Differentiable losses (kernels/loss.h) and the total loss as TensorFlow 1.x's
// tf.losses.get_total_loss forms it: the sum of the data losses and the
// regularization losses.
#pragma once

#include <vector>

#include "../kernels/loss.h"
#include "tape.h"

namespace towerlab::ag {

// mean((pred - target)^2) (or the sum): tf.losses.mean_squared_error.
Var mse(const Var& pred, const Var& target, Reduction reduction = Reduction::Mean);

// Softmax cross-entropy of logits [N,K] against class ids [N] (float values, see
// kernels/loss.h). If `predictions` is given it receives argmax_k logits [N].
Var softmax_cross_entropy(const Var& logits, const Var& labels,
                          Reduction reduction = Reduction::Mean, Tensor* predictions = nullptr);

// coeff * sum(w^2) / 2: tf.nn.l2_loss(w) * coeff.
Var l2_loss(const Var& w, double coeff);

// The sum of the given losses (each with one element):
// tf.add_n(losses + regularization_losses).
Var add_n(const std::vector<Var>& terms);

}  // namespace towerlab::ag
