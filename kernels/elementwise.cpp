// Checks and backend dispatch for the elementwise family (kernels/elementwise.h).
#include "kernels/elementwise.h"

#include "kernels/cast.h"
#include "kernels/checks.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"

namespace towerlab {

namespace {

void binary(const char* name, BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
            const Stream& stream) {
  kernels::check_same_shape(name, stream, {{"out", &out}, {"a", &a}, {"b", &b}});
  if (out.numel() == 0) return;
  TL_DISPATCH(stream, cpu::binary(op, out, a, b), cuda::binary(op, out, a, b, stream));
}

}  // namespace

void fill(const Tensor& x, double value, const Stream& stream) {
  kernels::check_on_stream("fill", stream, {{"x", &x}});
  if (x.numel() == 0) return;
  TL_DISPATCH(stream, cpu::fill(x, value), cuda::fill(x, static_cast<float>(value), stream));
}

void copy(const Tensor& dst, const Tensor& src, const Stream& stream) {
  TL_CHECK(dst.defined() && src.defined(), InvalidArgument, "copy: undefined tensor");
  TL_CHECK(dst.device() == stream.device() && src.device() == stream.device(), InvalidArgument,
           "copy: " << src.describe() << " -> " << dst.describe() << " on a stream of "
                    << stream.device().str() << " (copy_tensor() copies between devices)");
  TL_CHECK(dst.numel() == src.numel(), ShapeError,
           "copy: src " << src.describe() << " has " << src.numel() << " elements but dst "
                        << dst.describe() << " has " << dst.numel());
  if (dst.numel() == 0) return;
  if (is_16bit(dst.dtype()) || is_16bit(src.dtype())) {
    cast(dst, src, stream);  // the 16-bit dtypes convert by cast's rounding rule
    return;
  }
  TL_DISPATCH(stream, cpu::copy(dst, src), cuda::copy(dst, src, stream));
}

void add(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream) {
  binary("add", BinaryOp::Add, out, a, b, stream);
}

void sub(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream) {
  binary("sub", BinaryOp::Sub, out, a, b, stream);
}

void mul(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream) {
  binary("mul", BinaryOp::Mul, out, a, b, stream);
}

void scale(const Tensor& out, const Tensor& x, double alpha, const Stream& stream) {
  kernels::check_same_shape("scale", stream, {{"out", &out}, {"x", &x}});
  if (out.numel() == 0) return;
  TL_DISPATCH(stream, cpu::scale(out, x, alpha),
              cuda::scale(out, x, static_cast<float>(alpha), stream));
}

void axpy(const Tensor& y, double alpha, const Tensor& x, const Stream& stream) {
  kernels::check_same_shape("axpy", stream, {{"y", &y}, {"x", &x}});
  if (y.numel() == 0) return;
  TL_DISPATCH(stream, cpu::axpy(y, alpha, x), cuda::axpy(y, static_cast<float>(alpha), x, stream));
}

void axpy_scalar(const Tensor& y, double alpha, const Tensor& s, const Stream& stream) {
  kernels::check_on_stream("axpy_scalar", stream, {{"y", &y}, {"s", &s}});
  TL_CHECK(s.numel() == 1, ShapeError,
           "axpy_scalar: s must have one element, got " << s.describe());
  if (y.numel() == 0) return;
  TL_DISPATCH(stream, cpu::axpy_scalar(y, alpha, s),
              cuda::axpy_scalar(y, static_cast<float>(alpha), s, stream));
}

}  // namespace towerlab
