// Batch normalization's plain reference (contracts in
// kernels/reference/batchnorm.h): one channel at a time, each sum one running sum
// in order n, then s.
#include "kernels/reference/batchnorm.h"

#include <cmath>
#include <vector>

namespace towerlab::reference {

namespace {

// Index of x[n,c,s] in [N,C,S].
std::int64_t at(std::int64_t n, std::int64_t c, std::int64_t s, std::int64_t C, std::int64_t S) {
  return (n * C + c) * S + s;
}

}  // namespace

void batchnorm_stats(double* mean, double* m2, const double* x, std::int64_t N, std::int64_t C,
                     std::int64_t S) {
  const double M = static_cast<double>(N * S);
  for (std::int64_t c = 0; c < C; ++c) {
    double sum = 0.0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) sum += x[at(n, c, s, C, S)];
    mean[c] = sum / M;
    double squares = 0.0;
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t s = 0; s < S; ++s) {
        const double d = x[at(n, c, s, C, S)] - mean[c];
        squares += d * d;
      }
    }
    m2[c] = squares;
  }
}

void batchnorm_forward_training(double* y, double* mean, double* inv_std, double* moving_mean,
                                double* moving_var, const double* x, const double* gamma,
                                const double* beta, std::int64_t N, std::int64_t C, std::int64_t S,
                                double eps, double momentum) {
  const double M = static_cast<double>(N * S);
  std::vector<double> m2(static_cast<std::size_t>(C));  // [C]
  batchnorm_stats(mean, m2.data(), x, N, C, S);
  for (std::int64_t c = 0; c < C; ++c) {
    inv_std[c] = 1.0 / std::sqrt(m2[c] / M + eps);
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t s = 0; s < S; ++s) {
        const std::int64_t i = at(n, c, s, C, S);
        y[i] = gamma[c] * (x[i] - mean[c]) * inv_std[c] + beta[c];
      }
    }
    if (moving_mean != nullptr && moving_var != nullptr) {
      moving_mean[c] = momentum * moving_mean[c] + (1.0 - momentum) * mean[c];
      moving_var[c] = momentum * moving_var[c] + (1.0 - momentum) * m2[c] / (M - 1.0);
    }
  }
}

void batchnorm_forward_inference(double* y, const double* x, const double* gamma,
                                 const double* beta, const double* moving_mean,
                                 const double* moving_var, std::int64_t N, std::int64_t C,
                                 std::int64_t S, double eps) {
  for (std::int64_t c = 0; c < C; ++c) {
    const double inv_std = 1.0 / std::sqrt(moving_var[c] + eps);
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t s = 0; s < S; ++s) {
        const std::int64_t i = at(n, c, s, C, S);
        y[i] = gamma[c] * (x[i] - moving_mean[c]) * inv_std + beta[c];
      }
    }
  }
}

void batchnorm_backward(double* grad_x, double* grad_gamma, double* grad_beta, const double* grad_y,
                        const double* x, const double* gamma, const double* mean,
                        const double* inv_std, std::int64_t N, std::int64_t C, std::int64_t S) {
  const double M = static_cast<double>(N * S);
  for (std::int64_t c = 0; c < C; ++c) {
    auto x_hat = [&](std::int64_t i) { return (x[i] - mean[c]) * inv_std[c]; };
    double sum_gy = 0.0, sum_gy_xhat = 0.0;
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t s = 0; s < S; ++s) {
        const std::int64_t i = at(n, c, s, C, S);
        sum_gy += grad_y[i];
        sum_gy_xhat += grad_y[i] * x_hat(i);
      }
    }
    if (grad_beta != nullptr) grad_beta[c] += sum_gy;
    if (grad_gamma != nullptr) grad_gamma[c] += sum_gy_xhat;
    if (grad_x == nullptr) continue;
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t s = 0; s < S; ++s) {
        const std::int64_t i = at(n, c, s, C, S);
        grad_x[i] += gamma[c] * inv_std[c] * (grad_y[i] - sum_gy / M - x_hat(i) * sum_gy_xhat / M);
      }
    }
  }
}

}  // namespace towerlab::reference
