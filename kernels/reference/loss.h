// The plain reference of the losses (contracts in kernels/loss.h): the CPU backend
// runs it (kernels/cpu/loss.cpp: each sum on one thread, the gradients on each
// thread's range of values or rows), and the CUDA kernels are tested against it.
// Sums accumulate in double whatever T (float or double); the forwards return the
// unscaled sum and the caller multiplies by r (1/n or 1/N for Mean, 1 for Sum).
//
// Dimension letters: N rows, K classes; n the element count. labels [N] hold class
// ids in [0, K) (the caller checks them first).
#pragma once

#include <cstdint>

namespace towerlab::reference {

// sum_i (pred[i] - target[i])^2; pred, target [n].
template <typename T>
double squared_error_sum(const T* pred, const T* target, std::int64_t n);

// With g = factor * (pred[i] - target[i]), factor = 2 * r * grad_loss:
//   grad_pred[i] += g,  grad_target[i] -= g   (ACCUMULATED; either may be nullptr)
// pred, target, grad_pred, grad_target [n].
template <typename T>
void mse_backward(T* grad_pred, T* grad_target, const T* pred, const T* target, T factor,
                  std::int64_t n);

// With label smoothing eps (0: one-hot targets), the target of class k in row n is
//   t[n,k] = (1 - eps) * (k == labels[n]) + eps / K      (smoothed_target)
// sum_n sum_k t[n,k] * (logsumexp(logits[n,:]) - logits[n,k]), that is
//   sum_n (lse_n - (1 - eps) * logits[n,labels[n]] - eps * mean_k logits[n,k]),
// each logit taken less the row's maximum first; and, where not nullptr, ASSIGNS
// probs [N,K] = softmax of each row and predictions [N] = the first argmax of each
// row. logits [N,K].
template <typename T>
double softmax_cross_entropy_forward(T* probs, T* predictions, const T* logits, const T* labels,
                                     std::int64_t N, std::int64_t K, double eps);

// t[n,k] above for label `target` (exactly 1 and 0 when eps is 0).
inline double smoothed_target(std::int64_t k, std::int64_t target, std::int64_t K, double eps) {
  return (k == target ? 1.0 - eps : 0.0) + eps / static_cast<double>(K);
}

// grad_logits[n,k] += factor * (softmax(logits[n,:])[k] - t[n,k]), the softmax
// recomputed in double, factor = r * grad_loss (ACCUMULATED). logits, grad_logits [N,K].
template <typename T>
void softmax_cross_entropy_backward(T* grad_logits, const T* logits, const T* labels, double factor,
                                    std::int64_t N, std::int64_t K, double eps);

// The same gradient from the forward's probs [N,K] (ACCUMULATED).
template <typename T>
void softmax_cross_entropy_backward_from_probs(T* grad_logits, const T* probs, const T* labels,
                                               double factor, std::int64_t N, std::int64_t K,
                                               double eps);

// sum_i w[i]^2; w [n].
template <typename T>
double square_sum(const T* w, std::int64_t n);

// grad_w[i] += factor * w[i], factor = coeff * grad_loss for the loss coeff/2 * sum w^2
// (ACCUMULATED); w, grad_w [n].
template <typename T>
void l2_loss_backward(T* grad_w, const T* w, T factor, std::int64_t n);

}  // namespace towerlab::reference
