// A residual block's end, y = relu(a + b), forward and backward in one op: the sum of
// the block's body a and its shortcut b, then the ReLU (kernels/relu.h), in one pass
// each way. The unfused composition, add() then relu_forward, and in the backward
// relu_backward into the sum's gradient then that gradient added into a's and b's,
// makes two passes and a gradient tensor of the sum; the values here are the same,
// bit for bit on the CPU (the same float operations in the same order):
//
//   add_relu_forward(y, a, b)   y[i] = max(a[i] + b[i], 0)      (ASSIGNED)
//                               the sum rounded once to the dtype, then ReLU's NaN
//                               rule (a NaN stays a NaN); y may alias a or b
//   add_relu_backward(args)     with g[i] = relu_mask(grad_y[i], y[i]) (grad_y where
//                               y > 0, else +0; kernels/reference/relu.h), y the
//                               forward's output:
//                               grad_a[i] += g[i], grad_b[i] += g[i]   (ACCUMULATED;
//                               = for the one whose write is GradWrite::Assign,
//                               which never reads it: kernels/grad_write.h)
// a, b, y, grad_y, grad_a and grad_b have one shape (no broadcasting: a residual's
// branches agree) and one dtype: float32, bfloat16 or float16 on every device,
// float64 on the CPU. As ReLU's (kernels/relu.h), a 16-bit tensor is read as its
// exact float32 widening and every value written is rounded once to nearest even:
// a 16-bit y is the float32 sum's ReLU rounded once (the float32 op's y cast), an
// accumulated 16-bit gradient grad + g in float32 rounded once. A 16-bit y beside
// float32 grad_y, grad_a and grad_b runs on the CPU (NotSupported on cuda): y is read
// as its exact widening, the float32 call's bits on the widened y without its copy.
// (ag::add_relu on 16-bit a and b writes a 16-bit y and runs that float32 backward,
// the precision policy's gradients being float32: on the CPU beside the 16-bit y, on
// cuda on the widened y.) grad_a or grad_b may be
// undefined (that operand needs no gradient). grad_a and grad_b may be one tensor
// (a and b one value, ag::add_relu(x, x)): grad_a is written first, then grad_b
// added, element by element, as the tape's two contributions would be. Neither
// aliases grad_y or y.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

void add_relu_forward(const Tensor& y, const Tensor& a, const Tensor& b, const Stream& stream);

struct AddReluBackward {
  Tensor grad_a, grad_b;  // [n] each, or undefined: not computed
  Tensor grad_y, y;       // [n]: the output's gradient and the forward's output
  GradWrite grad_a_write = GradWrite::Accumulate;
  GradWrite grad_b_write = GradWrite::Accumulate;
};
void add_relu_backward(const AddReluBackward& args, const Stream& stream);

}  // namespace towerlab
