// CPU backend entry points of bias add (contracts in kernels/bias.h), called by
// its dispatch once the arguments are checked, with the tensors viewed as [N,C,S].
// Internal: not installed, not included by towerlab.h.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace towerlab::cpu {

void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                      std::int64_t C, std::int64_t S);
void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, std::int64_t N,
                       std::int64_t C, std::int64_t S);
void bias_add_relu_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                           std::int64_t C, std::int64_t S);
// grad_bias is defined (the dispatch sends a backward without one to relu_backward);
// grad_x may be undefined.
void bias_add_relu_backward(const Tensor& grad_x, const Tensor& grad_bias, const Tensor& grad_y,
                            const Tensor& y, std::int64_t N, std::int64_t C, std::int64_t S);

}  // namespace towerlab::cpu
