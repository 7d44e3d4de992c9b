// Batch normalization over the batch and spatial positions of each channel.
//
// Dimensions: N batch, C channels, H and W spatial; x is [N,C,H,W] for a
// convolutional layer or [N,C] for a fully connected one (taken as H = W = 1).
// M = N*H*W is the number of values of one channel that are normalized together.
// Per-channel tensors (gamma, beta, mean, m2, inv_std, moving_*, the split
// backward's sums, grad_gamma, grad_beta) are [C]. Every tensor is on the stream's
// device; dtypes below.
//
// Training forward, with the batch statistics of each channel c:
//   mean[c]    = sum_{n,h,w} x[n,c,h,w] / M
//   m2[c]      = sum_{n,h,w} (x[n,c,h,w] - mean[c])^2          (the "M2" of Welford)
//   inv_std[c] = 1 / sqrt(m2[c] / M + eps)                     (biased variance)
//   y[n,c,h,w] = gamma[c] * (x[n,c,h,w] - mean[c]) * inv_std[c] + beta[c]
// and, when moving statistics are given, the update in TensorFlow's convention,
// where `momentum` (TF's `decay`, default 0.99) is the weight of the OLD value
// (PyTorch's momentum=0.1 is TF's 0.9):
//   moving_mean[c] = momentum * moving_mean[c] + (1 - momentum) * mean[c]
//   moving_var[c]  = momentum * moving_var[c]  + (1 - momentum) * m2[c] / (M - 1)
// The moving variance uses the UNBIASED batch variance, as TF and PyTorch do;
// the normalization itself uses the biased one. Training needs M >= 2.
//
// Inference forward, from the moving statistics:
//   y = gamma * (x - moving_mean) / sqrt(moving_var + eps) + beta
//
// Backward of the training forward (x_hat = (x - mean) * inv_std, sums over n,h,w):
//   grad_beta[c]  += sum grad_y
//   grad_gamma[c] += sum grad_y * x_hat
//   grad_x        += gamma * inv_std * (grad_y - sum(grad_y) / M - x_hat * sum(grad_y * x_hat) / M)
// Each gradient is optional (an undefined Tensor is not computed) and accumulated;
// grad_x is assigned instead when the call passes GradWrite::Assign (it is
// written everywhere: kernels/grad_write.h).
//
// Fused ReLU (Activation::ReLU, kernels/relu.h): the forwards store
// y = max(batchnorm(x), 0), and the backwards, given Activation::ReLU and beta,
// use grad_y * (y > 0) in place of grad_y in every formula above. They never read
// y: each value's y > 0 is recomputed from x, gamma, beta and the statistics with
// the forward's own expression (the same rounding, so the same mask), and so a
// fused backward moves no more bytes than the plain one. This saves the ReLU's own
// pass in each direction and the gradient tensor between the two ops; the values
// are those of the unfused pair (batch norm, then relu_forward; then relu_backward
// into a zeroed gradient, then the batch-norm backward on it), bit for bit on the
// CPU up to the sign of a zero gradient (the same operations in the same order).
//
// Numerical stability: the statistics never use E[x^2] - E[x]^2. The CPU makes
// two passes (the mean, then the squared deviations from it) accumulating in
// double; CUDA sums in float the deviations from a per-channel shift K (the
// channel's first value x[0,c,0], a sample of the channel and so typically a few
// standard deviations from its mean, however large the mean), then combines the
// blocks in double. Inputs around 1e4 with a standard deviation of 1 keep their
// variance to float precision. (An outlier as K loses precision in proportion to
// its distance from the mean, as E[x^2] - E[x]^2 does with the mean's distance
// from zero; in practice the first value is an ordinary sample.)
//
// Dtypes. x, y, grad_y and grad_x are float32, bfloat16 or float16 on every device
// (float64 on the CPU, for the gradient checks), all of one dtype. The per-channel
// tensors have x's dtype, except beside 16-bit activations, where they are float32:
// the parameters, the statistics, the moving statistics and grad_gamma, grad_beta
// stay float32, as PyTorch's batch norm under autocast keeps them. A 16-bit value is
// read as its exact float32 widening, every formula here is computed as the float32
// path computes it, and each 16-bit value written (y, grad_x) is rounded once, to
// nearest even; an accumulated 16-bit grad_x is added to in float32, then rounded.
// The CPU widens a row at a time into float32 and runs its float32 code on it;
// CUDA's kernels widen as they load and round as they store.
// Float32 gradients beside a 16-bit x (the mixed-precision policy's backward,
// docs/precision.md): on the CPU the backwards (batchnorm_backward,
// batchnorm_max_pool_backward, batchnorm_backward_reduce and _apply) also take a
// 16-bit x with grad_y and grad_x both float32, and give the bits of the float32
// call on x widened (each row of x widened as it is read, never the whole x). Beside
// float32 grad_y, grad_x may also be x's 16-bit dtype: the float32 grad_x rounded
// once as it is stored (added to in float32 first when accumulating), the bits of
// casting the float32 call's grad_x (how a 16-bit tape's batch norm hands a
// convolution the rounded gradient it multiplies: Tape::grad_target_rounded). On
// CUDA both are NotSupported: widen x first.
// What is exact: on one backend, every result of a 16-bit call (the float32
// statistics, sums and parameter gradients included) is the bits of the float32
// call on the widened tensors, and each 16-bit output is that call's float32 output
// rounded once: the float32 sums are the same sums in the same order (on CUDA a
// 16-bit view walks as an aligned float32 tensor of its values). What is not:
// against the plain reference (double, kernels/reference/batchnorm.h) a float32
// result is within the float32 tolerances of tests/batchnorm_test.cpp, and a 16-bit
// y or grad_x is the reference rounded to 16 bits except where that float32 error
// carries it across a rounding boundary: within half a 16-bit ulp plus the float32
// tolerance (the tests allow 2^-8 relative for bfloat16, 2^-11 for float16, on top of
// it). CPU and CUDA sum in different orders, so their 16-bit outputs may differ by an
// ulp. The merge takes only statistics' dtypes (never 16 bits: NotSupported). The
// fused max pool below takes a 16-bit x on the CPU under the same rule (its argmax
// float32). A per-channel tensor
// of another dtype is a ShapeError naming the op, the tensor and both dtypes, e.g.
// "batchnorm_forward_training: gamma is bfloat16[3] on cpu but x is
// bfloat16[2,3,4,4] on cpu, whose per-channel tensors are float32 (...)".
//
// Split API (for synchronized batch norm across towers). The single-device
// training forward and backward are compositions of these steps:
//   forward:  batchnorm_stats          per-tower (mean, m2) partials, count = local M
//             batchnorm_merge_stats    combine partials (Chan et al.); synchronized
//                                      batch norm merges every tower's partials
//             batchnorm_forward_from_stats  normalize with the merged statistics
//   backward: batchnorm_backward_reduce  per-tower sum(grad_y), sum(grad_y * x_hat):
//                                      plain sums, to be all-reduced across towers
//             batchnorm_backward_apply   grad_x from the all-reduced sums and total M
// Partials are (mean, m2) rather than (sum, sum of squares) so that merging them
// stays accurate for large means; an empty tower contributes (0, 0) with count 0.
//
// Each entry point takes one argument struct, named after it, holding exactly the
// tensors and numbers that entry point reads or writes, and the stream:
//   batchnorm_forward_training({.y = y, .save_mean = mean, .save_inv_std = inv_std,
//                               .x = x, .gamma = gamma, .beta = beta}, stream);
// Fields are declared outputs first, then inputs, then numbers and options, so a
// designated initializer names them in that order; an undefined Tensor field is
// "not given". The entry point checks the struct once (every tensor defined where
// it is needed, on the stream's device, of its dtype and shape) and throws
// ShapeError or InvalidArgument naming the field, e.g.
// "batchnorm_forward_training: gamma is float32[4] on cpu but x float32[2,3,4,4]
// on cpu has 3 channels (expected [3])".
//
// Outputs are assigned unless the contract says "accumulated". No output may
// alias an input, except y and x in the forwards (elementwise in place).
#pragma once

#include <cstdint>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"
#include "pool2d.h"
#include "relu.h"

namespace towerlab {

// --- on one device -----------------------------------------------------------------

// Training forward on one device: batch statistics, normalization and (when
// moving_mean and moving_var are defined) the fused moving-statistics update.
struct BatchNormForwardTraining {
  Tensor y;                        // [N,C,H,W] or [N,C], x's shape (may be x itself)
  Tensor save_mean, save_inv_std;  // [C] assigned; keep them for the backward
  Tensor moving_mean, moving_var;  // [C] updated in place, or both undefined (no update)
  Tensor x;                        // [N,C,H,W] or [N,C], at least 2 values per channel
  Tensor gamma, beta;              // [C]
  double eps = 1e-3;
  double momentum = 0.99;  // TensorFlow's decay: the weight of the old moving value
  Activation activation = Activation::None;
};
void batchnorm_forward_training(const BatchNormForwardTraining& args, const Stream& stream);

// Inference forward from the moving statistics (no state changes).
struct BatchNormForwardInference {
  Tensor y;                        // x's shape (may be x itself)
  Tensor x;                        // [N,C,H,W] or [N,C]
  Tensor gamma, beta;              // [C]
  Tensor moving_mean, moving_var;  // [C] read only
  double eps = 1e-3;
  Activation activation = Activation::None;
};
void batchnorm_forward_inference(const BatchNormForwardInference& args, const Stream& stream);

// Backward of batchnorm_forward_training, from its save_mean and save_inv_std.
struct BatchNormBackward {
  // Accumulated (grad_x assigned when grad_x_write is Assign); any may be
  // undefined, and then is not computed.
  Tensor grad_x;                             // x's shape
  Tensor grad_gamma, grad_beta;              // [C]
  Tensor grad_y;                             // x's shape
  Tensor x, gamma;                           // the forward's
  Tensor beta;                               // [C] the forward's, for Activation::ReLU only
  Tensor save_mean, save_inv_std;            // [C] the forward's
  Activation activation = Activation::None;  // the forward's
  GradWrite grad_x_write = GradWrite::Accumulate;
};
void batchnorm_backward(const BatchNormBackward& args, const Stream& stream);

// --- the split API ---------------------------------------------------------------

// The per-channel partial statistics of this x: mean [C] and m2 [C] (assigned),
// over count = N*H*W values each (0 and 0 for an empty batch).
struct BatchNormPartialStats {
  Tensor mean, m2;  // [C] assigned
  Tensor x;         // [N,C,H,W] or [N,C], may be empty
};
void batchnorm_stats(const BatchNormPartialStats& args, const Stream& stream);

// Merges partial b into partial a in place (a's count becomes count_a + count_b,
// which the caller keeps):
//   delta = mean_b - mean_a, n = count_a + count_b
//   mean_a += delta * count_b / n
//   m2_a   += m2_b + delta^2 * count_a * count_b / n
struct BatchNormMergeStats {
  Tensor mean_a, m2_a;  // [C] read and updated
  std::int64_t count_a = 0;
  Tensor mean_b, m2_b;  // [C]
  std::int64_t count_b = 0;
};
void batchnorm_merge_stats(const BatchNormMergeStats& args, const Stream& stream);

// Normalizes x with statistics (mean, m2) over `count` values per channel (count
// may exceed x's own N*H*W: the merged statistics of all towers), with the
// moving-statistics update of batchnorm_forward_training.
struct BatchNormForwardFromStats {
  Tensor y;                        // x's shape (may be x itself)
  Tensor inv_std;                  // [C] assigned
  Tensor moving_mean, moving_var;  // [C] updated in place, or both undefined (no update)
  Tensor x;                        // [N,C,H,W] or [N,C], may be empty (a tower without samples)
  Tensor gamma, beta;              // [C]
  Tensor mean, m2;                 // [C] the merged statistics
  std::int64_t count = 0;          // values per channel behind mean and m2, at least 2
  double eps = 1e-3;
  double momentum = 0.99;
  Activation activation = Activation::None;
};
void batchnorm_forward_from_stats(const BatchNormForwardFromStats& args, const Stream& stream);

// sum_grad_y[c] = sum grad_y, sum_grad_y_xhat[c] = sum grad_y * (x - mean) * inv_std,
// over this x's n,h,w (assigned; 0 for an empty x).
struct BatchNormBackwardReduce {
  Tensor sum_grad_y, sum_grad_y_xhat;        // [C] assigned
  Tensor grad_y;                             // x's shape
  Tensor x;                                  // the forward's
  Tensor gamma, beta;                        // [C] the forward's, for Activation::ReLU only
  Tensor mean, inv_std;                      // [C] the forward's
  Activation activation = Activation::None;  // the forward's
};
void batchnorm_backward_reduce(const BatchNormBackwardReduce& args, const Stream& stream);

// grad_x += gamma * inv_std * (grad_y - sum_grad_y / count - x_hat * sum_grad_y_xhat / count),
// with the sums and count over the whole (possibly multi-tower) batch (grad_x = ...
// when grad_x_write is Assign).
struct BatchNormBackwardApply {
  Tensor grad_x;                             // x's shape, accumulated (or assigned)
  Tensor grad_y;                             // x's shape
  Tensor x, gamma;                           // the forward's
  Tensor beta;                               // [C] the forward's, for Activation::ReLU only
  Tensor mean, inv_std;                      // [C] the forward's
  Tensor sum_grad_y, sum_grad_y_xhat;        // [C] over the whole batch
  std::int64_t count = 0;                    // values per channel over the whole batch, at least 1
  Activation activation = Activation::None;  // the forward's
  GradWrite grad_x_write = GradWrite::Accumulate;
};
void batchnorm_backward_apply(const BatchNormBackwardApply& args, const Stream& stream);

// --- with a fused max pool (CPU) ---------------------------------------------------
//
// The training forward and backward of
//   y = max_pool2d(activation(batchnorm(x)), pool)     x [N,C,H,W], y [N,C,Ho,Wo]
// for any window, stride and padding that kernels/pool2d.h accepts. The statistics,
// the moving-statistics update, save_mean and save_inv_std are
// batchnorm_forward_training's. What is fused is the pass over the values: each
// plane (n, c) of the activation is computed into a scratch plane with the
// forward's own expression and pooled there, so the [N,C,H,W] activation is never
// stored. The forward records in argmax [N,C,Ho,Wo] (x's dtype, as
// max_pool2d_forward_with_argmax does) the position h*W + w in its plane of each
// window's maximum, or -1 where the ReLU zeroes the window (a maximum that is not
// > 0: its gradient goes nowhere). The backward rebuilds each plane of the pool's
// gradient, with the ReLU's mask, from argmax and grad_y in scratch, just before the
// batch norm's backward sums it and applies it, so that gradient is never stored
// either, and needs neither beta nor the activation.
// y, argmax (where it is not -1), grad_x, grad_gamma and grad_beta are those of the
// unfused ops bit for bit (batchnorm_forward_training, then
// max_pool2d_forward_with_argmax; max_pool2d_backward_from_argmax with
// GradWrite::Assign, then batchnorm_backward): the same operations in the same order.
// CPU only: on a CUDA stream they throw NotSupported (ag::batchnorm_max_pool2d
// composes the two ops there). x, y, grad_y and grad_x of one dtype (or the float32
// gradients beside a 16-bit x above): float32,
// float64, or bfloat16 or float16, whose argmax is float32 (pool2d_argmax_dtype) and
// whose results follow the 16-bit rule above: the float32 call's on the widened
// tensors, each 16-bit output (y, grad_x) rounded once. The CPU reads each 16-bit
// plane widened into a thread's row buffer and rounds y's pooled plane as it stores
// it, so a 16-bit x is never widened whole.
struct BatchNormMaxPoolForwardTraining {
  Tensor y, argmax;                // [N,C,Ho,Wo] assigned
  Tensor save_mean, save_inv_std;  // [C] assigned
  Tensor moving_mean, moving_var;  // [C] updated in place, or both undefined (no update)
  Tensor x;                        // [N,C,H,W]
  Tensor gamma, beta;              // [C]
  double eps = 1e-3;
  double momentum = 0.99;
  Pool2dParams pool;
  Activation activation = Activation::None;
};
void batchnorm_max_pool_forward_training(const BatchNormMaxPoolForwardTraining& args,
                                         const Stream& stream);

struct BatchNormMaxPoolBackward {
  // Accumulated (grad_x assigned when grad_x_write is Assign); any may be
  // undefined, and then is not computed.
  Tensor grad_x;                   // [N,C,H,W]
  Tensor grad_gamma, grad_beta;    // [C]
  Tensor grad_y, argmax;           // [N,C,Ho,Wo], argmax the forward's
  Tensor x, gamma;                 // the forward's
  Tensor save_mean, save_inv_std;  // [C] the forward's
  Pool2dParams pool;               // the forward's
  GradWrite grad_x_write = GradWrite::Accumulate;
};
void batchnorm_max_pool_backward(const BatchNormMaxPoolBackward& args, const Stream& stream);

}  // namespace towerlab
