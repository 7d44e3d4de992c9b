// The plain reference of batch normalization: the specification that the CPU's
// fast paths (row sums in float lanes, AVX-512, the fused pooling) and the CUDA
// kernels are tested against. Every formula of kernels/batchnorm.h, per channel,
// in double, straight from its definition; nothing here is fast.
//
// Dimension letters: N batch, C channels, S = H*W positions of a plane (1 for a
// fully connected layer's [N,C]); x is viewed as [N,C,S] and M = N*S values of a
// channel are normalized together. Per-channel arrays are [C].
// The fused activation (Activation::ReLU) is reference::relu_forward on y, and the
// fused max pool is reference::max_pool2d_forward on that: they are specified as
// the composition, so they have no loops of their own here.
#pragma once

#include <cstdint>

namespace towerlab::reference {

// The batch statistics, ASSIGNED (the "M2" of Welford: no E[x^2] - E[x]^2):
//   mean[c] = sum_{n,s} x[n,c,s] / M
//   m2[c]   = sum_{n,s} (x[n,c,s] - mean[c])^2
// x [N,C,S] with M >= 1; mean [C], m2 [C].
void batchnorm_stats(double* mean, double* m2, const double* x, std::int64_t N, std::int64_t C,
                     std::int64_t S);

// The training forward, ASSIGNING y, mean and inv_std:
//   mean, m2 as batchnorm_stats;   inv_std[c] = 1 / sqrt(m2[c] / M + eps)
//   y[n,c,s] = gamma[c] * (x[n,c,s] - mean[c]) * inv_std[c] + beta[c]
// and, when moving_mean and moving_var are not nullptr, their update in
// TensorFlow's convention (momentum is the weight of the old value; the unbiased
// variance, so M >= 2):
//   moving_mean[c] = momentum * moving_mean[c] + (1 - momentum) * mean[c]
//   moving_var[c]  = momentum * moving_var[c]  + (1 - momentum) * m2[c] / (M - 1)
// x, y [N,C,S]; gamma, beta, mean, inv_std, moving_* [C].
void batchnorm_forward_training(double* y, double* mean, double* inv_std, double* moving_mean,
                                double* moving_var, const double* x, const double* gamma,
                                const double* beta, std::int64_t N, std::int64_t C, std::int64_t S,
                                double eps, double momentum);

// The inference forward, ASSIGNING y:
//   y[n,c,s] = gamma[c] * (x[n,c,s] - moving_mean[c]) / sqrt(moving_var[c] + eps) + beta[c]
// x, y [N,C,S]; gamma, beta, moving_* [C].
void batchnorm_forward_inference(double* y, const double* x, const double* gamma,
                                 const double* beta, const double* moving_mean,
                                 const double* moving_var, std::int64_t N, std::int64_t C,
                                 std::int64_t S, double eps);

// The backward of the training forward, from its mean and inv_std, ACCUMULATED
// (+=); any gradient may be nullptr. With x_hat = (x - mean) * inv_std and sums
// over n and s:
//   grad_beta[c]  += sum grad_y
//   grad_gamma[c] += sum grad_y * x_hat
//   grad_x        += gamma * inv_std * (grad_y - sum(grad_y) / M - x_hat * sum(grad_y * x_hat) / M)
// x, grad_y, grad_x [N,C,S]; gamma, mean, inv_std, grad_gamma, grad_beta [C].
void batchnorm_backward(double* grad_x, double* grad_gamma, double* grad_beta, const double* grad_y,
                        const double* x, const double* gamma, const double* mean,
                        const double* inv_std, std::int64_t N, std::int64_t C, std::int64_t S);

}  // namespace towerlab::reference
