// Layer normalization over the last dimension, forward and backward, with an
// optional affine weight and bias.
//
// Dimensions: x is [..., D] of any rank >= 1, taken as R rows of D values (R = the
// product of the other dimensions). y, grad_y and grad_x have x's shape; weight,
// bias, grad_weight and grad_bias are [D]; mean and rstd are [R]. Every tensor has
// x's dtype (float32; float64 on the CPU) and is on the stream's device.
//
// Forward, with each row's statistics (biased variance, as PyTorch's layer_norm):
//   mean[r] = sum_d x[r,d] / D
//   rstd[r] = 1 / sqrt(sum_d (x[r,d] - mean[r])^2 / D + eps)
//   y[r,d]  = (x[r,d] - mean[r]) * rstd[r] * weight[d] + bias[d]
// where an absent weight is 1 and an absent bias 0. mean and rstd are saved for the
// backward (PyTorch's third and second outputs: mean and rstd, not the variance).
//
// Backward, with x_hat = (x - mean) * rstd and g = grad_y * weight (grad_y alone
// without a weight), sums over d within a row:
//   grad_x[r,d]    += rstd[r] * (g[r,d] - sum_d g / D - x_hat[r,d] * sum_d (g * x_hat) / D)
//   grad_weight[d] += sum_r grad_y[r,d] * x_hat[r,d]
//   grad_bias[d]   += sum_r grad_y[r,d]
// Each gradient is optional (an undefined Tensor is not computed) and accumulated;
// grad_x is assigned instead with grad_x_write = GradWrite::Assign
// (kernels/grad_write.h). grad_weight and grad_bias may be asked for whether or
// not the forward had a weight and a bias (their sums do not read them).
//
// Determinism: every sum is in a fixed order. The CPU sums each row in double, in
// index order (float64) or in W lanes added at the row's end (float32, W fixed by
// the ISA), and grad_weight / grad_bias over rows in row order, split over
// columns between threads (kernels/cpu/parallel.h). CUDA gives each row to one warp
// (launch.cuh's warp_sum), and sums grad_weight / grad_bias in two stages without
// atomics: each of S row blocks sums its rows in row order, then the S partials of
// each column are added in split_reduce's pairwise tree (kernels/cuda/split_reduce.cuh);
// S depends on R only, so a shape gives the same bits on every device.
//
// Numerical stability: the variance is the mean of squared deviations from the
// row's mean (two passes), never E[x^2] - E[x]^2, so rows around 1e4 with a
// standard deviation of 1 keep their variance. The CPU computes the statistics in
// double; CUDA in float, summing x - K with K the row's first value (a sample of
// the row, as batch norm's shift) so that the mean of a row around 1e4 keeps float
// precision relative to the row's spread. Both store them in x's dtype, and the
// backward reads them back: for float32, a row far from zero relative to its
// spread carries the saved mean's rounding (|mean| 2^-24 rstd in x_hat) into
// grad_x, as PyTorch's float32 layer norm does with its saved mean. eps must
// be finite and >= 0 (InvalidArgument); 1e-5 by default, as in PyTorch. With eps =
// 0 a constant row has rstd = inf and gives NaN.
//
// NaN rule: a NaN in a row makes that row's statistics, outputs and grad_x NaN, and
// every column's grad_weight (the sum over rows); a NaN in weight or bias makes
// that column's outputs NaN. An infinity in x does the same as a NaN (inf - inf in
// the variance).
//
// Tolerance: the reference (kernels/reference/layer_norm.h) is in double. The CPU
// runs it for float64; for float32 it runs the same double arithmetic in vector
// lanes (kernels/cpu/layer_norm.cpp), rounded to float32 once as the reference
// rounds, so only the order of the row sums and fused multiply-adds differ: every
// output within 2e-7 + 1e-6 |reference| of it on every ISA (a float32 ulp or so).
// The CUDA float32 kernels are held to 1e-5 + 1e-4 |reference| in the tests (the
// row sums of D float values, and the column sums of R, in float).
//
// Aliasing: y may alias x (a row is read whole before it is written); no other
// output aliases an input, except grad_x and grad_y with GradWrite::Assign.
//
// Each entry point takes one argument struct, outputs first, then inputs, then
// numbers and options:
//   layer_norm_forward({.y = y, .mean = mean, .rstd = rstd, .x = x, .weight = w,
//                       .bias = b}, stream);
// Errors name the op and the field: ShapeError ("layer_norm_forward: weight is
// float32[4] on cpu but x float32[2,3] on cpu has D = 3 (expected [3])"),
// bfloat16 / float16 get check_dtype_supported's NotSupported naming the dtype.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

struct LayerNormForward {
  Tensor y;       // [..., D]
  Tensor mean;    // [R]
  Tensor rstd;    // [R]
  Tensor x;       // [..., D]
  Tensor weight;  // [D], optional
  Tensor bias;    // [D], optional
  double eps = 1e-5;
};

struct LayerNormBackward {
  Tensor grad_x;       // [..., D], optional
  Tensor grad_weight;  // [D], optional, accumulated
  Tensor grad_bias;    // [D], optional, accumulated
  Tensor grad_y;       // [..., D]
  Tensor x;            // [..., D]
  Tensor weight;       // [D], optional (the forward's)
  Tensor mean;         // [R], the forward's
  Tensor rstd;         // [R], the forward's
  GradWrite grad_x_write = GradWrite::Accumulate;
};

void layer_norm_forward(const LayerNormForward& args, const Stream& stream);
void layer_norm_backward(const LayerNormBackward& args, const Stream& stream);

}  // namespace towerlab
