// The plain reference of bias add (contracts in kernels/bias.h). The CPU backend
// runs the float64 forward on each thread's range of images (kernels/cpu/bias.cpp);
// its float32 forward (vector lanes, the same adds), its backward (four running
// sums per row) and the fused ReLU forms, which are the
// composition with kernels/reference/relu.h, are tested against it, as are the
// CUDA kernels. T is float, double, bfloat16 or float16; bias and grad_bias are
// math_t<T> (kernels/reference/math_type.h): T itself, or float32 for a 16-bit T,
// whose values are added in float32 and rounded once.
//
// Dimension letters: N batch, C channels, S the product of the trailing dimensions
// (1 for a fully connected layer's [N,C]).
#pragma once

#include <cstdint>

#include "kernels/reference/math_type.h"

namespace towerlab::reference {

// y[n,c,s] = x[n,c,s] + bias[c], ASSIGNED; y, x [N,C,S] (y may alias x), bias [C].
template <typename T>
void bias_add_forward(T* y, const T* x, const math_t<T>* bias, std::int64_t N, std::int64_t C,
                      std::int64_t S);

// grad_bias[c] += sum_{n,s} grad_y[n,c,s], ACCUMULATED: one running sum in double
// in order n, then s, added once; grad_bias [C], grad_y [N,C,S].
template <typename T>
void bias_add_backward(math_t<T>* grad_bias, const T* grad_y, std::int64_t N, std::int64_t C,
                       std::int64_t S);

}  // namespace towerlab::reference
