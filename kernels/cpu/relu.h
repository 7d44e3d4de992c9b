// CPU backend entry points of ReLU (contracts in kernels/relu.h), called by its
// dispatch once the arguments are checked. Internal: not installed, not included
// by towerlab.h.
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/half.h"
#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/reference/relu.h"

namespace towerlab::cpu {

// ReLU's backward mask, for the fused backwards too: kernels/reference/relu.h.
using reference::relu_mask;

// ReLU's forward on bfloat16 or float16 patterns (T), for the fused forwards too:
// y = x < 0 ? +0 : x is a copy or a +0, so it needs no conversion. x < 0 exactly
// for the patterns above -0 (0x8000) up to -infinity (NaNs of either sign lie above
// it, and stay): an unsigned compare the compiler vectorizes. y [n], x [n], y may
// alias x; the reference's bits.
template <typename T>
void relu_forward_16bit(T* y, const T* x, std::int64_t n) {
  constexpr std::uint16_t kNegativeInfinity = std::is_same_v<T, bfloat16> ? 0xff80 : 0xfc00;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t b = x[i].bits;
    y[i].bits = b > 0x8000u && b <= kNegativeInfinity ? std::uint16_t{0} : b;
  }
}

void relu_forward(const Tensor& y, const Tensor& x);
void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, GradWrite write);

}  // namespace towerlab::cpu
