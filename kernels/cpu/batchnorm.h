// Backend entry points of batch normalization (contracts in kernels/batchnorm.h):
// BatchNormArgs, which both backends take, and the CPU functions. The dispatch in
// kernels/batchnorm.cpp checks a public entry point's argument struct, then fills
// one BatchNormArgs with what its steps need (the training forward's statistics
// and normalization share one, as do the backward's reduction and apply); each
// backend function reads the fields listed at it. The merge, which needs nothing
// derived, takes the public BatchNormMergeStats as it is. Internal: not installed,
// not included by towerlab.h.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/philox.h"  // TL_HOST_DEVICE
#include "engine/tensor.h"
#include "kernels/batchnorm.h"
#include "kernels/grad_write.h"
#include "kernels/pool2d.h"
#include "kernels/relu.h"

namespace towerlab {

struct BatchNormArgs {
  std::int64_t N = 0, C = 0, S = 0;  // x viewed as [N,C,S], S = H*W (1 for [N,C])
  Tensor x;                          // [N,C,S]
  Tensor y;                          // [N,C,S] the forward's output
  Tensor gamma, beta;                // [C]
  Tensor mean, m2, inv_std;          // [C] statistics (m2 = sum of squared deviations)
  Tensor moving_mean, moving_var;    // [C] both defined or both undefined (no update)
  std::int64_t count = 0;            // values per channel behind mean and m2 (all towers)
  double eps = 0.0, momentum = 0.0;
  // ReLU: the forwards clamp y; the backwards mask grad_y by the forward's y > 0,
  // recomputed from x, gamma, beta, mean and inv_std (batchnorm_affine).
  Activation activation = Activation::None;
  // A fused max pool (batchnorm_max_pool_*, CPU): y and grad_y are then the pool's
  // [N,C,Ho,Wo] over the [H,W] planes of x (S = H*W), and argmax [N,C,Ho,Wo] the
  // positions of the windows' maxima (-1 where a ReLU stops the gradient). Its
  // backwards take the ReLU's mask from argmax and run with Activation::None.
  std::optional<Pool2dParams> max_pool;
  Tensor argmax;
  std::int64_t H = 0, W = 0, Ho = 0, Wo = 0;
  Tensor grad_y, grad_x;                           // [N,C,S] ([N,C,Ho,Wo] with max_pool)
  GradWrite grad_x_write = GradWrite::Accumulate;  // Assign: grad_x = ..., not read first
  Tensor sum_grad_y, sum_grad_y_xhat;              // [C]
};

// The normalization of one value before the ReLU: (x - center) * scale + shift,
// with center = mean, scale = gamma * inv_std and shift = beta in x's dtype. The
// forward stores it (clamped) and a ReLU backward recomputes it for its mask, each
// through this one expression on both backends (CUDA's kernels call it too), so
// that the mask is the forward's bit for bit. x - center stays explicit (rather
// than x * scale + (shift - center * scale)) to avoid cancellation when the mean
// is large.
template <typename T>
TL_HOST_DEVICE inline T batchnorm_affine(T x, T center, T scale, T shift) {
  return (x - center) * scale + shift;
}

}  // namespace towerlab

namespace towerlab::cpu {

// Reads x; writes mean, m2.
void batchnorm_stats(const BatchNormArgs& a);
void batchnorm_merge_stats(const BatchNormMergeStats& a);
// Reads x, gamma, beta, mean, m2, count, eps, momentum, activation, max_pool (and
// H, W, Ho, Wo with it); writes y, inv_std, (with max_pool) argmax and (when
// defined) moving_mean, moving_var.
void batchnorm_forward_from_stats(const BatchNormArgs& a);
// Reads x, gamma, beta, moving_mean, moving_var, eps, activation; writes y.
void batchnorm_forward_inference(const BatchNormArgs& a);
// Reads grad_y, x, mean, inv_std, activation (and gamma, beta for ReLU), max_pool
// (and argmax, H, W, Ho, Wo with it); writes sum_grad_y, sum_grad_y_xhat.
void batchnorm_backward_reduce(const BatchNormArgs& a);
// Reads grad_y, x, gamma, mean, inv_std, sum_grad_y, sum_grad_y_xhat, count,
// activation (and beta for ReLU), max_pool (and argmax, H, W, Ho, Wo with it),
// grad_x_write; adds into (or assigns) grad_x.
void batchnorm_backward_apply(const BatchNormArgs& a);

}  // namespace towerlab::cpu
