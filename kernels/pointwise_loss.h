// Pointwise losses, forward and backward: binary cross-entropy with logits, L1
// (mean absolute error) and Huber. Each is a sum over elements of one term that
// depends on pred[i] and target[i] alone, so the three share one contract, one
// two-stage sum and one gradient kernel; the kind picks the term.
//
// Dimension letters: n the element count of pred (any shape; target the same shape).
// Conventions as kernels/loss.h: the forward ASSIGNS a 1-element `loss` on the
// inputs' device; the backward ACCUMULATES into the gradients it is given (an
// undefined Tensor is skipped) and reads dL/dloss from the 1-element `grad_loss` on
// the device; r = 1/n (Reduction::Mean; 1 when n == 0) or 1 (Reduction::Sum), and
// the loss of no elements is 0.
//
// pointwise_loss_forward(loss, pred, target, op, reduction)
//   loss[0] = r * sum_i term(pred[i], target[i])
// pointwise_loss_backward(grad_pred, grad_target, grad_loss, pred, target, op, reduction)
//   grad_pred[i]   += grad_loss[0] * r * d term / d pred
//   grad_target[i] += grad_loss[0] * r * d term / d target
//
// The terms, with x = pred[i], t = target[i], d = x - t:
//   BinaryCrossEntropyWithLogits (torch.nn.BCEWithLogitsLoss, the logits' sigmoid
//   against target probabilities; tf.nn.sigmoid_cross_entropy_with_logits):
//     term = max(x, 0) - x t + log1p(exp(-|x|))
//            = -(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))), written so that
//            no exp overflows and no log sees 0: finite for logits of any size.
//     d/dx = sigmoid(x) - t        d/dt = -x
//     Targets are not checked to lie in [0, 1] (PyTorch does not either): soft
//     labels are the point of the target being a tensor.
//   L1 (torch.nn.L1Loss):
//     term = |d|                   d/dx = sign(d), 0 where d == 0 (as PyTorch)
//                                  d/dt = -sign(d)
//   Huber with threshold delta > 0 (torch.nn.HuberLoss; delta = 1 is SmoothL1):
//     term = d^2 / 2                   where |d| <= delta
//            delta (|d| - delta / 2)   elsewhere (the two agree at |d| == delta)
//     d/dx = clamp(d, -delta, delta)   d/dt = -d/dx
//
// NaN: a NaN in pred or target makes the loss NaN and its own gradients NaN (the
// comparisons in sign and clamp are written so that NaN passes through, where
// fmin/fmax would drop it); it does not touch other elements' gradients.
//
// Dtypes: float32 on every device, float64 on the CPU (the gradient checks);
// BFloat16 and Float16 get the typed error of kernels/checks.h.
// Precision: the CPU backend is the reference (kernels/reference/pointwise_loss.h):
// terms in double, the sum in index order on one thread. CUDA computes each term in
// float32 and sums with the fixed two-stage tree of kernels/cuda/sum_terms.cuh (the
// same bits every run); its loss agrees with the reference to 1e-5 relative (a sum
// of float terms) and each gradient to 1e-6 + 1e-5 |reference|.
// Aliasing: no output may alias an input.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "loss.h"

namespace towerlab {

enum class PointwiseLossKind { BinaryCrossEntropyWithLogits, L1, Huber };

// Which loss, and Huber's threshold (ignored by the others; must be finite and > 0
// for Huber).
struct PointwiseLossOp {
  PointwiseLossKind kind = PointwiseLossKind::L1;
  double delta = 1.0;
};

// "binary_cross_entropy_with_logits", "l1_loss" or "huber_loss" (PyTorch's names).
const char* pointwise_loss_name(PointwiseLossKind kind);

void pointwise_loss_forward(const Tensor& loss, const Tensor& pred, const Tensor& target,
                            PointwiseLossOp op, Reduction reduction, const Stream& stream);
void pointwise_loss_backward(const Tensor& grad_pred, const Tensor& grad_target,
                             const Tensor& grad_loss, const Tensor& pred, const Tensor& target,
                             PointwiseLossOp op, Reduction reduction, const Stream& stream);

}  // namespace towerlab
