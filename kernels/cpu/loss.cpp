// CPU losses: the specification for kernels/cuda/loss.cu. Sums are accumulated in
// double whatever the dtype; the softmax subtracts each row's maximum before exp.
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

namespace towerlab::cpu {

namespace {

// A label is valid when it is an integral value in [0, K) (NaN fails every test).
template <typename T>
bool is_class_id(T label, std::int64_t num_classes) {
  return label >= T(0) && label < static_cast<T>(num_classes) && std::floor(label) == label;
}

// Row statistics of the softmax of x [K]: the maximum and sum_k exp(x[k] - max).
template <typename T>
struct RowSoftmax {
  T max;
  double sum_exp;
};

template <typename T>
RowSoftmax<T> row_softmax(const T* x, std::int64_t num_classes) {
  T max = x[0];
  for (std::int64_t k = 1; k < num_classes; ++k) max = x[k] > max ? x[k] : max;
  double sum_exp = 0.0;
  for (std::int64_t k = 0; k < num_classes; ++k)
    sum_exp += std::exp(static_cast<double>(x[k] - max));
  return {max, sum_exp};
}

}  // namespace

void squared_error_sum(const Tensor& loss, const Tensor& pred, const Tensor& target, double scale) {
  with_dtype(pred.dtype(), [&]<typename T>() {
    const T* p = pred.data<T>();    // [n]
    const T* t = target.data<T>();  // [n]
    double total = 0.0;
    for (std::int64_t i = 0; i < pred.numel(); ++i) {
      const double diff = static_cast<double>(p[i]) - static_cast<double>(t[i]);
      total += diff * diff;
    }
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
      for (std::int64_t i = lo; i < hi; ++i) {
        const T g = factor * (p[i] - t[i]);
        if (gp != nullptr) gp[i] += g;
        if (gt != nullptr) gt[i] -= g;
      }
    });
  });
}

void softmax_cross_entropy_forward(const Tensor& loss, const Tensor& probs,
                                   const Tensor& predictions, const Tensor& logits,
                                   const Tensor& labels, double scale) {
  with_dtype(logits.dtype(), [&]<typename T>() {
    const std::int64_t rows = logits.size(0), num_classes = logits.size(1);
    const T* x = logits.data<T>();                                      // [N,K]
    const T* label = labels.data<T>();                                  // [N]
    T* prob = probs.defined() ? probs.data<T>() : nullptr;              // [N,K]
    T* pred = predictions.defined() ? predictions.data<T>() : nullptr;  // [N]
    double total = 0.0;
    for (std::int64_t n = 0; n < rows; ++n) {
      const T* row = x + n * num_classes;
      const RowSoftmax<T> s = row_softmax(row, num_classes);
      const auto target = static_cast<std::int64_t>(label[n]);
      // log(sum exp(x - max)) + max - x[target], with the two large terms subtracted
      // first so that logits around 1e4 lose no precision to the cancellation.
      total += std::log(s.sum_exp) - static_cast<double>(row[target] - s.max);
      if (prob != nullptr) {
        for (std::int64_t k = 0; k < num_classes; ++k) {
          prob[n * num_classes + k] =
              static_cast<T>(std::exp(static_cast<double>(row[k] - s.max)) / s.sum_exp);
        }
      }
      if (pred != nullptr) {
        std::int64_t best = 0;
        for (std::int64_t k = 1; k < num_classes; ++k) best = row[k] > row[best] ? k : best;
        pred[n] = static_cast<T>(best);
      }
    }
    loss.data<T>()[0] = static_cast<T>(total * scale);
  });
}

void softmax_cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                    const Tensor& logits, const Tensor& labels, double scale) {
  with_dtype(logits.dtype(), [&]<typename T>() {
    const std::int64_t rows = logits.size(0), num_classes = logits.size(1);
    const T* x = logits.data<T>();      // [N,K]
    const T* label = labels.data<T>();  // [N]
    T* grad = grad_logits.data<T>();    // [N,K]
    const double factor = scale * static_cast<double>(grad_loss.data<T>()[0]);
    parallel_rows(rows, num_classes, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t n = first; n < last; ++n) {
        const T* row = x + n * num_classes;
        const RowSoftmax<T> s = row_softmax(row, num_classes);
        const auto target = static_cast<std::int64_t>(label[n]);
        for (std::int64_t k = 0; k < num_classes; ++k) {
          const double p = std::exp(static_cast<double>(row[k] - s.max)) / s.sum_exp;
          grad[n * num_classes + k] += static_cast<T>(factor * (p - (k == target ? 1.0 : 0.0)));
        }
      }
    });
  });
}

void softmax_cross_entropy_backward_from_probs(const Tensor& grad_logits, const Tensor& grad_loss,
                                               const Tensor& probs, const Tensor& labels,
                                               double scale) {
  with_dtype(probs.dtype(), [&]<typename T>() {
    const std::int64_t rows = probs.size(0), num_classes = probs.size(1);
    const T* prob = probs.data<T>();    // [N,K]
    const T* label = labels.data<T>();  // [N]
    T* grad = grad_logits.data<T>();    // [N,K]
    const double factor = scale * static_cast<double>(grad_loss.data<T>()[0]);
    parallel_rows(rows, num_classes, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t n = first; n < last; ++n) {
        const auto target = static_cast<std::int64_t>(label[n]);
        for (std::int64_t k = 0; k < num_classes; ++k) {
          const double p = static_cast<double>(prob[n * num_classes + k]);
          grad[n * num_classes + k] += static_cast<T>(factor * (p - (k == target ? 1.0 : 0.0)));
        }
      }
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
    const T* in = w.data<T>();  // [n]
    double total = 0.0;
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      total += static_cast<double>(in[i]) * static_cast<double>(in[i]);
    }
    loss.data<T>()[0] = static_cast<T>(total * scale);
  });
}

void l2_loss_backward(const Tensor& grad_w, const Tensor& grad_loss, const Tensor& w,
                      double scale) {
  with_dtype(w.dtype(), [&]<typename T>() {
    const T* in = w.data<T>();   // [n]
    T* grad = grad_w.data<T>();  // [n]
    const T factor = static_cast<T>(scale * static_cast<double>(grad_loss.data<T>()[0]));
    parallel_rows(w.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) grad[i] += factor * in[i];
    });
  });
}

}  // namespace towerlab::cpu
