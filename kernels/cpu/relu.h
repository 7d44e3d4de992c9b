// CPU backend entry points of ReLU (contracts in kernels/relu.h), called by its
// dispatch once the arguments are checked. Internal: not installed, not included
// by towerlab.h.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "engine/tensor.h"

namespace towerlab::cpu {

// ReLU's backward mask: grad where y > 0, else +0, for every backward that applies
// it (ReLU's own and the fused ones). Bit arithmetic, not a branch or a select the
// compiler may turn into one: on real activations "y > 0" is a coin toss, and a
// mispredicted branch per value costs several times the whole loop. Not
// grad * (y > 0) either, which turns an infinite or NaN grad into NaN where the
// mask is 0.
template <typename T>
T relu_mask(T grad, T y) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  const Bits keep = Bits{0} - static_cast<Bits>(y > T(0));  // all ones or all zeros
  return std::bit_cast<T>(std::bit_cast<Bits>(grad) & keep);
}

void relu_forward(const Tensor& y, const Tensor& x);
void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y);

}  // namespace towerlab::cpu
