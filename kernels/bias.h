// Bias add over the channel dimension, forward and backward.
//
// Dimensions: N batch, C channels, and any trailing spatial dimensions (H, W);
// x is [N,C] (a fully connected layer) or [N,C,H,W] (a convolution), or any
// [N,C,...] of rank >= 2; S is the product of the trailing dimensions (1 for [N,C]).
//
//   bias_add_forward(y, x, bias)      y[n,c,s] = x[n,c,s] + bias[c]
//                                     y is assigned and may alias x (in place:
//                                     bias_add_forward(x, x, bias) adds to x)
//   bias_add_backward(grad_bias, grad_y)
//                                     grad_bias[c] += sum_{n,s} grad_y[n,c,s]
// bias and grad_bias are [C]. The gradient with respect to x is grad_y itself
// (add it with add() or axpy(); nothing to compute here). grad_bias is accumulated.
//
// Bias add fused with the ReLU that follows it (a fully connected layer's
// activation): one pass instead of two in each direction, and no gradient tensor
// for the ReLU's input. The values are those of bias_add_forward + relu_forward
// and of relu_backward + bias_add_backward + add (kernels/relu.h), bit for bit on
// the CPU (the same operations in the same order):
//   bias_add_relu_forward(y, x, bias)  y[n,c,s] = max(x[n,c,s] + bias[c], 0)
//                                      (ReLU's NaN rule; y may alias x)
//   bias_add_relu_backward(grad_x, grad_bias, grad_y, y)
//                                      with g = grad_y * (y > 0), y the forward's output:
//                                      grad_x[n,c,s] += g[n,c,s]
//                                      grad_bias[c]  += sum_{n,s} g[n,c,s]
// grad_x and grad_bias are accumulated; either may be undefined (not computed).
//
// Dtypes, on the stream's device: x, y, grad_y and grad_x are float32, bfloat16 or
// float16 (float64 on the CPU), all of one dtype; bias and grad_bias are of that
// dtype too, except beside 16-bit tensors, where they are float32 (the precision
// policy keeps biases float32: docs/precision.md). A 16-bit value is read as its
// exact float32 widening, the sums above are float32 adds, and every 16-bit value
// written (y, grad_x) is rounded once to nearest even; the fused forward rounds
// x + bias before its ReLU, so that it gives the unfused pair's bits. grad_bias
// sums the 16-bit grad_y's float32 values in double on the CPU, as in float32.
// Tolerances against the reference (kernels/reference/bias.h): y and grad_x are
// its bits on every backend (the same float32 add, then one rounding); grad_bias
// is the float32 tolerance of the sums (1e-4 absolute + 1e-5 relative in the
// tests, CUDA summing block partials in float32).
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, const Stream& stream);
void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, const Stream& stream);

void bias_add_relu_forward(const Tensor& y, const Tensor& x, const Tensor& bias,
                           const Stream& stream);
void bias_add_relu_backward(const Tensor& grad_x, const Tensor& grad_bias, const Tensor& grad_y,
                            const Tensor& y, const Stream& stream);

}  // namespace towerlab
