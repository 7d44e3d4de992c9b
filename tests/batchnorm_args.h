// The argument structs of kernels/batchnorm.h as the batch-norm tests fill them
// most often: a training forward into fresh outputs, the backward of a given
// forward, and the synchronized backward's two steps, so that a test spells out
// only what it varies (the tests that check
// the structs' fields themselves write them in full).
#pragma once

#include <cstdint>

#include "kernels/batchnorm.h"

namespace towerlab::testing {

// The training forward of x into fresh y (x's dtype), save_mean and save_inv_std
// (gamma's: x's, or float32 beside a 16-bit x), on `stream`, without moving
// statistics: set moving_mean and moving_var to update them, and eps, momentum or
// activation to change them.
inline BatchNormForwardTraining training_forward(const Tensor& x, const Tensor& gamma,
                                                 const Tensor& beta, const Stream& stream) {
  const Shape channels{x.size(1)};
  return {.y = Tensor::empty(x.shape(), stream, x.dtype()),
          .save_mean = Tensor::empty(channels, stream, gamma.dtype()),
          .save_inv_std = Tensor::empty(channels, stream, gamma.dtype()),
          .x = x,
          .gamma = gamma,
          .beta = beta};
}

// The backward of forward f (its x, gamma, beta, statistics and activation) for
// grad_y, into the gradients given: each is accumulated, or not computed when
// undefined.
inline BatchNormBackward backward_of(const BatchNormForwardTraining& f, const Tensor& grad_y,
                                     const Tensor& grad_x, const Tensor& grad_gamma = Tensor(),
                                     const Tensor& grad_beta = Tensor()) {
  return {.grad_x = grad_x,
          .grad_gamma = grad_gamma,
          .grad_beta = grad_beta,
          .grad_y = grad_y,
          .x = f.x,
          .gamma = f.gamma,
          .beta = f.beta,
          .save_mean = f.save_mean,
          .save_inv_std = f.save_inv_std,
          .activation = f.activation};
}

// The synchronized backward's first step for forward f over grad_y: each channel's
// sums of grad_y and grad_y * x_hat, assigned to sum_grad_y and sum_grad_y_xhat.
inline BatchNormBackwardReduce reduce_of(const BatchNormForwardTraining& f, const Tensor& grad_y,
                                         const Tensor& sum_grad_y, const Tensor& sum_grad_y_xhat) {
  return {.sum_grad_y = sum_grad_y,
          .sum_grad_y_xhat = sum_grad_y_xhat,
          .grad_y = grad_y,
          .x = f.x,
          .gamma = f.gamma,
          .beta = f.beta,
          .mean = f.save_mean,
          .inv_std = f.save_inv_std,
          .activation = f.activation};
}

// Its second step: grad_x from the sums that `reduce` names (over `count` values a
// channel in the whole batch), for the same grad_y, x and statistics.
inline BatchNormBackwardApply apply_of(const BatchNormBackwardReduce& reduce, const Tensor& grad_x,
                                       std::int64_t count,
                                       GradWrite write = GradWrite::Accumulate) {
  return {.grad_x = grad_x,
          .grad_y = reduce.grad_y,
          .x = reduce.x,
          .gamma = reduce.gamma,
          .beta = reduce.beta,
          .mean = reduce.mean,
          .inv_std = reduce.inv_std,
          .sum_grad_y = reduce.sum_grad_y,
          .sum_grad_y_xhat = reduce.sum_grad_y_xhat,
          .count = count,
          .activation = reduce.activation,
          .grad_x_write = write};
}

}  // namespace towerlab::testing
