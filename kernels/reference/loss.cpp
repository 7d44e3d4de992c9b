// The losses' plain reference (contracts in kernels/reference/loss.h).
#include "kernels/reference/loss.h"

#include <cmath>

namespace towerlab::reference {

namespace {

// Row statistics of the softmax of x [K]: the maximum and sum_k exp(x[k] - max).
template <typename T>
struct RowSoftmax {
  T max;
  double sum_exp;
};

template <typename T>
RowSoftmax<T> row_softmax(const T* x, std::int64_t K) {
  T max = x[0];
  for (std::int64_t k = 1; k < K; ++k) max = x[k] > max ? x[k] : max;
  double sum_exp = 0.0;
  for (std::int64_t k = 0; k < K; ++k) sum_exp += std::exp(static_cast<double>(x[k] - max));
  return {max, sum_exp};
}

}  // namespace

template <typename T>
double squared_error_sum(const T* pred, const T* target, std::int64_t n) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double diff = static_cast<double>(pred[i]) - static_cast<double>(target[i]);
    total += diff * diff;
  }
  return total;
}

template <typename T>
void mse_backward(T* grad_pred, T* grad_target, const T* pred, const T* target, T factor,
                  std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = factor * (pred[i] - target[i]);
    if (grad_pred != nullptr) grad_pred[i] += g;
    if (grad_target != nullptr) grad_target[i] -= g;
  }
}

template <typename T>
double softmax_cross_entropy_forward(T* probs, T* predictions, const T* logits, const T* labels,
                                     std::int64_t N, std::int64_t K, double eps) {
  double total = 0.0;
  for (std::int64_t n = 0; n < N; ++n) {
    const T* row = logits + n * K;  // [K]
    const RowSoftmax<T> s = row_softmax(row, K);
    const auto target = static_cast<std::int64_t>(labels[n]);
    // log(sum exp(x - max)) + max - x[target], with the two large terms subtracted
    // first so that logits around 1e4 lose no precision to the cancellation.
    total += std::log(s.sum_exp) - (1.0 - eps) * static_cast<double>(row[target] - s.max);
    if (eps != 0.0) {  // the uniform part of the target (skipped at 0: an inf logit stays finite)
      double shifted = 0.0;
      for (std::int64_t k = 0; k < K; ++k) shifted += static_cast<double>(row[k] - s.max);
      total -= eps * shifted / static_cast<double>(K);
    }
    if (probs != nullptr) {
      for (std::int64_t k = 0; k < K; ++k) {
        probs[n * K + k] =
            static_cast<T>(std::exp(static_cast<double>(row[k] - s.max)) / s.sum_exp);
      }
    }
    if (predictions != nullptr) {
      std::int64_t best = 0;
      for (std::int64_t k = 1; k < K; ++k) best = row[k] > row[best] ? k : best;
      predictions[n] = static_cast<T>(best);
    }
  }
  return total;
}

template <typename T>
void softmax_cross_entropy_backward(T* grad_logits, const T* logits, const T* labels, double factor,
                                    std::int64_t N, std::int64_t K, double eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const T* row = logits + n * K;  // [K]
    const RowSoftmax<T> s = row_softmax(row, K);
    const auto target = static_cast<std::int64_t>(labels[n]);
    for (std::int64_t k = 0; k < K; ++k) {
      const double p = std::exp(static_cast<double>(row[k] - s.max)) / s.sum_exp;
      grad_logits[n * K + k] += static_cast<T>(factor * (p - smoothed_target(k, target, K, eps)));
    }
  }
}

template <typename T>
void softmax_cross_entropy_backward_from_probs(T* grad_logits, const T* probs, const T* labels,
                                               double factor, std::int64_t N, std::int64_t K,
                                               double eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const auto target = static_cast<std::int64_t>(labels[n]);
    for (std::int64_t k = 0; k < K; ++k) {
      const double p = static_cast<double>(probs[n * K + k]);
      grad_logits[n * K + k] += static_cast<T>(factor * (p - smoothed_target(k, target, K, eps)));
    }
  }
}

template <typename T>
double square_sum(const T* w, std::int64_t n) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i)
    total += static_cast<double>(w[i]) * static_cast<double>(w[i]);
  return total;
}

template <typename T>
void l2_loss_backward(T* grad_w, const T* w, T factor, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) grad_w[i] += factor * w[i];
}

#define TL_LOSS(T)                                                                                \
  template double squared_error_sum<T>(const T*, const T*, std::int64_t);                         \
  template void mse_backward<T>(T*, T*, const T*, const T*, T, std::int64_t);                     \
  template double softmax_cross_entropy_forward<T>(T*, T*, const T*, const T*, std::int64_t,      \
                                                   std::int64_t, double);                         \
  template void softmax_cross_entropy_backward<T>(T*, const T*, const T*, double, std::int64_t,   \
                                                  std::int64_t, double);                          \
  template void softmax_cross_entropy_backward_from_probs<T>(T*, const T*, const T*, double,      \
                                                             std::int64_t, std::int64_t, double); \
  template double square_sum<T>(const T*, std::int64_t);                                          \
  template void l2_loss_backward<T>(T*, const T*, T, std::int64_t);
TL_LOSS(float)
TL_LOSS(double)
#undef TL_LOSS

}  // namespace towerlab::reference
