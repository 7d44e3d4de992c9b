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
// Every tensor has one dtype (float32; float64 on the CPU) on the stream's device.
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
