#include "autograd/losses.h"

#include "autograd/mixed_precision.h"
#include "autograd/ops.h"
#include "engine/error.h"

namespace towerlab::ag {

namespace {

Tensor scalar(const Tape& tape, DType dtype) {
  return Tensor::empty({1}, tape.stream(), dtype);
}

// Only the inputs that need a gradient get one; an undefined Tensor is skipped.
Tensor grad_or_none(Tape& tape, const Var& v) {
  return v.requires_grad() ? tape.grad_for(v) : Tensor();
}

// The pointwise loss `op` of pred and target, recorded with its backward.
Var pointwise(const Var& pred, const Var& target, PointwiseLossOp op, Reduction reduction) {
  const char* name = pointwise_loss_name(op.kind);
  Tape& tape = pred.tape();
  tape.check_owns(name, {pred, target});
  if (has_16bit({pred, target})) {
    return through_float32({pred, target}, FallbackOutput::Float32, [&](const std::vector<Var>& v) {
      return pointwise(v[0], v[1], op, reduction);
    });
  }
  TL_CHECK(pred.shape() == target.shape(), ShapeError,
           name << ": prediction " << pred.describe() << " and target " << target.describe()
                << " differ in shape");
  Tensor loss = scalar(tape, pred.value().dtype());
  pointwise_loss_forward(loss, pred.value(), target.value(), op, reduction, tape.stream());
  return tape.record(loss, name, {pred, target}, [pred, target, op, reduction](const Var& out) {
    Tape& t = out.tape();
    pointwise_loss_backward(grad_or_none(t, pred), grad_or_none(t, target), out.grad(),
                            pred.value(), target.value(), op, reduction, t.stream());
  });
}

}  // namespace

Var binary_cross_entropy_with_logits(const Var& logits, const Var& target, Reduction reduction) {
  return pointwise(logits, target, {PointwiseLossKind::BinaryCrossEntropyWithLogits}, reduction);
}

Var l1_loss(const Var& pred, const Var& target, Reduction reduction) {
  return pointwise(pred, target, {PointwiseLossKind::L1}, reduction);
}

Var huber_loss(const Var& pred, const Var& target, double delta, Reduction reduction) {
  return pointwise(pred, target, {PointwiseLossKind::Huber, delta}, reduction);
}

Var mse(const Var& pred, const Var& target, Reduction reduction) {
  Tape& tape = pred.tape();
  tape.check_owns("mse", {pred, target});
  if (has_16bit({pred, target})) {
    return through_float32({pred, target}, FallbackOutput::Float32,
                           [&](const std::vector<Var>& v) { return mse(v[0], v[1], reduction); });
  }
  TL_CHECK(pred.shape() == target.shape(), ShapeError,
           "mse: prediction " << pred.describe() << " and target " << target.describe()
                              << " differ in shape");
  Tensor loss = scalar(tape, pred.value().dtype());
  mse_forward(loss, pred.value(), target.value(), reduction, tape.stream());
  return tape.record(loss, "mse", {pred, target}, [pred, target, reduction](const Var& out) {
    Tape& t = out.tape();
    mse_backward(grad_or_none(t, pred), grad_or_none(t, target), out.grad(), pred.value(),
                 target.value(), reduction, t.stream());
  });
}

Var softmax_cross_entropy(const Var& logits, const Var& labels, Reduction reduction,
                          Tensor* predictions, double label_smoothing) {
  Tape& tape = logits.tape();
  tape.check_owns("softmax_cross_entropy", {logits, labels});
  if (has_16bit({logits, labels})) {
    return through_float32(
        {logits, labels}, FallbackOutput::Float32, [&](const std::vector<Var>& v) {
          return softmax_cross_entropy(v[0], v[1], reduction, predictions, label_smoothing);
        });
  }
  TL_CHECK(logits.value().dim() == 2, ShapeError,
           "softmax_cross_entropy: logits " << logits.describe() << " must be [N,K]");
  TL_CHECK(labels.value().dim() == 1 && labels.shape()[0] == logits.shape()[0], ShapeError,
           "softmax_cross_entropy: labels " << labels.describe() << " must be [N] for logits "
                                            << logits.describe());
  TL_CHECK(!labels.requires_grad(), InvalidArgument,
           "softmax_cross_entropy: labels " << labels.describe() << " cannot be differentiated");
  Tensor loss = scalar(tape, logits.value().dtype());
  Tensor preds;
  if (predictions != nullptr) {
    preds = Tensor::empty({logits.shape()[0]}, tape.stream(), logits.value().dtype());
  }
  // Where the backward's probabilities come from depends on what is scarce. On the
  // CPU the exps are: the forward's pass over the logits writes the probabilities
  // (kernels/loss.h) and the backward reads them. On a GPU memory bandwidth is,
  // and the exps are nearly free: the backward recomputes the softmax from the
  // logits, and [N,K] is neither written nor read once more (the two steps' speed
  // on a GPU: bench/results/gpu_h100.md, CrossEntropyStep). The two agree to float
  // rounding (kernels/loss.h).
  const bool backward = logits.requires_grad() && tape.grad_enabled();
  const bool reuse_probs = backward && !logits.value().device().is_cuda();
  Tensor probs =
      reuse_probs ? Tensor::empty(logits.shape(), tape.stream(), logits.value().dtype()) : Tensor();
  softmax_cross_entropy_forward(loss, probs, preds, logits.value(), labels.value(), reduction,
                                tape.stream(), label_smoothing);
  if (predictions != nullptr) *predictions = preds;
  return tape.record(loss, "softmax_cross_entropy", {logits, labels},
                     [logits, labels, probs, reduction, label_smoothing](const Var& out) {
                       Tape& t = out.tape();
                       if (probs.defined()) {
                         softmax_cross_entropy_backward_from_probs(t.grad_for(logits), out.grad(),
                                                                   probs, labels.value(), reduction,
                                                                   t.stream(), label_smoothing);
                       } else {
                         softmax_cross_entropy_backward(t.grad_for(logits), out.grad(),
                                                        logits.value(), labels.value(), reduction,
                                                        t.stream(), label_smoothing);
                       }
                     });
}

Var l2_loss(const Var& w, double coeff) {
  Tape& tape = w.tape();
  tape.check_owns("l2_loss", {w});
  if (has_16bit({w})) {
    return through_float32({w}, FallbackOutput::Float32,
                           [&](const std::vector<Var>& v) { return l2_loss(v[0], coeff); });
  }
  Tensor loss = scalar(tape, w.value().dtype());
  l2_loss_forward(loss, w.value(), coeff, tape.stream());
  return tape.record(loss, "l2_loss", {w}, [w, coeff](const Var& out) {
    Tape& t = out.tape();
    l2_loss_backward(t.grad_for(w), out.grad(), w.value(), coeff, t.stream());
  });
}

Var add_n(const std::vector<Var>& terms) {
  TL_CHECK(!terms.empty(), InvalidArgument, "add_n: no terms to add");
  Var total = terms.front();
  for (std::size_t i = 1; i < terms.size(); ++i) total = add(total, terms[i]);
  return total;
}

}  // namespace towerlab::ag
