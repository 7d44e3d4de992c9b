// The CPU elementwise entry points, and the operation code both backends receive
// (internal: not installed, not in towerlab.h). Public contracts and dispatch in
// kernels/elementwise.h.
#pragma once

#include "engine/tensor.h"
#include "kernels/elementwise.h"

namespace towerlab {

enum class BinaryOp { Add, Sub, Mul };

namespace cpu {
// Arguments already checked by the functions of kernels/elementwise.h.
void fill(const Tensor& x, double value);
void copy(const Tensor& dst, const Tensor& src);
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void scale(const Tensor& out, const Tensor& x, double alpha);
void axpy(const Tensor& y, double alpha, const Tensor& x);
void axpy_scalar(const Tensor& y, double alpha, const Tensor& s);
}  // namespace cpu

}  // namespace towerlab
