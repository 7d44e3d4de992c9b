// The plain reference of the activations (contracts in kernels/activation.h), on
// n values, in double whatever T is. The CPU backend runs it on each thread's
// range in float64 and 16 bits (kernels/cpu/activation.cpp); the CPU's float32
// lanes and the CUDA kernels are tested against it.
// T is float, double, bfloat16 or float16: every value is computed in double and
// rounded once to T (engine/half.h rounds double to a 16-bit type directly).
#pragma once

#include <cstdint>

#include "kernels/activation.h"
#include "kernels/grad_write.h"

namespace towerlab::reference {

// f(x) and f'(x) of kernels/activation.h's table, with its rules at NaN and
// +-inf: the per-element functions the loops below apply.
double activation_value(const ActivationOp& act, double x);
double activation_derivative(const ActivationOp& act, double x);

// y[i] = f(x[i]); y [n], x [n], y may alias x.
template <typename T>
void activation_forward(T* y, const T* x, std::int64_t n, const ActivationOp& act);

// grad_x[i] += grad_y[i] * f'(x[i]) (= with GradWrite::Assign); grad_x, grad_y,
// x [n].
template <typename T>
void activation_backward(T* grad_x, const T* grad_y, const T* x, std::int64_t n,
                         const ActivationOp& act, GradWrite write);

}  // namespace towerlab::reference
