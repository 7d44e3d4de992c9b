// The plain reference of the fused residual add + ReLU (contracts in
// kernels/add_relu.h), on n values: the specification the CPU backend runs on each
// thread's range and the CUDA kernels are tested against. It is add() followed by
// ReLU's reference, one element at a time. T is float, double, bfloat16 or float16,
// computed in math_t<T> (kernels/reference/math_type.h): a 16-bit sum is float32's,
// rounded once as it is stored, and so is a 16-bit gradient's add.
#pragma once

#include <cstdint>

#include "kernels/grad_write.h"
#include "kernels/reference/math_type.h"

namespace towerlab::reference {

// y[i] = max(a[i] + b[i], 0), a NaN staying a NaN; y, a, b [n]; y may alias a or b.
template <typename T>
void add_relu_forward(T* y, const T* a, const T* b, std::int64_t n);

// g[i] = relu_mask(grad_y[i], y[i]); grad_a[i] += g[i], then grad_b[i] += g[i] (= with
// GradWrite::Assign); grad_a, grad_b, grad_y, y [n]; grad_a or grad_b null: not
// computed; grad_a == grad_b allowed (written first, then added to).
template <typename T>
void add_relu_backward(T* grad_a, GradWrite grad_a_write, T* grad_b, GradWrite grad_b_write,
                       const T* grad_y, const T* y, std::int64_t n);

}  // namespace towerlab::reference
