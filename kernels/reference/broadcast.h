// The plain reference of broadcasting add, sub and mul and of sum_to_shape (contracts
// in kernels/broadcast.h). The CPU backend runs it on each thread's range of
// outputs (kernels/cpu/broadcast.cpp), and the CUDA kernels are tested against it,
// bit for bit. T is float or double. Shapes are any rank; each operand's shape is
// aligned with the output's (leading 1s) here.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "kernels/broadcast.h"
#include "kernels/grad_write.h"

namespace towerlab::reference {

// out[i] = a[i_a] op b[i_b] for the flat indices i in [first, last) of out, whose
// shape is the broadcast of a's and b's; out [out_shape], a [a_shape], b [b_shape].
template <typename T>
void broadcast_binary(T* out, const Shape& out_shape, const T* a, const Shape& a_shape, const T* b,
                      const Shape& b_shape, BroadcastOp op, std::int64_t first, std::int64_t last);

// out[o] (+)= the sum in double of x over the values that reduce to o, in row-major
// order of x's index, for the flat indices o in [first, last) of out; out
// [out_shape] broadcasts to x [x_shape].
template <typename T>
void sum_to_shape(T* out, const Shape& out_shape, const T* x, const Shape& x_shape,
                  std::int64_t first, std::int64_t last, GradWrite write);

}  // namespace towerlab::reference
