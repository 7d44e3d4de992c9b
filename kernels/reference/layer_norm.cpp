// Layer normalization's plain reference (contracts in kernels/reference/layer_norm.h).
#include "kernels/reference/layer_norm.h"

#include <cmath>
#include <vector>

namespace towerlab::reference {

template <typename T>
void layer_norm_forward(const LayerNormForwardData<T>& d, std::int64_t first_row,
                        std::int64_t last_row) {
  const std::int64_t D = d.cols;
  for (std::int64_t r = first_row; r < last_row; ++r) {
    const T* x = d.x + r * D;  // [D]
    T* y = d.y + r * D;        // [D]
    double sum = 0;
    for (std::int64_t j = 0; j < D; ++j) sum += x[j];
    const double mean = sum / double(D);
    double m2 = 0;  // squared deviations from the mean: a second pass, no cancellation
    for (std::int64_t j = 0; j < D; ++j) m2 += (x[j] - mean) * (x[j] - mean);
    const double rstd = 1.0 / std::sqrt(m2 / double(D) + d.eps);
    d.mean[r] = static_cast<T>(mean);
    d.rstd[r] = static_cast<T>(rstd);
    for (std::int64_t j = 0; j < D; ++j) {
      double v = (x[j] - mean) * rstd;
      if (d.weight != nullptr) v *= d.weight[j];
      if (d.bias != nullptr) v += d.bias[j];
      y[j] = static_cast<T>(v);
    }
  }
}

template <typename T>
void layer_norm_backward_x(const LayerNormBackwardData<T>& d, std::int64_t first_row,
                           std::int64_t last_row) {
  if (d.grad_x == nullptr) return;
  const std::int64_t D = d.cols;
  for (std::int64_t r = first_row; r < last_row; ++r) {
    const T* x = d.x + r * D;        // [D]
    const T* gy = d.grad_y + r * D;  // [D]
    T* gx = d.grad_x + r * D;        // [D]
    const double mean = d.mean[r], rstd = d.rstd[r];
    auto g = [&](std::int64_t j) {  // grad_y * weight
      return d.weight != nullptr ? double(gy[j]) * double(d.weight[j]) : double(gy[j]);
    };
    double sum_g = 0, sum_g_xhat = 0;
    for (std::int64_t j = 0; j < D; ++j) {
      sum_g += g(j);
      sum_g_xhat += g(j) * (x[j] - mean) * rstd;
    }
    for (std::int64_t j = 0; j < D; ++j) {
      const double x_hat = (x[j] - mean) * rstd;
      const double v = rstd * (g(j) - sum_g / double(D) - x_hat * sum_g_xhat / double(D));
      gx[j] = d.grad_x_write == GradWrite::Assign ? static_cast<T>(v) : static_cast<T>(gx[j] + v);
    }
  }
}

template <typename T>
void layer_norm_backward_params(const LayerNormBackwardData<T>& d, std::int64_t first_col,
                                std::int64_t last_col) {
  if (d.grad_weight == nullptr && d.grad_bias == nullptr) return;
  const std::int64_t D = d.cols, n = last_col - first_col;
  std::vector<double> sum_w(std::size_t(n), 0.0), sum_b(std::size_t(n), 0.0);  // [n]
  for (std::int64_t r = 0; r < d.rows; ++r) {  // row order; columns inner, row-major reads
    const T* x = d.x + r * D;                  // [D]
    const T* gy = d.grad_y + r * D;            // [D]
    const double mean = d.mean[r], rstd = d.rstd[r];
    for (std::int64_t j = first_col; j < last_col; ++j) {
      sum_w[std::size_t(j - first_col)] += double(gy[j]) * ((x[j] - mean) * rstd);
      sum_b[std::size_t(j - first_col)] += gy[j];
    }
  }
  for (std::int64_t j = first_col; j < last_col; ++j) {
    if (d.grad_weight != nullptr) {
      d.grad_weight[j] = static_cast<T>(d.grad_weight[j] + sum_w[std::size_t(j - first_col)]);
    }
    if (d.grad_bias != nullptr) {
      d.grad_bias[j] = static_cast<T>(d.grad_bias[j] + sum_b[std::size_t(j - first_col)]);
    }
  }
}

template void layer_norm_forward<float>(const LayerNormForwardData<float>&, std::int64_t,
                                        std::int64_t);
template void layer_norm_forward<double>(const LayerNormForwardData<double>&, std::int64_t,
                                         std::int64_t);
template void layer_norm_backward_x<float>(const LayerNormBackwardData<float>&, std::int64_t,
                                           std::int64_t);
template void layer_norm_backward_x<double>(const LayerNormBackwardData<double>&, std::int64_t,
                                            std::int64_t);
template void layer_norm_backward_params<float>(const LayerNormBackwardData<float>&, std::int64_t,
                                                std::int64_t);
template void layer_norm_backward_params<double>(const LayerNormBackwardData<double>&, std::int64_t,
                                                 std::int64_t);

}  // namespace towerlab::reference
