// Checks and backend dispatch for the losses (kernels/loss.h).
#include "kernels/loss.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/loss.h"
#include "kernels/cuda/loss.h"

namespace towerlab {

namespace {

// The value of labels[index] for a message (a one-element copy on CUDA).
double label_at(const Tensor& labels, std::int64_t index, const Stream& stream) {
  Tensor one = labels.reshape({-1}).view(index, {1});
  return labels.dtype() == DType::Float64 ? one.to_host<double>(stream)[0]
                                          : one.to_host<float>(stream)[0];
}

// A SampleError: the trainer names the row of the whole batch.
[[noreturn]] void throw_bad_label(const char* op, const Tensor& labels, std::int64_t index,
                                  std::int64_t num_classes, const Stream& stream) {
  std::ostringstream what;
  what << " = " << label_at(labels, index, stream) << " is not a class id in [0, " << num_classes
       << ")";
  throw SampleError(std::string(op) + ": labels", index, what.str(), "labels " + labels.describe());
}

// The CPU kernels index by the labels, so a bad one is refused before they run
// (host memory, no sync). CUDA's kernels poison its row instead: finding it there
// needs validate_labels and a host sync (kernels/loss.h).
void check_labels_on_cpu(const char* op, const Tensor& labels, std::int64_t num_classes,
                         const Stream& stream) {
  if (!stream.device().is_cpu()) return;
  const std::int64_t bad = cpu::first_invalid_label(labels, num_classes);
  if (bad >= 0) throw_bad_label(op, labels, bad, num_classes, stream);
}

void check_coeff(const char* op, double coeff) {
  TL_CHECK(std::isfinite(coeff), InvalidArgument, op << ": coeff must be finite, got " << coeff);
}

// logits [N,K], labels [N], K >= 1 unless N == 0.
void check_cross_entropy_inputs(const char* op, const Tensor& logits, const Tensor& labels,
                                double label_smoothing, const Stream& stream) {
  kernels::check_on_stream(op, stream, {{"logits", &logits}, {"labels", &labels}});
  TL_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, InvalidArgument,
           op << ": label_smoothing must be in [0, 1], got " << label_smoothing);
  TL_CHECK(logits.dim() == 2, ShapeError,
           op << ": logits must be [N,K] (rows, classes), got " << logits.describe());
  TL_CHECK(labels.shape() == Shape{logits.size(0)}, ShapeError,
           op << ": labels is " << labels.describe() << " but logits " << logits.describe()
              << " needs labels [" << logits.size(0) << "], one class id per row");
  TL_CHECK(logits.size(0) == 0 || logits.size(1) > 0, ShapeError,
           op << ": logits " << logits.describe() << " has no classes (K = 0)");
}

}  // namespace

void mse_forward(const Tensor& loss, const Tensor& pred, const Tensor& target, Reduction reduction,
                 const Stream& stream) {
  kernels::check_on_stream("mse_forward", stream, {{"loss", &loss}, {"pred", &pred}});
  kernels::check_same_shape("mse_forward", stream, {{"pred", &pred}, {"target", &target}});
  kernels::check_one_element("mse_forward", "loss", loss);
  const double scale = reduction_scale(reduction, pred.numel());
  TL_DISPATCH(stream, cpu::squared_error_sum(loss, pred, target, scale),
              cuda::squared_error_sum(loss, pred, target, static_cast<float>(scale), stream));
}

void mse_backward(const Tensor& grad_pred, const Tensor& grad_target, const Tensor& grad_loss,
                  const Tensor& pred, const Tensor& target, Reduction reduction,
                  const Stream& stream) {
  const char* op = "mse_backward";
  kernels::check_same_shape(op, stream, {{"pred", &pred}, {"target", &target}});
  kernels::check_on_stream(op, stream, {{"pred", &pred}, {"grad_loss", &grad_loss}});
  kernels::check_one_element(op, "grad_loss", grad_loss);
  if (grad_pred.defined()) {
    kernels::check_same_shape(op, stream, {{"pred", &pred}, {"grad_pred", &grad_pred}});
  }
  if (grad_target.defined()) {
    kernels::check_same_shape(op, stream, {{"target", &target}, {"grad_target", &grad_target}});
  }
  if (pred.numel() == 0 || (!grad_pred.defined() && !grad_target.defined())) return;
  const double scale = reduction_scale(reduction, pred.numel());
  TL_DISPATCH(stream, cpu::mse_backward(grad_pred, grad_target, grad_loss, pred, target, scale),
              cuda::mse_backward(grad_pred, grad_target, grad_loss, pred, target,
                                 static_cast<float>(scale), stream));
}

void softmax_cross_entropy_forward(const Tensor& loss, const Tensor& probs,
                                   const Tensor& predictions, const Tensor& logits,
                                   const Tensor& labels, Reduction reduction, const Stream& stream,
                                   double label_smoothing) {
  const char* op = "softmax_cross_entropy_forward";
  check_cross_entropy_inputs(op, logits, labels, label_smoothing, stream);
  kernels::check_on_stream(op, stream, {{"logits", &logits}, {"loss", &loss}});
  kernels::check_one_element(op, "loss", loss);
  if (probs.defined()) {
    kernels::check_same_shape(op, stream, {{"logits", &logits}, {"probs", &probs}});
  }
  if (predictions.defined()) {
    kernels::check_same_shape(op, stream, {{"labels", &labels}, {"predictions", &predictions}});
  }
  const std::int64_t rows = logits.size(0);
  const double scale = reduction_scale(reduction, rows);
  check_labels_on_cpu(op, labels, logits.size(1), stream);
  TL_DISPATCH(stream,
              cpu::softmax_cross_entropy_forward(loss, probs, predictions, logits, labels, scale,
                                                 label_smoothing),
              cuda::softmax_cross_entropy_forward(loss, probs, predictions, logits, labels,
                                                  static_cast<float>(scale),
                                                  static_cast<float>(label_smoothing), stream));
}

void softmax_cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                    const Tensor& logits, const Tensor& labels, Reduction reduction,
                                    const Stream& stream, double label_smoothing) {
  const char* op = "softmax_cross_entropy_backward";
  check_cross_entropy_inputs(op, logits, labels, label_smoothing, stream);
  kernels::check_on_stream(op, stream, {{"logits", &logits}, {"grad_loss", &grad_loss}});
  kernels::check_one_element(op, "grad_loss", grad_loss);
  if (!grad_logits.defined()) return;
  kernels::check_same_shape(op, stream, {{"logits", &logits}, {"grad_logits", &grad_logits}});
  if (logits.numel() == 0) return;
  const double scale = reduction_scale(reduction, logits.size(0));
  check_labels_on_cpu(op, labels, logits.size(1), stream);
  TL_DISPATCH(stream,
              cpu::softmax_cross_entropy_backward(grad_logits, grad_loss, logits, labels, scale,
                                                  label_smoothing),
              cuda::softmax_cross_entropy_backward(grad_logits, grad_loss, logits, labels,
                                                   static_cast<float>(scale),
                                                   static_cast<float>(label_smoothing), stream));
}

void softmax_cross_entropy_backward_from_probs(const Tensor& grad_logits, const Tensor& grad_loss,
                                               const Tensor& probs, const Tensor& labels,
                                               Reduction reduction, const Stream& stream,
                                               double label_smoothing) {
  const char* op = "softmax_cross_entropy_backward_from_probs";
  check_cross_entropy_inputs(op, probs, labels, label_smoothing, stream);
  kernels::check_on_stream(op, stream, {{"probs", &probs}, {"grad_loss", &grad_loss}});
  kernels::check_one_element(op, "grad_loss", grad_loss);
  if (!grad_logits.defined()) return;
  kernels::check_same_shape(op, stream, {{"probs", &probs}, {"grad_logits", &grad_logits}});
  if (probs.numel() == 0) return;
  const double scale = reduction_scale(reduction, probs.size(0));
  check_labels_on_cpu(op, labels, probs.size(1), stream);
  TL_DISPATCH(stream,
              cpu::softmax_cross_entropy_backward_from_probs(grad_logits, grad_loss, probs, labels,
                                                             scale, label_smoothing),
              cuda::softmax_cross_entropy_backward_from_probs(
                  grad_logits, grad_loss, probs, labels, static_cast<float>(scale),
                  static_cast<float>(label_smoothing), stream));
}

void validate_labels(const Tensor& labels, std::int64_t num_classes, const Stream& stream) {
  kernels::check_on_stream("validate_labels", stream, {{"labels", &labels}});
  TL_CHECK(num_classes > 0, InvalidArgument,
           "validate_labels: num_classes must be positive, got " << num_classes);
  if (labels.numel() == 0) return;
  std::int64_t bad = -1;
  TL_DISPATCH(stream, bad = cpu::first_invalid_label(labels, num_classes),
              bad = cuda::first_invalid_label(labels, num_classes, stream));
  if (bad >= 0) throw_bad_label("validate_labels", labels, bad, num_classes, stream);
}

void l2_loss_forward(const Tensor& loss, const Tensor& w, double coeff, const Stream& stream) {
  kernels::check_on_stream("l2_loss_forward", stream, {{"loss", &loss}, {"w", &w}});
  kernels::check_one_element("l2_loss_forward", "loss", loss);
  check_coeff("l2_loss_forward", coeff);
  TL_DISPATCH(stream, cpu::square_sum(loss, w, coeff / 2),
              cuda::square_sum(loss, w, static_cast<float>(coeff / 2), stream));
}

void l2_loss_backward(const Tensor& grad_w, const Tensor& grad_loss, const Tensor& w, double coeff,
                      const Stream& stream) {
  kernels::check_on_stream("l2_loss_backward", stream, {{"w", &w}, {"grad_loss", &grad_loss}});
  kernels::check_one_element("l2_loss_backward", "grad_loss", grad_loss);
  check_coeff("l2_loss_backward", coeff);
  if (!grad_w.defined()) return;
  kernels::check_same_shape("l2_loss_backward", stream, {{"w", &w}, {"grad_w", &grad_w}});
  if (w.numel() == 0) return;
  TL_DISPATCH(stream, cpu::l2_loss_backward(grad_w, grad_loss, w, coeff),
              cuda::l2_loss_backward(grad_w, grad_loss, w, static_cast<float>(coeff), stream));
}

}  // namespace towerlab
