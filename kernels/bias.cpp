// Checks and backend dispatch for bias add (kernels/bias.h).
#include "kernels/bias.h"

#include "kernels/checks.h"
#include "kernels/cpu/bias.h"
#include "kernels/cuda/bias.h"
#include "kernels/relu.h"

namespace towerlab {

namespace {

struct Dims {
  std::int64_t N, C, S;
};

// `t` is [N,C,...] of rank >= 2 and bias-like `b` is [C], of t's dtype, or float32
// when t is 16-bit.
Dims dims_of(const char* op, const char* t_name, const Tensor& t, const char* b_name,
             const Tensor& b, const Stream& stream) {
  kernels::check_placed(op, stream, {{t_name, &t}});
  kernels::check_placed(op, stream, {{b_name, &b}});
  const DType b_dtype = is_16bit(t.dtype()) ? DType::Float32 : t.dtype();
  TL_CHECK(b.dtype() == b_dtype, ShapeError,
           op << ": " << b_name << " is " << b.describe() << " but " << t_name << " is "
              << t.describe() << ", whose " << b_name << " is " << dtype_name(b_dtype)
              << (is_16bit(t.dtype()) ? " (a 16-bit tensor's bias stays float32)" : ""));
  TL_CHECK(t.dim() >= 2, ShapeError,
           op << ": " << t_name << " must be [N,C] or [N,C,H,W], got " << t.describe());
  const std::int64_t C = t.size(1);
  TL_CHECK(b.dim() == 1 && b.size(0) == C, ShapeError,
           op << ": " << b_name << " is " << b.describe() << " but " << t_name << " "
              << t.describe() << " has " << C << " channels (expected [" << C << "])");
  const std::int64_t N = t.size(0);
  const std::int64_t S = N * C == 0 ? 0 : t.numel() / (N * C);
  return {N, C, S};
}

}  // namespace

void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, const Stream& stream) {
  const char* op = "bias_add_forward";
  kernels::check_same_shape_any_dtype(op, stream, {{"x", &x}, {"y", &y}});
  const Dims d = dims_of(op, "x", x, "bias", bias, stream);
  if (x.numel() == 0) return;
  TL_DISPATCH(stream, cpu::bias_add_forward(y, x, bias, d.N, d.C, d.S),
              cuda::bias_add_forward(y, x, bias, d.N, d.C, d.S, stream));
}

void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, const Stream& stream) {
  const Dims d = dims_of("bias_add_backward", "grad_y", grad_y, "grad_bias", grad_bias, stream);
  if (grad_y.numel() == 0) return;  // adds nothing
  TL_DISPATCH(stream, cpu::bias_add_backward(grad_bias, grad_y, d.N, d.C, d.S),
              cuda::bias_add_backward(grad_bias, grad_y, d.N, d.C, d.S, stream));
}

void bias_add_relu_forward(const Tensor& y, const Tensor& x, const Tensor& bias,
                           const Stream& stream) {
  const char* op = "bias_add_relu_forward";
  kernels::check_same_shape_any_dtype(op, stream, {{"x", &x}, {"y", &y}});
  const Dims d = dims_of(op, "x", x, "bias", bias, stream);
  if (x.numel() == 0) return;
  TL_DISPATCH(stream, cpu::bias_add_relu_forward(y, x, bias, d.N, d.C, d.S),
              cuda::bias_add_relu_forward(y, x, bias, d.N, d.C, d.S, stream));
}

void bias_add_relu_backward(const Tensor& grad_x, const Tensor& grad_bias, const Tensor& grad_y,
                            const Tensor& y, const Stream& stream) {
  const char* op = "bias_add_relu_backward";
  kernels::check_same_shape_any_dtype(op, stream, {{"grad_y", &grad_y}, {"y", &y}});
  if (grad_x.defined()) {
    kernels::check_same_shape_any_dtype(op, stream, {{"grad_y", &grad_y}, {"grad_x", &grad_x}});
  }
  if (!grad_bias.defined()) {  // only grad_x: the ReLU's own backward
    if (grad_x.defined()) relu_backward(grad_x, grad_y, y, stream);
    return;
  }
  const Dims d = dims_of(op, "grad_y", grad_y, "grad_bias", grad_bias, stream);
  if (grad_y.numel() == 0) return;  // adds nothing
  TL_DISPATCH(stream, cpu::bias_add_relu_backward(grad_x, grad_bias, grad_y, y, d.N, d.C, d.S),
              cuda::bias_add_relu_backward(grad_x, grad_bias, grad_y, y, d.N, d.C, d.S, stream));
}

}  // namespace towerlab
