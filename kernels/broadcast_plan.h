// The index spaces the broadcasting kernels walk, described as data once for both
// fast backends (kernels/cpu/broadcast.cpp, kernels/cuda/broadcast.cu); the
// reference (kernels/reference/broadcast.h) walks the shapes as they are.
// Internal: not installed, not included by towerlab.h.
//
// A StridedDims is a row-major index space (the last dimension fastest) and each
// of up to two operands' stride in each dimension (0 where it is repeated). The
// builders drop the dimensions of size 1 and merge neighbours that every operand
// walks contiguously ([N,C,H,W] plus [C,1,1] is three dimensions, [N,D] plus [D]
// two): merging keeps the walk's row-major order, so a sum over a merged space
// adds in the reference's order.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "kernels/broadcast.h"

namespace towerlab::kernels {

struct StridedDims {
  int rank = 0;
  std::int64_t size[kMaxBroadcastRank];
  std::int64_t stride[2][kMaxBroadcastRank];
};

// out = a op b: out's space, a's strides (operand 0) and b's (operand 1).
StridedDims binary_dims(const Shape& out, const Shape& a, const Shape& b);

// sum_to_shape(out, x): `kept` is out's space with x's strides (operand 0), so that
// out's flat index o gives the base offset of its sum; `reduced` is the space each
// sum walks from there, with x's strides (operand 0), and `count` its size (0 when
// x is empty).
struct SumDims {
  StridedDims kept, reduced;
  std::int64_t count = 0;
};
SumDims sum_dims(const Shape& out, const Shape& x);

}  // namespace towerlab::kernels
