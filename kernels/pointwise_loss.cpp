// Checks and backend dispatch for the pointwise losses (kernels/pointwise_loss.h).
#include "kernels/pointwise_loss.h"

#include <cmath>
#include <string>

#include "kernels/checks.h"
#include "kernels/cpu/pointwise_loss.h"
#include "kernels/cuda/pointwise_loss.h"

namespace towerlab {

namespace {

// "huber_loss_forward" and the like: the name every message of a call starts with.
std::string op_name(const PointwiseLossOp& op, const char* pass) {
  return std::string(pointwise_loss_name(op.kind)) + "_" + pass;
}

void check_op(const std::string& name, const PointwiseLossOp& op) {
  TL_CHECK(op.kind != PointwiseLossKind::Huber || (std::isfinite(op.delta) && op.delta > 0.0),
           InvalidArgument,
           name << ": delta is " << op.delta << "; it must be finite and positive (1 by default)");
}

}  // namespace

const char* pointwise_loss_name(PointwiseLossKind kind) {
  switch (kind) {
    case PointwiseLossKind::BinaryCrossEntropyWithLogits:
      return "binary_cross_entropy_with_logits";
    case PointwiseLossKind::L1:
      return "l1_loss";
    case PointwiseLossKind::Huber:
      return "huber_loss";
  }
  return "pointwise_loss";
}

void pointwise_loss_forward(const Tensor& loss, const Tensor& pred, const Tensor& target,
                            PointwiseLossOp op, Reduction reduction, const Stream& stream) {
  const std::string name = op_name(op, "forward");
  kernels::check_on_stream(name.c_str(), stream, {{"loss", &loss}, {"pred", &pred}});
  kernels::check_same_shape(name.c_str(), stream, {{"pred", &pred}, {"target", &target}});
  kernels::check_one_element(name.c_str(), "loss", loss);
  check_op(name, op);
  const double scale = reduction_scale(reduction, pred.numel());
  TL_DISPATCH(
      stream, cpu::pointwise_loss_forward(loss, pred, target, op, scale),
      cuda::pointwise_loss_forward(loss, pred, target, op, static_cast<float>(scale), stream));
}

void pointwise_loss_backward(const Tensor& grad_pred, const Tensor& grad_target,
                             const Tensor& grad_loss, const Tensor& pred, const Tensor& target,
                             PointwiseLossOp op, Reduction reduction, const Stream& stream) {
  const std::string name = op_name(op, "backward");
  kernels::check_same_shape(name.c_str(), stream, {{"pred", &pred}, {"target", &target}});
  kernels::check_on_stream(name.c_str(), stream, {{"pred", &pred}, {"grad_loss", &grad_loss}});
  kernels::check_one_element(name.c_str(), "grad_loss", grad_loss);
  check_op(name, op);
  if (grad_pred.defined()) {
    kernels::check_same_shape(name.c_str(), stream, {{"pred", &pred}, {"grad_pred", &grad_pred}});
  }
  if (grad_target.defined()) {
    kernels::check_same_shape(name.c_str(), stream,
                              {{"target", &target}, {"grad_target", &grad_target}});
  }
  if (pred.numel() == 0 || (!grad_pred.defined() && !grad_target.defined())) return;
  const double scale = reduction_scale(reduction, pred.numel());
  TL_DISPATCH(
      stream,
      cpu::pointwise_loss_backward(grad_pred, grad_target, grad_loss, pred, target, op, scale),
      cuda::pointwise_loss_backward(grad_pred, grad_target, grad_loss, pred, target, op,
                                    static_cast<float>(scale), stream));
}

}  // namespace towerlab
