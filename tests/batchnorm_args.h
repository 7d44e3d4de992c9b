// The argument structs of kernels/batchnorm.h as the batch-norm tests fill them
// most often: a training forward into fresh outputs, and the backward of a given
// forward, so that a test spells out only what it varies (the tests that check
// the structs' fields themselves write them in full).
#pragma once

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

}  // namespace towerlab::testing
