// Checks and backend dispatch for 2-D pooling (kernels/pool2d.h).
#include "kernels/pool2d.h"

#include <sstream>

#include "kernels/checks.h"
#include "kernels/cpu/pool2d.h"
#include "kernels/cuda/pool2d.h"

namespace towerlab {

namespace {

std::string describe(const Pool2dParams& p) {
  std::ostringstream os;
  os << "a " << p.kernel_h << "x" << p.kernel_w << " window with stride " << p.stride_h << "x"
     << p.stride_w << " and padding " << p.pad_h << "x" << p.pad_w;
  return os.str();
}

Shape output_shape(const char* op, const Shape& x, const Pool2dParams& p) {
  TL_CHECK(p.kernel_h >= 1 && p.kernel_w >= 1 && p.stride_h >= 1 && p.stride_w >= 1,
           InvalidArgument, op << ": window and stride must be at least 1, got " << describe(p));
  TL_CHECK(p.pad_h >= 0 && p.pad_w >= 0 && 2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w,
           InvalidArgument,
           op << ": padding must be between 0 and half the window, got " << describe(p));
  TL_CHECK(x.size() == 4, ShapeError, op << ": x must be [N,C,H,W], got " << to_string(x));
  const std::int64_t H = x[2] + 2 * p.pad_h, W = x[3] + 2 * p.pad_w;
  TL_CHECK(H >= p.kernel_h && W >= p.kernel_w, ShapeError,
           op << ": " << describe(p) << " does not fit in the " << x[2] << "x" << x[3]
              << " plane of x " << to_string(x));
  return {x[0], x[1], (H - p.kernel_h) / p.stride_h + 1, (W - p.kernel_w) / p.stride_w + 1};
}

// The input and output tensors fit the window, in one dtype the device pools in
// (float64 on the CPU only); returns false when there is no work.
bool check_pool(const char* op, const Stream& stream, const char* in_name, const Tensor& in,
                const char* out_name, const Tensor& out, const Pool2dParams& p) {
  kernels::check_placed(op, stream, {{in_name, &in}, {out_name, &out}});
  TL_CHECK(stream.device().is_cpu() || in.dtype() != DType::Float64, NotSupported,
           op << ": " << in_name << " is " << in.describe() << "; float64 exists on the CPU only");
  const Shape expected = output_shape(op, in.shape(), p);
  TL_CHECK(out.shape() == expected, ShapeError,
           op << ": " << out_name << " is " << out.describe() << " but " << describe(p) << " on "
              << in_name << " " << in.describe() << " gives " << to_string(expected));
  return in.numel() > 0;
}

// argmax has y's shape and the argmax dtype of y's (pool2d_argmax_dtype), and every
// position in x's plane is exact in that dtype.
void check_argmax(const char* op, const Stream& stream, const Tensor& argmax, const char* y_name,
                  const Tensor& y, std::int64_t plane) {
  kernels::check_placed(op, stream, {{"argmax", &argmax}});
  const DType expected = pool2d_argmax_dtype(y.dtype());
  TL_CHECK(argmax.dtype() == expected, ShapeError,
           op << ": argmax is " << argmax.describe() << " but " << y_name << " is " << y.describe()
              << ", whose argmax is " << dtype_name(expected)
              << (is_16bit(y.dtype()) ? " (a 16-bit tensor's argmax stays float32: bfloat16 "
                                        "holds positions exactly only up to 256)"
                                      : ""));
  TL_CHECK(
      argmax.shape() == y.shape(), ShapeError,
      op << ": argmax is " << argmax.describe() << " but " << y_name << " is " << y.describe());
  constexpr std::int64_t kExactFloat32 = std::int64_t{1} << 24;
  TL_CHECK(argmax.dtype() != DType::Float32 || plane <= kExactFloat32, ShapeError,
           op << ": a plane of " << plane << " values has positions that float32 argmax "
              << argmax.describe() << " cannot hold exactly (at most 2^24 = " << kExactFloat32
              << ")");
}

}  // namespace

Shape pool2d_output_shape(const Shape& x, const Pool2dParams& params, const char* op) {
  return output_shape(op, x, params);
}

DType pool2d_argmax_dtype(DType x) {
  return is_16bit(x) ? DType::Float32 : x;
}

void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream) {
  if (!check_pool("max_pool2d_forward", stream, "x", x, "y", y, params)) return;
  TL_DISPATCH(stream, cpu::max_pool2d_forward(y, x, params),
              cuda::max_pool2d_forward(y, x, params, stream));
}

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const Pool2dParams& params, const Stream& stream) {
  const char* op = "max_pool2d_backward";
  kernels::check_same_shape_any_dtype(op, stream, {{"x", &x}, {"grad_x", &grad_x}});
  if (!check_pool(op, stream, "x", x, "grad_y", grad_y, params)) return;
  TL_DISPATCH(stream, cpu::max_pool2d_backward(grad_x, grad_y, x, params),
              cuda::max_pool2d_backward(grad_x, grad_y, x, params, stream));
}

void max_pool2d_forward_with_argmax(const Tensor& y, const Tensor& argmax, const Tensor& x,
                                    const Pool2dParams& params, const Stream& stream) {
  const char* op = "max_pool2d_forward_with_argmax";
  if (!check_pool(op, stream, "x", x, "y", y, params)) return;
  check_argmax(op, stream, argmax, "y", y, x.size(2) * x.size(3));
  TL_DISPATCH(stream, cpu::max_pool2d_forward_with_argmax(y, argmax, x, params),
              cuda::max_pool2d_forward_with_argmax(y, argmax, x, params, stream));
}

void max_pool2d_backward_from_argmax(const Tensor& grad_x, const Tensor& grad_y,
                                     const Tensor& argmax, const Pool2dParams& params,
                                     const Stream& stream, GradWrite write) {
  const char* op = "max_pool2d_backward_from_argmax";
  if (!check_pool(op, stream, "grad_x", grad_x, "grad_y", grad_y, params)) return;
  check_argmax(op, stream, argmax, "grad_y", grad_y, grad_x.size(2) * grad_x.size(3));
  TL_DISPATCH(stream, cpu::max_pool2d_backward_from_argmax(grad_x, grad_y, argmax, params, write),
              cuda::max_pool2d_backward_from_argmax(grad_x, grad_y, argmax, params, stream, write));
}

void avg_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream) {
  if (!check_pool("avg_pool2d_forward", stream, "x", x, "y", y, params)) return;
  TL_DISPATCH(stream, cpu::avg_pool2d_forward(y, x, params),
              cuda::avg_pool2d_forward(y, x, params, stream));
}

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Pool2dParams& params,
                         const Stream& stream) {
  if (!check_pool("avg_pool2d_backward", stream, "grad_x", grad_x, "grad_y", grad_y, params))
    return;
  TL_DISPATCH(stream, cpu::avg_pool2d_backward(grad_x, grad_y, params),
              cuda::avg_pool2d_backward(grad_x, grad_y, params, stream));
}

}  // namespace towerlab
