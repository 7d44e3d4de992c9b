// Checks and backend dispatch for layer normalization (kernels/layer_norm.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/layer_norm.h"

#include <cmath>
#include <cstdint>

#include "kernels/checks.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cuda/layer_norm.h"

namespace towerlab {

namespace {

// R: the product of x's dimensions but the last (computed from the shape, so a
// last dimension of 0 still gives its rows).
std::int64_t rows_of(const Tensor& x) {
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < x.shape().size(); ++i) rows *= x.shape()[i];
  return rows;
}

// A per-row ([R]) or per-column ([D]) tensor: defined when required, on the
// stream, of x's dtype, of the expected shape.
void check_vector(const char* op, const Stream& stream, const char* name, const Tensor& t,
                  const Tensor& x, bool per_row, bool required) {
  if (!t.defined() && !required) return;
  kernels::check_on_stream(op, stream, {{"x", &x}, {name, &t}});
  const std::int64_t expected = per_row ? rows_of(x) : x.shape().back();
  TL_CHECK(t.shape() == Shape{expected}, ShapeError,
           op << ": " << name << " is " << t.describe() << " but x " << x.describe() << " has "
              << (per_row ? "R = " : "D = ") << expected << (per_row ? " rows" : "")
              << " (expected [" << expected << "])");
}

void check_x(const char* op, const Tensor& x) {
  TL_CHECK(x.defined(), InvalidArgument, op << ": x is undefined");
  TL_CHECK(x.dim() >= 1, ShapeError,
           op << ": x is " << x.describe() << "; it needs a last dimension to normalize over");
}

}  // namespace

void layer_norm_forward(const LayerNormForward& args, const Stream& stream) {
  const char* op = "layer_norm_forward";
  check_x(op, args.x);
  kernels::check_same_shape(op, stream, {{"x", &args.x}, {"y", &args.y}});
  check_vector(op, stream, "mean", args.mean, args.x, true, true);
  check_vector(op, stream, "rstd", args.rstd, args.x, true, true);
  check_vector(op, stream, "weight", args.weight, args.x, false, false);
  check_vector(op, stream, "bias", args.bias, args.x, false, false);
  TL_CHECK(std::isfinite(args.eps) && args.eps >= 0, InvalidArgument,
           op << ": eps is " << args.eps << "; it must be finite and >= 0 (1e-5 by default)");
  if (args.x.numel() == 0) return;
  TL_DISPATCH(stream, cpu::layer_norm_forward(args), cuda::layer_norm_forward(args, stream));
}

void layer_norm_backward(const LayerNormBackward& args, const Stream& stream) {
  const char* op = "layer_norm_backward";
  check_x(op, args.x);
  kernels::check_same_shape(op, stream, {{"x", &args.x}, {"grad_y", &args.grad_y}});
  if (args.grad_x.defined()) {
    kernels::check_same_shape(op, stream, {{"x", &args.x}, {"grad_x", &args.grad_x}});
  }
  check_vector(op, stream, "mean", args.mean, args.x, true, true);
  check_vector(op, stream, "rstd", args.rstd, args.x, true, true);
  check_vector(op, stream, "weight", args.weight, args.x, false, false);
  check_vector(op, stream, "grad_weight", args.grad_weight, args.x, false, false);
  check_vector(op, stream, "grad_bias", args.grad_bias, args.x, false, false);
  if (args.x.numel() == 0) return;
  TL_DISPATCH(stream, cpu::layer_norm_backward(args), cuda::layer_norm_backward(args, stream));
}

}  // namespace towerlab
