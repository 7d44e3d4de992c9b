// Softmax and log-softmax's plain reference (contracts in kernels/reference/softmax.h).
#include "kernels/reference/softmax.h"

#include <cmath>
#include <limits>

namespace towerlab::reference {

namespace {

template <typename T>
void write(T& out, double value, GradWrite mode) {
  out = mode == GradWrite::Assign ? static_cast<T>(value) : static_cast<T>(out + value);
}

}  // namespace

template <typename T>
void softmax_forward(T* y, const T* x, std::int64_t first_row, std::int64_t last_row,
                     std::int64_t cols, SoftmaxKind kind, SoftmaxMask mask) {
  for (std::int64_t r = first_row; r < last_row; ++r) {
    const T* in = x + r * cols;  // [D]
    T* out = y + r * cols;       // [D]
    const std::int64_t kept = softmax_kept(r, cols, mask);
    // The maximum skips a NaN (x > m is false); the NaN then reaches every output
    // through the sum, whatever its position. A row of -inf keeps m = -inf, and
    // exp(-inf - -inf) is the NaN that PyTorch gives too.
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < kept; ++j) {
      if (double(in[j]) > m) m = in[j];
    }
    double sum = 0;
    for (std::int64_t j = 0; j < kept; ++j) sum += std::exp(double(in[j]) - m);
    const double log_sum = std::log(sum);
    for (std::int64_t j = 0; j < kept; ++j) {
      const double shifted = double(in[j]) - m;
      out[j] = static_cast<T>(kind == SoftmaxKind::LogSoftmax ? shifted - log_sum
                                                              : std::exp(shifted) / sum);
    }
    const double masked =
        kind == SoftmaxKind::LogSoftmax ? -std::numeric_limits<double>::infinity() : 0.0;
    for (std::int64_t j = kept; j < cols; ++j) out[j] = static_cast<T>(masked);
  }
}

template <typename T>
void softmax_backward(T* grad_x, const T* grad_y, const T* y, std::int64_t first_row,
                      std::int64_t last_row, std::int64_t cols, SoftmaxKind kind, SoftmaxMask mask,
                      GradWrite write_mode) {
  for (std::int64_t r = first_row; r < last_row; ++r) {
    const T* gy = grad_y + r * cols;  // [D]
    const T* out = y + r * cols;      // [D]
    T* gx = grad_x + r * cols;        // [D]
    const std::int64_t kept = softmax_kept(r, cols, mask);
    // softmax: sum grad_y * y; log-softmax: sum grad_y.
    double sum = 0;
    for (std::int64_t j = 0; j < kept; ++j) {
      sum += kind == SoftmaxKind::LogSoftmax ? double(gy[j]) : double(gy[j]) * double(out[j]);
    }
    for (std::int64_t j = 0; j < kept; ++j) {
      const double g = kind == SoftmaxKind::LogSoftmax
                           ? double(gy[j]) - std::exp(double(out[j])) * sum
                           : double(out[j]) * (double(gy[j]) - sum);
      write(gx[j], g, write_mode);
    }
    for (std::int64_t j = kept; j < cols; ++j) write(gx[j], 0.0, write_mode);
  }
}

template void softmax_forward<float>(float*, const float*, std::int64_t, std::int64_t, std::int64_t,
                                     SoftmaxKind, SoftmaxMask);
template void softmax_forward<double>(double*, const double*, std::int64_t, std::int64_t,
                                      std::int64_t, SoftmaxKind, SoftmaxMask);
template void softmax_backward<float>(float*, const float*, const float*, std::int64_t,
                                      std::int64_t, std::int64_t, SoftmaxKind, SoftmaxMask,
                                      GradWrite);
template void softmax_backward<double>(double*, const double*, const double*, std::int64_t,
                                       std::int64_t, std::int64_t, SoftmaxKind, SoftmaxMask,
                                       GradWrite);

}  // namespace towerlab::reference
