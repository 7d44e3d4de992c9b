// The plain reference of the pointwise losses (contract in kernels/pointwise_loss.h):
// the CPU backend runs it (the sum on one thread in index order, the gradients on
// each thread's range), and the CUDA kernels are tested against it. Each term and
// each derivative is computed in double whatever T (float or double); the forward
// returns the unscaled sum, and the caller multiplies by r.
//
// Dimension letters: n the element count; pred, target and the gradients are [n].
#pragma once

#include <cstdint>

#include "kernels/pointwise_loss.h"

namespace towerlab::reference {

// One term and its derivative with respect to pred (d/d target is its negative for
// L1 and Huber, -x for binary cross-entropy: pointwise_loss_target_derivative).
double pointwise_loss_term(const PointwiseLossOp& op, double x, double t);
double pointwise_loss_pred_derivative(const PointwiseLossOp& op, double x, double t);
double pointwise_loss_target_derivative(const PointwiseLossOp& op, double x, double t);

// sum_i term(pred[i], target[i]).
template <typename T>
double pointwise_loss_sum(const PointwiseLossOp& op, const T* pred, const T* target,
                          std::int64_t n);

// grad_pred[i] += factor * d term / d pred, grad_target[i] += factor * d term / d target
// (ACCUMULATED; either may be nullptr), factor = r * grad_loss.
template <typename T>
void pointwise_loss_backward(const PointwiseLossOp& op, T* grad_pred, T* grad_target, const T* pred,
                             const T* target, double factor, std::int64_t n);

}  // namespace towerlab::reference
