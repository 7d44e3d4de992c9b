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
// Every tensor has one dtype (float32; float64 on the CPU) on the stream's device.
#pragma once

#include <cstdint>

#include "engine/stream.h"
#include "engine/tensor.h"

namespace towerlab {

void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, const Stream& stream);
void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, const Stream& stream);

// Backend entry points: arguments already checked, tensors viewed as [N,C,S].
namespace cpu {
void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                      std::int64_t C, std::int64_t S);
void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, std::int64_t N,
                       std::int64_t C, std::int64_t S);
}  // namespace cpu

namespace cuda {
void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                      std::int64_t C, std::int64_t S, const Stream& stream);
void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, std::int64_t N,
                       std::int64_t C, std::int64_t S, const Stream& stream);
}  // namespace cuda

}  // namespace towerlab
