// Add, subtract and multiply with NumPy broadcasting, and the sum that takes a
// gradient back to an operand's shape.
//
// Broadcasting (NumPy's rules): two shapes are aligned at their last dimensions,
// the shorter one taken with leading 1s; in each dimension the two sizes are equal
// or one of them is 1, and the result has the larger (0 against 1 gives 0). So
// [N,1,W] and [1,C,1] broadcast to [N,C,W], [D] and [N,D] to [N,D], [1] and any
// shape to that shape. A dimension of size 1 that meets a larger one is repeated:
// its index is taken as 0.
//
//   broadcast_shape(op, a, b)           the broadcast of two shapes, or ShapeError
//                                       naming the op and both shapes: "add: shapes
//                                       [2,3] and [4] do not broadcast (dimension -1:
//                                       3 against 4)"
//   broadcast_add(out, a, b)            out[i] = a[i_a] + b[i_b]
//   broadcast_sub(out, a, b)            out[i] = a[i_a] - b[i_b]
//   broadcast_mul(out, a, b)            out[i] = a[i_a] * b[i_b]
//       out has the broadcast shape of a and b; i_a is out's index i with a's
//       repeated dimensions at 0 (likewise i_b). Each value is one operation in the
//       dtype, so equal shapes give add()'s, sub()'s and mul()'s bits (kernels/elementwise.h),
//       which they call. out may alias a or b only where that operand has out's shape.
//   sum_to_shape(out, x, write)         out[o] += sum over x's indices i that reduce
//                                       to o of x[i]
//       out's shape broadcasts to x's (out is x's shape with some dimensions 1, or
//       fewer leading dimensions): out[o] sums x over the dimensions where out is
//       repeated, the gradient of a broadcast operand. Accumulated into out, or
//       assigned when asked (kernels/grad_write.h). The sum of each out value is
//       one running sum in double over its x values in row-major order of x's
//       index (the last dimension fastest), rounded once: the reference's order,
//       which the CPU and CUDA keep, so all three give the same bits run after run.
//       Neither aliases the other.
//
// Cost: CUDA's sum_to_shape gives each out value one thread, which runs its sum
// alone. That reads x once, coalesced where out's last dimension is x's (a bias's
// gradient); a small out over a large x (a [1] operand) runs on few threads.
//
// Every tensor has one dtype (float32; float64 on the CPU) on the stream's device;
// ranks up to kMaxBroadcastRank (8). bfloat16 / float16 give check_dtype_supported's
// NotSupported; a wrong out shape, ShapeError naming the op and the shapes.
#pragma once

#include <string>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

inline constexpr int kMaxBroadcastRank = 8;

// Which operation broadcast_binary applies (the entry points below name it).
enum class BroadcastOp { Add, Mul, Sub };

Shape broadcast_shape(const char* op, const Shape& a, const Shape& b);
// Why two shapes do not broadcast ("dimension -1: 3 against 4"), "" when they do:
// for messages that name the operands otherwise (ag::add names its Vars).
std::string broadcast_conflict(const Shape& a, const Shape& b);

void broadcast_add(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream);
void broadcast_sub(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream);
void broadcast_mul(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream);

void sum_to_shape(const Tensor& out, const Tensor& x, const Stream& stream,
                  GradWrite write = GradWrite::Accumulate);

}  // namespace towerlab
