// CPU losses: the plain reference (kernels/reference/loss.h), which sums in double
// whatever the dtype and subtracts each softmax row's maximum before exp.
//
// Threads (kernels/cpu/parallel.h): the gradients are elementwise (or per row of
// logits) and split over the thread pool. Each loss value is one running sum in
// index order on one thread: a split would change its rounding, which is part of
// the specification (and a FashionNet loss sums 128 rows of 10 logits).
#include <cmath>
#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/loss.h"

namespace towerlab::cpu {

namespace {

// A label is valid when it is an integral value in [0, K) (NaN fails every test).
template <typename T>
bool is_class_id(T label, std::int64_t num_classes) {
  return label >= T(0) && label < static_cast<T>(num_classes) && std::floor(label) == label;
}

}  // namespace

void squared_error_sum(const Tensor& loss, const Tensor& pred, const Tensor& target, double scale) {
  with_dtype(pred.dtype(), [&]<typename T>() {
    const double total =
        reference::squared_error_sum(pred.data<T>(), target.data<T>(), pred.numel());
    loss.data<T>()[0] = static_cast<T>(total * scale);
  });
}

void mse_backward(const Tensor& grad_pred, const Tensor& grad_target, const Tensor& grad_loss,
                  const Tensor& pred, const Tensor& target, double scale) {
  with_dtype(pred.dtype(), [&]<typename T>() {
    const T* p = pred.data<T>();    // [n]
    const T* t = target.data<T>();  // [n]
    const T factor = static_cast<T>(2.0 * scale * static_cast<double>(grad_loss.data<T>()[0]));
    T* gp = grad_pred.defined() ? grad_pred.data<T>() : nullptr;      // [n]
    T* gt = grad_target.defined() ? grad_target.data<T>() : nullptr;  // [n]
    parallel_rows(pred.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::mse_backward(gp != nullptr ? gp + lo : nullptr, gt != nullptr ? gt + lo : nullptr,
                              p + lo, t + lo, factor, hi - lo);
    });
  });
}

void softmax_cross_entropy_forward(const Tensor& loss, const Tensor& probs,
                                   const Tensor& predictions, const Tensor& logits,
                                   const Tensor& labels, double scale, double label_smoothing) {
  with_dtype(logits.dtype(), [&]<typename T>() {
    T* prob = probs.defined() ? probs.data<T>() : nullptr;              // [N,K]
    T* pred = predictions.defined() ? predictions.data<T>() : nullptr;  // [N]
    const double total =
        reference::softmax_cross_entropy_forward(prob, pred, logits.data<T>(), labels.data<T>(),
                                                 logits.size(0), logits.size(1), label_smoothing);
    loss.data<T>()[0] = static_cast<T>(total * scale);
  });
}

void softmax_cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                    const Tensor& logits, const Tensor& labels, double scale,
                                    double label_smoothing) {
  with_dtype(logits.dtype(), [&]<typename T>() {
    const std::int64_t rows = logits.size(0), K = logits.size(1);
    const T* x = logits.data<T>();      // [N,K]
    const T* label = labels.data<T>();  // [N]
    T* grad = grad_logits.data<T>();    // [N,K]
    const double factor = scale * static_cast<double>(grad_loss.data<T>()[0]);
    parallel_rows(rows, K, [&](std::int64_t first, std::int64_t last) {
      reference::softmax_cross_entropy_backward(grad + first * K, x + first * K, label + first,
                                                factor, last - first, K, label_smoothing);
    });
  });
}

void softmax_cross_entropy_backward_from_probs(const Tensor& grad_logits, const Tensor& grad_loss,
                                               const Tensor& probs, const Tensor& labels,
                                               double scale, double label_smoothing) {
  with_dtype(probs.dtype(), [&]<typename T>() {
    const std::int64_t rows = probs.size(0), K = probs.size(1);
    const T* prob = probs.data<T>();    // [N,K]
    const T* label = labels.data<T>();  // [N]
    T* grad = grad_logits.data<T>();    // [N,K]
    const double factor = scale * static_cast<double>(grad_loss.data<T>()[0]);
    parallel_rows(rows, K, [&](std::int64_t first, std::int64_t last) {
      reference::softmax_cross_entropy_backward_from_probs(grad + first * K, prob + first * K,
                                                           label + first, factor, last - first, K,
                                                           label_smoothing);
    });
  });
}

std::int64_t first_invalid_label(const Tensor& labels, std::int64_t num_classes) {
  std::int64_t bad = -1;
  with_dtype(labels.dtype(), [&]<typename T>() {
    const T* label = labels.data<T>();  // [N]
    for (std::int64_t n = 0; n < labels.numel() && bad < 0; ++n) {
      if (!is_class_id(label[n], num_classes)) bad = n;
    }
  });
  return bad;
}

void square_sum(const Tensor& loss, const Tensor& w, double scale) {
  with_dtype(w.dtype(), [&]<typename T>() {
    loss.data<T>()[0] = static_cast<T>(reference::square_sum(w.data<T>(), w.numel()) * scale);
  });
}

void l2_loss_backward(const Tensor& grad_w, const Tensor& grad_loss, const Tensor& w,
                      double scale) {
  with_dtype(w.dtype(), [&]<typename T>() {
    const T* in = w.data<T>();   // [n]
    T* grad = grad_w.data<T>();  // [n]
    const T factor = static_cast<T>(scale * static_cast<double>(grad_loss.data<T>()[0]));
    parallel_rows(w.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::l2_loss_backward(grad + lo, in + lo, factor, hi - lo);
    });
  });
}

}  // namespace towerlab::cpu
