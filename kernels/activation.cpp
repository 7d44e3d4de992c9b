// Checks and backend dispatch for the activations (kernels/activation.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/activation.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/activation.h"
#include "kernels/cuda/activation.h"

namespace towerlab {

namespace {

void check_parameter(const char* op, const ActivationOp& act) {
  TL_CHECK(act.kind != ActivationKind::LeakyReLU || std::isfinite(act.negative_slope),
           InvalidArgument,
           op << ": leaky_relu's negative_slope is " << act.negative_slope
              << "; it must be finite (0.01 by default)");
}

}  // namespace

const char* activation_name(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::Sigmoid:
      return "sigmoid";
    case ActivationKind::Tanh:
      return "tanh";
    case ActivationKind::Gelu:
      return "gelu";
    case ActivationKind::GeluTanh:
      return "gelu_tanh";
    case ActivationKind::SiLU:
      return "silu";
    case ActivationKind::LeakyReLU:
      return "leaky_relu";
  }
  return "activation";
}

void activation_forward(const Tensor& y, const Tensor& x, const ActivationOp& act,
                        const Stream& stream) {
  kernels::check_same_shape_any_dtype("activation_forward", stream, {{"y", &y}, {"x", &x}});
  check_parameter("activation_forward", act);
  if (y.numel() == 0) return;
  TL_DISPATCH(stream, cpu::activation_forward(y, x, act),
              cuda::activation_forward(y, x, act, stream));
}

void activation_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const ActivationOp& act, const Stream& stream, GradWrite write) {
  kernels::check_same_shape_any_dtype("activation_backward", stream,
                                      {{"grad_x", &grad_x}, {"grad_y", &grad_y}, {"x", &x}});
  check_parameter("activation_backward", act);
  if (grad_x.numel() == 0) return;
  TL_DISPATCH(stream, cpu::activation_backward(grad_x, grad_y, x, act, write),
              cuda::activation_backward(grad_x, grad_y, x, act, stream, write));
}

}  // namespace towerlab
