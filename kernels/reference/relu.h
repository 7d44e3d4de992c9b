// The plain reference of ReLU (contracts in kernels/relu.h), on n values. The CPU
// backend runs it on each thread's range (kernels/cpu/relu.cpp), and the CUDA
// kernels and the fused ops (bias add, batch norm) are tested against it. T is
// float, double, bfloat16 or float16; a 16-bit T is computed on in float32 and
// rounded once when stored (kernels/reference/math_type.h).
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "kernels/grad_write.h"
#include "kernels/reference/math_type.h"

namespace towerlab::reference {

// y[i] = max(x[i], 0), a NaN staying a NaN; y [n], x [n], y may alias x. Exact in
// every dtype (y is x or +0).
template <typename T>
void relu_forward(T* y, const T* x, std::int64_t n);

// grad_x[i] += relu_mask(grad_y[i], y[i]) (= with GradWrite::Assign), y the
// forward's output; grad_x, grad_y, y [n]. A 16-bit grad_x is added to in float32
// and rounded once; assigned, it is grad_y's value or +0, exactly.
template <typename T>
void relu_backward(T* grad_x, const T* grad_y, const T* y, std::int64_t n, GradWrite write);

// ReLU's backward mask: grad where y > 0, else +0, for every backward that applies
// it (ReLU's own and the fused ones). Bit arithmetic, not a branch or a select the
// compiler may turn into one (T float or double; 16-bit values are masked as
// their float32 widening): on real activations "y > 0" is a coin toss, and a
// mispredicted branch per value costs several times the whole loop. Not
// grad * (y > 0) either, which turns an infinite or NaN grad into NaN where the
// mask is 0.
template <typename T>
T relu_mask(T grad, T y) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  const Bits keep = Bits{0} - static_cast<Bits>(y > T(0));  // all ones or all zeros
  return std::bit_cast<T>(std::bit_cast<Bits>(grad) & keep);
}

}  // namespace towerlab::reference
