// Losses, forward and backward: mean squared error, softmax cross-entropy with
// integer labels, and L2 regularization (tf.nn.l2_loss times a coefficient).
//
// Dimension letters: N rows of a batch, K classes; n the element count of a tensor.
//
// Every forward ASSIGNS a 1-element tensor `loss` on the inputs' device: the result
// stays there (no host round trip), so it can feed the next kernel or be read once
// at the end of a step. Every backward ACCUMULATES (+=) into the gradient tensors it
// is given; an undefined gradient Tensor means "not needed" and is skipped.
//
// The upstream gradient. Each backward takes `grad_loss`, a 1-element tensor on the
// device holding dL/dloss (1 for the loss a training step minimizes; the autograd
// layer passes whatever flows back into the loss). It is a tensor, not a host
// float, so that a tower's backward never waits for the device; the kernels read
// it on the device.
//
// Reduction. Reduction::Mean divides by the number of terms (n for MSE, N for
// cross-entropy), Reduction::Sum does not. The mean of no terms is 0, not NaN (as
// mean() in kernels/reduce.h): a tower with an empty slice of the batch then
// reports a loss of 0, which its weight of 0 in the tower average cancels, whereas
// a NaN would poison the sum (0 * NaN = NaN). Its backward adds nothing.
//
// mse_forward(loss, pred, target, reduction)
//   pred, target: any shape, the same shape, n elements
//   loss[0] = r * sum_i (pred[i] - target[i])^2,   r = 1/n (Mean) or 1 (Sum)
//   tf.losses.mean_squared_error is the Mean reduction.
// mse_backward(grad_pred, grad_target, grad_loss, pred, target, reduction)
//   grad_pred[i]   += grad_loss[0] * r * 2 * (pred[i] - target[i])
//   grad_target[i] -= grad_loss[0] * r * 2 * (pred[i] - target[i])
//
// softmax_cross_entropy_forward(loss, probs, predictions, logits, labels, reduction, eps)
//   logits      [N,K]  K >= 1
//   labels      [N]    the class id of each row as an integral value in [0, K), in
//                      the logits' dtype (the Tensor class holds floating point
//                      only; float32 represents every integer up to 2^24 exactly,
//                      far beyond any class count). Labels are uploaded once with
//                      the batch and read on the device, so no host sync is needed.
//   loss[0] = r * sum_n (logsumexp(logits[n,:]) - logits[n,labels[n]]),
//             r = 1/N (Mean) or 1 (Sum); logsumexp subtracts the row's maximum
//             first, so logits of any magnitude (1e4 and beyond) stay finite.
//   eps         label smoothing in [0, 1] (PyTorch's label_smoothing; 0, the default,
//               is the one-hot target): row n's target is the distribution
//                 t[n,k] = (1 - eps) * (k == labels[n]) + eps / K
//               and its loss sum_k t[n,k] * (logsumexp(logits[n,:]) - logits[n,k])
//               = logsumexp - (1 - eps) * logits[n,labels[n]] - eps * mean_k logits[n,k].
//               With eps = 0 every result has the bits it had before eps existed.
//   probs       [N,K]  optional output: softmax(logits[n,:]) (assigned)
//   predictions [N]    optional output: argmax_k logits[n,k], the first on ties
//                      (assigned), for the accuracy without reading [N,K] back
// softmax_cross_entropy_backward(grad_logits, grad_loss, logits, labels, reduction, eps)
//   grad_logits[n,k] += grad_loss[0] * r * (softmax(logits[n,:])[k] - t[n,k])
//   The softmax is recomputed from the logits (no state is kept from the forward).
// softmax_cross_entropy_backward_from_probs(grad_logits, grad_loss, probs, labels, reduction, eps)
//   The same gradient from the forward's probs: with them the loss and its gradient
//   cost one pass over the logits (the exps are not taken twice), which is what the
//   autograd op does on the CPU. On a GPU, where the exps cost next to nothing and
//   memory bandwidth is what counts, it recomputes instead (autograd/losses.cpp).
//   CUDA's forward writes each probability with the float expression its
//   recomputing backward uses, so the two agree to float rounding.
//   On the CPU they agree bit for bit in float64; in float32 each value differs by
//   at most |grad_loss * r| * 2^-24 plus one rounding of the result (probs holds
//   each probability rounded to float, where the recomputing backward keeps it in
//   double).
//
// Labels out of range (negative, >= K, not integral, NaN):
//   CPU:  the forward and the backward throw InvalidArgument naming the row, the
//         value and the valid range.
//   CUDA: checking them would need a host sync, so the kernels never read out of
//         bounds and instead poison the result: the row's loss is NaN (so loss[0]
//         is NaN when it is read) and its gradient row gets NaN added (probs and
//         predictions do not depend on the labels and stay as they are). validate_labels() gives
//         the exact message on any device at the cost of one sync; a data loader calls it once when
//         labels are loaded, and a training loop may call it when it sees a NaN loss.
//
// l2_loss_forward(loss, w, coeff)
//   w any shape;  loss[0] = coeff * sum_i w[i]^2 / 2   (tf.nn.l2_loss(w) * coeff)
// l2_loss_backward(grad_w, grad_loss, w, coeff)
//   grad_w[i] += grad_loss[0] * coeff * w[i]
//
// Aliasing: outputs must not alias inputs (a gradient must not be its own input).
// CPU kernels accumulate sums in double; CUDA kernels are float32 only and reduce
// with a fixed two-stage tree (per-block partial sums, then one block), so the same
// inputs give the same bits run after run.
#pragma once

#include <cstdint>

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

enum class Reduction { Mean, Sum };

// r above: 1/count for Mean (1 when there is nothing to average), 1 for Sum.
inline double reduction_scale(Reduction reduction, std::int64_t count) {
  return reduction == Reduction::Mean && count > 0 ? 1.0 / static_cast<double>(count) : 1.0;
}

void mse_forward(const Tensor& loss, const Tensor& pred, const Tensor& target, Reduction reduction,
                 const Stream& stream);
void mse_backward(const Tensor& grad_pred, const Tensor& grad_target, const Tensor& grad_loss,
                  const Tensor& pred, const Tensor& target, Reduction reduction,
                  const Stream& stream);

void softmax_cross_entropy_forward(const Tensor& loss, const Tensor& probs,
                                   const Tensor& predictions, const Tensor& logits,
                                   const Tensor& labels, Reduction reduction, const Stream& stream,
                                   double label_smoothing = 0.0);
void softmax_cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                    const Tensor& logits, const Tensor& labels, Reduction reduction,
                                    const Stream& stream, double label_smoothing = 0.0);
void softmax_cross_entropy_backward_from_probs(const Tensor& grad_logits, const Tensor& grad_loss,
                                               const Tensor& probs, const Tensor& labels,
                                               Reduction reduction, const Stream& stream,
                                               double label_smoothing = 0.0);

// Throws InvalidArgument naming the first label that is not an integral value in
// [0, num_classes). Waits for `stream` (on CUDA: one small copy back to the host).
void validate_labels(const Tensor& labels, std::int64_t num_classes, const Stream& stream);

void l2_loss_forward(const Tensor& loss, const Tensor& w, double coeff, const Stream& stream);
void l2_loss_backward(const Tensor& grad_w, const Tensor& grad_loss, const Tensor& w, double coeff,
                      const Stream& stream);

}  // namespace towerlab
