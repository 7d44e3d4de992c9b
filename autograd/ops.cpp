// Elementwise, ReLU and the other activations, reduction, view, softmax, layer-norm
// and shape ops of autograd/ops.h.
#include "autograd/ops.h"

#include "autograd/mixed_precision.h"
#include "engine/error.h"
#include "kernels/activation.h"
#include "kernels/add_relu.h"
#include "kernels/broadcast.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layer_norm.h"
#include "kernels/permute.h"
#include "kernels/reduce.h"
#include "kernels/relu.h"
#include "kernels/slice_copy.h"
#include "kernels/softmax.h"

namespace towerlab::ag {

namespace {

Tensor like(const Var& x) {
  return Tensor::empty(x.shape(), x.tape().stream(), x.value().dtype());
}

// The broadcast shape of a and b (kernels/broadcast.h), or ShapeError naming the op
// and the Vars.
Shape broadcast_of(const char* op, const Var& a, const Var& b) {
  a.tape().check_owns(op, {a, b});
  const std::string conflict = broadcast_conflict(a.shape(), b.shape());
  TL_CHECK(conflict.empty(), ShapeError,
           op << ": " << a.describe() << " and " << b.describe() << " do not broadcast ("
              << conflict << ")");
  return broadcast_shape(op, a.shape(), b.shape());
}

// Adds g (the output's shape) into x's gradient: as it is where x has the output's
// shape, summed over x's repeated dimensions otherwise.
void add_broadcast_grad(Tape& t, const Var& x, const Tensor& g) {
  if (x.shape() == g.shape()) {
    t.add_to_grad(x, g);
    return;
  }
  const Tape::GradTarget gx = t.grad_target(x);
  sum_to_shape(gx.grad, g, t.stream(), gx.assign ? GradWrite::Assign : GradWrite::Accumulate);
}

}  // namespace

Var add(const Var& a, const Var& b) {
  if (has_16bit({a, b})) {
    return through_float32({a, b}, FallbackOutput::Working,
                           [&](const std::vector<Var>& v) { return add(v[0], v[1]); });
  }
  const Shape shape = broadcast_of("add", a, b);
  Tape& tape = a.tape();
  Tensor y = Tensor::empty(shape, tape.stream(), a.value().dtype());
  broadcast_add(y, a.value(), b.value(), tape.stream());
  return tape.record(y, "add", {a, b}, [a, b](const Var& out) {
    Tape& t = out.tape();
    // b's share is read before a's gradient can change: a may take the output's
    // gradient itself (Tape::pass_grad), b a copy or a sum of it.
    if (b.requires_grad()) add_broadcast_grad(t, b, out.grad());
    if (!a.requires_grad()) return;
    if (a.shape() == out.shape()) {
      t.pass_grad(a, out.grad());
    } else {
      add_broadcast_grad(t, a, out.grad());
    }
  });
}

Var sub(const Var& a, const Var& b) {
  if (has_16bit({a, b})) {
    return through_float32({a, b}, FallbackOutput::Working,
                           [&](const std::vector<Var>& v) { return sub(v[0], v[1]); });
  }
  const Shape shape = broadcast_of("sub", a, b);
  Tape& tape = a.tape();
  Tensor y = Tensor::empty(shape, tape.stream(), a.value().dtype());
  broadcast_sub(y, a.value(), b.value(), tape.stream());
  return tape.record(y, "sub", {a, b}, [a, b](const Var& out) {
    Tape& t = out.tape();
    if (a.requires_grad()) add_broadcast_grad(t, a, out.grad());
    if (!b.requires_grad()) return;
    if (b.shape() == out.shape()) {
      t.add_to_grad(b, out.grad(), -1.0);
      return;
    }
    Tensor negated = like(out);  // -dL/dy, exact, then summed over b's repeated dimensions
    towerlab::scale(negated, out.grad(), -1.0, t.stream());
    add_broadcast_grad(t, b, negated);
  });
}

Var mul(const Var& a, const Var& b) {
  if (has_16bit({a, b})) {
    return through_float32({a, b}, FallbackOutput::Working,
                           [&](const std::vector<Var>& v) { return mul(v[0], v[1]); });
  }
  const Shape shape = broadcast_of("mul", a, b);
  Tape& tape = a.tape();
  Tensor y = Tensor::empty(shape, tape.stream(), a.value().dtype());
  broadcast_mul(y, a.value(), b.value(), tape.stream());
  return tape.record(y, "mul", {a, b}, [a, b](const Var& out) {
    Tape& t = out.tape();
    Tensor product = like(out);
    if (a.requires_grad()) {  // dL/da = dL/dy * b, summed over a's repeated dimensions
      broadcast_mul(product, out.grad(), b.value(), t.stream());
      add_broadcast_grad(t, a, product);
    }
    if (b.requires_grad()) {
      broadcast_mul(product, out.grad(), a.value(), t.stream());
      add_broadcast_grad(t, b, product);
    }
  });
}

Var scale(const Var& x, double alpha) {
  if (has_16bit({x})) {
    return through_float32({x}, FallbackOutput::Working,
                           [&](const std::vector<Var>& v) { return scale(v[0], alpha); });
  }
  x.tape().check_owns("scale", {x});
  Tape& tape = x.tape();
  Tensor y = like(x);
  towerlab::scale(y, x.value(), alpha, tape.stream());
  return tape.record(y, "scale", {x}, [x, alpha](const Var& out) {
    Tape& t = out.tape();
    t.add_to_grad(x, out.grad(), alpha);
  });
}

Var relu(const Var& x) {
  x.tape().check_owns("relu", {x});
  Tape& tape = x.tape();
  Tensor y = like(x);
  relu_forward(y, x.value(), tape.stream());
  return tape.record(y, "relu", {x}, [x](const Var& out) {
    Tape& t = out.tape();
    const Tape::GradTarget gx = t.grad_target(x);
    relu_backward(gx.grad, out.grad(), widened(out.value(), t.stream()), t.stream(),
                  gx.assign ? GradWrite::Assign : GradWrite::Accumulate);
  });
}

Var add_relu(const Var& a, const Var& b) {
  // 16-bit a and b of one dtype take the 16-bit kernel (y rounded once, no widened
  // copies); a 16-bit operand beside a float32 one, the float32 fallback.
  const bool one_16bit_dtype =
      is_16bit(a.value().dtype()) && b.value().dtype() == a.value().dtype();
  if (has_16bit({a, b}) && !one_16bit_dtype) {
    return through_float32({a, b}, FallbackOutput::Working,
                           [&](const std::vector<Var>& v) { return add_relu(v[0], v[1]); });
  }
  a.tape().check_owns("add_relu", {a, b});
  TL_CHECK(a.shape() == b.shape(), ShapeError,
           "add_relu: " << a.describe() << " and " << b.describe()
                        << " differ in shape (a residual's branches must agree)");
  Tape& tape = a.tape();
  Tensor y = like(a);
  add_relu_forward(y, a.value(), b.value(), tape.stream());
  return tape.record(y, "add_relu", {a, b}, [a, b](const Var& out) {
    Tape& t = out.tape();
    AddReluBackward args;
    args.grad_y = out.grad();
    // The float32 kernel, as relu's backward: on the CPU it reads the 16-bit y as it is
    // (kernels/add_relu.h), elsewhere its widening.
    args.y = t.stream().device().is_cpu() ? out.value() : widened(out.value(), t.stream());
    if (a.requires_grad()) {  // a first: the order of add's two contributions
      const Tape::GradTarget ga = t.grad_target(a);
      args.grad_a = ga.grad;
      args.grad_a_write = ga.assign ? GradWrite::Assign : GradWrite::Accumulate;
    }
    if (b.requires_grad()) {
      const Tape::GradTarget gb = t.grad_target(b);
      args.grad_b = gb.grad;
      args.grad_b_write = gb.assign ? GradWrite::Assign : GradWrite::Accumulate;
    }
    add_relu_backward(args, t.stream());
  });
}

namespace {

// An activation of kernels/activation.h on the tape: the backward reads the
// forward's input x, kept alive by the record.
Var activation(const char* op, const Var& x, const ActivationOp& act) {
  x.tape().check_owns(op, {x});
  Tape& tape = x.tape();
  Tensor y = like(x);
  activation_forward(y, x.value(), act, tape.stream());
  return tape.record(y, op, {x}, [x, act](const Var& out) {
    Tape& t = out.tape();
    const Tape::GradTarget gx = t.grad_target(x);
    activation_backward(gx.grad, out.grad(), widened(x.value(), t.stream()), act, t.stream(),
                        gx.assign ? GradWrite::Assign : GradWrite::Accumulate);
  });
}

}  // namespace

Var sigmoid(const Var& x) {
  return activation("sigmoid", x, ActivationOp::sigmoid());
}

Var tanh(const Var& x) {
  return activation("tanh", x, ActivationOp::tanh());
}

Var gelu(const Var& x, GeluApproximate approximate) {
  return activation("gelu", x, ActivationOp::gelu(approximate));
}

Var silu(const Var& x) {
  return activation("silu", x, ActivationOp::silu());
}

Var leaky_relu(const Var& x, double negative_slope) {
  return activation("leaky_relu", x, ActivationOp::leaky_relu(negative_slope));
}

Var dropout(const Var& x, double p, const DropoutKey& key, bool training) {
  x.tape().check_owns("dropout", {x});
  TL_CHECK(p >= 0.0 && p <= 1.0, InvalidArgument,
           "dropout: p is " << p << " for " << x.describe() << "; it must be in [0, 1]");
  if (!training) return x;
  if (has_16bit({x})) {
    return through_float32({x}, FallbackOutput::Working, [&](const std::vector<Var>& v) {
      return dropout(v[0], p, key, training);
    });
  }
  Tape& tape = x.tape();
  Tensor y = like(x);
  dropout_forward(y, x.value(), p, key, tape.stream());
  return tape.record(y, "dropout", {x}, [x, p, key](const Var& out) {
    Tape& t = out.tape();
    const Tape::GradTarget gx = t.grad_target(x);
    dropout_backward(gx.grad, out.grad(), p, key, t.stream(),
                     gx.assign ? GradWrite::Assign : GradWrite::Accumulate);
  });
}

namespace {

Var reduce(const char* op, const Var& x, bool average) {
  if (has_16bit({x})) {
    return through_float32({x}, FallbackOutput::Float32,
                           [&](const std::vector<Var>& v) { return reduce(op, v[0], average); });
  }
  x.tape().check_owns(op, {x});
  Tape& tape = x.tape();
  Tensor y = Tensor::empty({1}, tape.stream(), x.value().dtype());
  (average ? towerlab::mean : towerlab::sum)(y, x.value(), tape.stream());
  const double alpha = average && x.value().numel() > 0 ? 1.0 / double(x.value().numel()) : 1.0;
  return tape.record(y, op, {x}, [x, alpha](const Var& out) {
    Tape& t = out.tape();
    axpy_scalar(t.grad_for(x), alpha, out.grad(), t.stream());
  });
}

}  // namespace

Var sum(const Var& x) {
  return reduce("sum", x, false);
}
Var mean(const Var& x) {
  return reduce("mean", x, true);
}

Var reshape(const Var& x, const Shape& shape) {
  x.tape().check_owns("reshape", {x});
  Tensor y = x.value().reshape(shape);
  return x.tape().record(y, x.name(), {x}, [x](const Var& out) {
    Tape& t = out.tape();
    t.pass_grad(x, out.grad().reshape(x.shape()));
  });
}

Var flatten(const Var& x) {
  TL_CHECK(x.value().dim() >= 1, ShapeError,
           "flatten: " << x.describe() << " has no batch dimension");
  return reshape(x, {x.shape()[0], x.shape()[0] == 0 ? 0 : -1});
}

// --- softmax, log-softmax, layer norm ---------------------------------------------

namespace {

GradWrite write_of(const Tape::GradTarget& target) {
  return target.assign ? GradWrite::Assign : GradWrite::Accumulate;
}

// Softmax or log-softmax on the tape: the backward reads the forward's output.
Var softmax_op(const char* op, const Var& x, SoftmaxKind kind, SoftmaxMask mask) {
  if (has_16bit({x})) {
    return through_float32({x}, FallbackOutput::Float32, [&](const std::vector<Var>& v) {
      return softmax_op(op, v[0], kind, mask);
    });
  }
  x.tape().check_owns(op, {x});
  Tape& tape = x.tape();
  Tensor y = like(x);
  if (kind == SoftmaxKind::Softmax) {
    softmax_forward(y, x.value(), mask, tape.stream());
  } else {
    log_softmax_forward(y, x.value(), mask, tape.stream());
  }
  return tape.record(y, op, {x}, [x, kind, mask](const Var& out) {
    Tape& t = out.tape();
    const Tape::GradTarget gx = t.grad_target(x);
    if (kind == SoftmaxKind::Softmax) {
      softmax_backward(gx.grad, out.grad(), out.value(), mask, t.stream(), write_of(gx));
    } else {
      log_softmax_backward(gx.grad, out.grad(), out.value(), mask, t.stream(), write_of(gx));
    }
  });
}

}  // namespace

Var softmax(const Var& x, SoftmaxMask mask) {
  return softmax_op("softmax", x, SoftmaxKind::Softmax, mask);
}

Var log_softmax(const Var& x, SoftmaxMask mask) {
  return softmax_op("log_softmax", x, SoftmaxKind::LogSoftmax, mask);
}

Var layer_norm(const Var& x, const Var& weight, const Var& bias, double eps) {
  std::vector<Var> inputs = {x};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  x.tape().check_owns("layer_norm", inputs);
  if (has_16bit(inputs)) {
    return through_float32(
        {x, weight, bias}, FallbackOutput::Working,
        [&](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2], eps); });
  }
  Tape& tape = x.tape();
  TL_CHECK(x.value().dim() >= 1, ShapeError,
           "layer_norm: " << x.describe() << " has no last dimension to normalize over");
  std::int64_t rows = 1;  // R: every dimension but the last
  for (std::size_t i = 0; i + 1 < x.shape().size(); ++i) rows *= x.shape()[i];
  const DType dtype = x.value().dtype();
  LayerNormForward forward;
  forward.y = like(x);
  forward.mean = Tensor::empty({rows}, tape.stream(), dtype);
  forward.rstd = Tensor::empty({rows}, tape.stream(), dtype);
  forward.x = x.value();
  if (weight.defined()) forward.weight = weight.value();
  if (bias.defined()) forward.bias = bias.value();
  forward.eps = eps;
  layer_norm_forward(forward, tape.stream());
  return tape.record(forward.y, "layer_norm", inputs,
                     [x, weight, bias, mean = forward.mean, rstd = forward.rstd](const Var& out) {
                       Tape& t = out.tape();
                       LayerNormBackward args;
                       if (x.requires_grad()) {
                         const Tape::GradTarget gx = t.grad_target(x);
                         args.grad_x = gx.grad;
                         args.grad_x_write = write_of(gx);
                       }
                       if (weight.defined() && weight.requires_grad())
                         args.grad_weight = t.grad_for(weight);
                       if (bias.defined() && bias.requires_grad())
                         args.grad_bias = t.grad_for(bias);
                       args.grad_y = out.grad();
                       args.x = x.value();
                       if (weight.defined()) args.weight = weight.value();
                       args.mean = mean;
                       args.rstd = rstd;
                       layer_norm_backward(args, t.stream());
                     });
}

// --- embedding ----------------------------------------------------------------------

Var embedding(const Var& ids, const Var& table) {
  ids.tape().check_owns("embedding", {ids, table});
  if (has_16bit({ids, table})) {
    return through_float32({ids, table}, FallbackOutput::Working,
                           [](const std::vector<Var>& v) { return embedding(v[0], v[1]); });
  }
  Tape& tape = ids.tape();
  TL_CHECK(table.value().dim() == 2, ShapeError,
           "embedding: the table " << table.describe() << " must be [V, D] (rows, width)");
  Shape shape = ids.shape();
  shape.push_back(table.shape()[1]);
  Tensor y = Tensor::empty(shape, tape.stream(), table.value().dtype());
  embedding_forward(y, ids.value(), table.value(), tape.stream());
  return tape.record(y, "embedding", {ids, table}, [ids, table](const Var& out) {
    if (!table.requires_grad()) return;
    Tape& t = out.tape();
    const Tape::GradTarget grad = t.grad_target(table);
    embedding_backward(grad.grad, out.grad(), ids.value(), t.stream(), write_of(grad));
  });
}

// --- permute, concat, split, slice ----------------------------------------------

Var permute(const Var& x, const std::vector<std::int64_t>& dims) {
  x.tape().check_owns("permute", {x});
  if (has_16bit({x})) {
    return through_float32({x}, FallbackOutput::Working,
                           [&](const std::vector<Var>& v) { return permute(v[0], dims); });
  }
  Tape& tape = x.tape();
  Tensor y =
      Tensor::empty(permuted_shape("permute", x.shape(), dims), tape.stream(), x.value().dtype());
  permute_forward(y, x.value(), dims, tape.stream());
  return tape.record(y, "permute", {x}, [x, dims](const Var& out) {
    Tape& t = out.tape();
    const Tape::GradTarget gx = t.grad_target(x);
    permute_backward(gx.grad, out.grad(), dims, t.stream(), write_of(gx));
  });
}

Var transpose(const Var& x, std::int64_t d0, std::int64_t d1) {
  return permute(x, transpose_dims("transpose", x.value().dim(), d0, d1));
}

Var concat(const std::vector<Var>& xs, std::int64_t dim) {
  TL_CHECK(!xs.empty(), InvalidArgument, "concat: no inputs");
  xs.front().tape().check_owns("concat", xs);
  if (has_16bit(xs)) {
    return through_float32(xs, FallbackOutput::Working,
                           [&](const std::vector<Var>& v) { return concat(v, dim); });
  }
  Tape& tape = xs.front().tape();
  const Var& first = xs.front();
  const std::int64_t d = resolve_dim("concat", dim, first.shape());
  Shape shape = first.shape();
  shape[static_cast<std::size_t>(d)] = 0;
  for (const Var& x : xs) {
    bool agree =
        x.value().dim() == first.value().dim() && x.value().dtype() == first.value().dtype();
    for (std::int64_t k = 0; agree && k < x.value().dim(); ++k) {
      agree = k == d || x.value().size(k) == first.value().size(k);
    }
    TL_CHECK(agree, ShapeError,
             "concat: " << x.describe() << " and " << first.describe()
                        << " must have one dtype and rank and agree in every dimension but " << d);
    shape[static_cast<std::size_t>(d)] += x.value().size(d);
  }
  Tensor y = Tensor::empty(shape, tape.stream(), first.value().dtype());
  std::int64_t offset = 0;
  for (const Var& x : xs) {
    slice_copy(y, offset, x.value(), 0, x.value().size(d), d, GradWrite::Assign, tape.stream());
    offset += x.value().size(d);
  }
  return tape.record(y, "concat", xs, [xs, d](const Var& out) {
    Tape& t = out.tape();
    std::int64_t at = 0;
    for (const Var& x : xs) {
      const std::int64_t size = x.value().size(d);
      if (x.requires_grad()) {  // a Var given twice: assigned first, then added to
        const Tape::GradTarget gx = t.grad_target(x);
        slice_copy(gx.grad, 0, out.grad(), at, size, d, write_of(gx), t.stream());
      }
      at += size;
    }
  });
}

Var slice(const Var& x, std::int64_t dim, std::int64_t begin, std::int64_t end) {
  x.tape().check_owns("slice", {x});
  if (has_16bit({x})) {
    return through_float32({x}, FallbackOutput::Working,
                           [&](const std::vector<Var>& v) { return slice(v[0], dim, begin, end); });
  }
  Tape& tape = x.tape();
  const std::int64_t d = resolve_dim("slice", dim, x.shape());
  const std::int64_t size = x.value().size(d);
  TL_CHECK(0 <= begin && begin <= end && end <= size, InvalidArgument,
           "slice: [" << begin << ", " << end << ") is not a range of dimension " << d << " of "
                      << x.describe() << " (0 <= begin <= end <= " << size << ")");
  Shape shape = x.shape();
  shape[static_cast<std::size_t>(d)] = end - begin;
  Tensor y = Tensor::empty(shape, tape.stream(), x.value().dtype());
  slice_copy(y, 0, x.value(), begin, end - begin, d, GradWrite::Assign, tape.stream());
  return tape.record(y, "slice", {x}, [x, d, begin](const Var& out) {
    Tape& t = out.tape();
    // Added into a zero-filled gradient: the entries outside the slice get 0.
    slice_copy(t.grad_for(x), begin, out.grad(), 0, out.shape()[static_cast<std::size_t>(d)], d,
               GradWrite::Accumulate, t.stream());
  });
}

std::vector<Var> split(const Var& x, const std::vector<std::int64_t>& sizes, std::int64_t dim) {
  x.tape().check_owns("split", {x});
  const std::int64_t d = resolve_dim("split", dim, x.shape());
  std::int64_t total = 0;
  bool non_negative = true;
  for (std::int64_t size : sizes) {
    total += size;
    non_negative = non_negative && size >= 0;
  }
  TL_CHECK(non_negative && total == x.value().size(d), ShapeError,
           "split: sizes " << to_string(sizes) << " do not cut dimension " << d << " of "
                           << x.describe() << " (non-negative, summing to " << x.value().size(d)
                           << ")");
  std::vector<Var> pieces;
  std::int64_t begin = 0;
  for (std::int64_t size : sizes) {
    pieces.push_back(slice(x, d, begin, begin + size));
    begin += size;
  }
  return pieces;
}

}  // namespace towerlab::ag
