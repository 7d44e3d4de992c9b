// Elementwise kernels: fill, copy, add, sub, mul, scale, axpy.
//
// Contracts (n = number of elements; every tensor on the stream's device):
//   fill(x, value)          x[i] = value
//   copy(dst, src)          dst[i] = src[i]; same element count, dtypes may differ
//                           (float32 <-> float64 on the CPU; bfloat16 and float16
//                           on every device, converted by cast()); shapes need not match
//   add(out, a, b)          out[i] = a[i] + b[i]
//   sub(out, a, b)          out[i] = a[i] - b[i]
//   mul(out, a, b)          out[i] = a[i] * b[i]
//   scale(out, x, alpha)    out[i] = alpha * x[i]
//   axpy(y, alpha, x)       y[i] += alpha * x[i]      (accumulates into y)
//   axpy_scalar(y, alpha, s) y[i] += alpha * s[0]     (s has one element, read on the
//                           device: broadcasts a reduction's gradient without a host trip)
// add/sub/mul/scale need equal shapes and dtypes; `out` may alias any input.
// Only copy takes bfloat16 and float16; the others throw NotSupported for them.
// Empty tensors are a no-op. All run asynchronously on `stream`.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

void fill(const Tensor& x, double value, const Stream& stream);
void copy(const Tensor& dst, const Tensor& src, const Stream& stream);
void add(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream);
void sub(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream);
void mul(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream);
void scale(const Tensor& out, const Tensor& x, double alpha, const Stream& stream);
void axpy(const Tensor& y, double alpha, const Tensor& x, const Stream& stream);
void axpy_scalar(const Tensor& y, double alpha, const Tensor& s, const Stream& stream);

}  // namespace towerlab
