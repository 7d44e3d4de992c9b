// The CUDA elementwise entry points (internal: not installed, not in towerlab.h).
// Public contracts and dispatch in kernels/elementwise.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/cpu/elementwise.h"  // BinaryOp, which both backends receive

namespace towerlab::cuda {

// Arguments already checked by the functions of kernels/elementwise.h; float32.
void fill(const Tensor& x, float value, const Stream& stream);
void copy(const Tensor& dst, const Tensor& src, const Stream& stream);
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream);
void scale(const Tensor& out, const Tensor& x, float alpha, const Stream& stream);
void axpy(const Tensor& y, float alpha, const Tensor& x, const Stream& stream);
void axpy_scalar(const Tensor& y, float alpha, const Tensor& s, const Stream& stream);

}  // namespace towerlab::cuda
