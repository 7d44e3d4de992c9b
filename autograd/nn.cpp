// The neural-network ops of autograd/nn.h: each runs its forward kernel and
// records a backward that accumulates into the gradients its inputs need. The
// GEMM-class ops (matmul, and linear through it; conv2d) multiply in the tape's
// compute dtype (gemm_operand below, docs/precision.md), and the float32 GEMMs
// (matmul, batched_matmul, conv2d) pass on the tape's Float32Math (TF32 under the
// tf32 precision). The rest run their forward kernels in x's dtype (16-bit pooling
// and batch norm too) and their backwards on the tape's float32 gradients with the
// float32 kernels, batch norm's reading a 16-bit x widened (on the CPU row by row
// inside the kernel, elsewhere whole: mixed_precision.h).
#include "autograd/nn.h"

#include <algorithm>

#include "autograd/mixed_precision.h"
#include "autograd/ops.h"
#include "engine/error.h"
#include "kernels/batched_matmul.h"
#include "kernels/batchnorm.h"
#include "kernels/bias.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/relu.h"

namespace towerlab::ag {

namespace {

Tensor new_tensor(const Tape& tape, const Shape& shape, const Var& like) {
  return Tensor::empty(shape, tape.stream(), like.value().dtype());
}

// The gradient to accumulate into, or an undefined Tensor when `v` needs none.
Tensor grad_if_needed(Tape& tape, const Var& v) {
  return v.requires_grad() ? tape.grad_for(v) : Tensor();
}

// The gradient of `v` for a kernel that writes every element of it: assigned where the
// tape allows (no zero-fill first), added into otherwise; undefined when `v` needs none.
Tape::GradTarget written_whole(Tape& tape, const Var& v) {
  return v.requires_grad() ? tape.grad_target(v) : Tape::GradTarget{Tensor(), false};
}

GradWrite write_of(const Tape::GradTarget& target) {
  return target.assign ? GradWrite::Assign : GradWrite::Accumulate;
}

// The operand a GEMM-class op multiplies, in its tape's compute dtype
// (docs/precision.md): the value itself in float32 (and float64, for gradient
// checks), else a variable's working copy (rounded once per step by the trainer),
// else the value rounded here, once per op (an activation).
Tensor gemm_operand(const Var& v) {
  const Tape& tape = v.tape();
  const DType dtype = tape.compute_dtype();
  if (dtype == DType::Float32 || v.value().dtype() != DType::Float32) return v.value();
  if (v.working().defined()) return v.working();
  return cast(v.value(), dtype, tape.stream());
}

// The output of a GEMM-class op: its float32 sums, rounded once to the operands'
// dtype under a mixed-precision tape (the working dtype between ops, as autocast's
// 16-bit GEMMs write it: docs/precision.md), as they are otherwise.
Tensor gemm_output(const Tensor& sums, DType operand_dtype, const Stream& stream) {
  return is_16bit(operand_dtype) ? cast(sums, operand_dtype, stream) : sums;
}

// The output gradient a 16-bit GEMM's backward multiplies: rounded to the operands'
// dtype, as autocast's bfloat16 matmul receives it (or already so, where its reader
// wrote it rounded: Tape::grad_target_rounded); float32 operands take it as it is.
Tensor gemm_grad_output(const Tensor& grad, DType operand_dtype, const Stream& stream) {
  return is_16bit(operand_dtype) && grad.dtype() != operand_dtype
             ? cast(grad, operand_dtype, stream)
             : grad;
}

// The saved x as a batch-norm backward reads it beside the float32 gradients: a
// bfloat16 x as it is on the CPU, whose kernels widen it row by row as they read it
// (kernels/batchnorm.h); otherwise widened whole, once (float16's widening, an
// integer rebias, gained nothing done in each of the backward's two passes:
// bench/results/precision_step_cpu_avx2_72bb2e1.md).
Tensor batchnorm_backward_x(const Tensor& x, const Stream& stream) {
  return stream.device().is_cpu() && x.dtype() == DType::BFloat16 ? x : widened(x, stream);
}

// The gradient target of a batch norm's x: on the CPU, where x is bfloat16 (which its
// backward reads as it is: batchnorm_backward_x above), the kernel can write grad_x
// rounded once to bfloat16 (kernels/batchnorm.h), so a convolution's output, whose
// backward reads its gradient only rounded, gets it so (Tape::grad_target_rounded);
// elsewhere grad_target's float32.
Tape::GradTarget batchnorm_grad_x_target(Tape& tape, const Var& x) {
  const bool rounded = tape.stream().device().is_cpu() && x.value().dtype() == DType::BFloat16;
  return rounded && x.requires_grad() ? tape.grad_target_rounded(x) : written_whole(tape, x);
}

}  // namespace

Var matmul(const Var& a, const Var& b, bool transpose_a, bool transpose_b) {
  Tape& tape = a.tape();
  tape.check_owns("matmul", {a, b});
  TL_CHECK(a.value().dim() == 2 && b.value().dim() == 2, ShapeError,
           "matmul: " << a.describe() << " and " << b.describe() << " must both be 2-D");
  const std::int64_t m = a.shape()[transpose_a ? 1 : 0], ka = a.shape()[transpose_a ? 0 : 1];
  const std::int64_t kb = b.shape()[transpose_b ? 1 : 0], n = b.shape()[transpose_b ? 0 : 1];
  TL_CHECK(ka == kb, ShapeError,
           "matmul: " << a.describe() << " and " << b.describe() << ": inner dimensions " << ka
                      << " and " << kb << " differ");
  // av, bv: the operands as multiplied (16-bit under a mixed-precision tape); y is
  // their float32 sums in the operands' dtype; the gradients are float32.
  const Tensor av = gemm_operand(a), bv = gemm_operand(b);
  Tensor sums = Tensor::empty({m, n}, tape.stream(), Tape::grad_dtype(a.value().dtype()));
  towerlab::matmul(sums, av, bv, transpose_a, transpose_b, 1.0f, 0.0f, tape.stream(),
                   tape.float32_math());
  const Tensor y = gemm_output(sums, av.dtype(), tape.stream());
  return tape.record(y, "matmul", {a, b}, [a, b, av, bv, transpose_a, transpose_b](const Var& out) {
    Tape& t = out.tape();
    const Tensor gy = gemm_grad_output(out.grad(), av.dtype(), t.stream());  // [M,N]
    const Float32Math math = t.float32_math();
    if (a.requires_grad()) {
      // op(A) = gy op(B)^T; A stored transposed gets the transpose of that.
      const Tape::GradTarget ga = t.grad_target(a);
      const float beta = ga.assign ? 0.0f : 1.0f;
      if (!transpose_a) {
        towerlab::matmul(ga.grad, gy, bv, false, !transpose_b, 1.0f, beta, t.stream(), math);
      } else {
        towerlab::matmul(ga.grad, bv, gy, transpose_b, true, 1.0f, beta, t.stream(), math);
      }
    }
    if (b.requires_grad()) {
      // op(B) = op(A)^T gy.
      const Tape::GradTarget gb = t.grad_target(b);
      const float beta = gb.assign ? 0.0f : 1.0f;
      if (!transpose_b) {
        towerlab::matmul(gb.grad, av, gy, !transpose_a, false, 1.0f, beta, t.stream(), math);
      } else {
        towerlab::matmul(gb.grad, gy, av, true, transpose_a, 1.0f, beta, t.stream(), math);
      }
    }
  });
}

Var batched_matmul(const Var& a, const Var& b, bool transpose_a, bool transpose_b) {
  Tape& tape = a.tape();
  tape.check_owns("batched_matmul", {a, b});
  const auto rank_ok = [](const Var& v) { return v.value().dim() == 2 || v.value().dim() == 3; };
  TL_CHECK(rank_ok(a) && rank_ok(b) && (a.value().dim() == 3 || b.value().dim() == 3), ShapeError,
           "batched_matmul: " << a.describe() << " and " << b.describe()
                              << " must be 3-D [B, rows, cols], or one of them 2-D");
  const std::int64_t batch = (a.value().dim() == 3 ? a : b).shape()[0];
  const std::int64_t m = a.value().size(transpose_a ? -1 : -2);
  const std::int64_t n = b.value().size(transpose_b ? -2 : -1);
  // As matmul: the operands as multiplied (16-bit under a mixed-precision tape), y
  // their float32 sums in the operands' dtype, the gradients float32.
  const Tensor av = gemm_operand(a), bv = gemm_operand(b);
  Tensor sums = Tensor::empty({batch, m, n}, tape.stream(), Tape::grad_dtype(a.value().dtype()));
  towerlab::batched_matmul(sums, av, bv, transpose_a, transpose_b, 1.0f, 0.0f, tape.stream(),
                           tape.float32_math());
  const Tensor y = gemm_output(sums, av.dtype(), tape.stream());
  return tape.record(
      y, "batched_matmul", {a, b}, [a, b, av, bv, transpose_a, transpose_b](const Var& out) {
        // matmul's formulas entry by entry; a shared (2-D) operand's gradient is the
        // 2-D c of batched_matmul, the sum over the batch.
        Tape& t = out.tape();
        const Tensor gy = gemm_grad_output(out.grad(), av.dtype(), t.stream());  // [B,M,N]
        const Float32Math math = t.float32_math();
        if (a.requires_grad()) {
          const Tape::GradTarget ga = t.grad_target(a);
          const float beta = ga.assign ? 0.0f : 1.0f;
          if (!transpose_a) {
            towerlab::batched_matmul(ga.grad, gy, bv, false, !transpose_b, 1.0f, beta, t.stream(),
                                     math);
          } else {
            towerlab::batched_matmul(ga.grad, bv, gy, transpose_b, true, 1.0f, beta, t.stream(),
                                     math);
          }
        }
        if (b.requires_grad()) {
          const Tape::GradTarget gb = t.grad_target(b);
          const float beta = gb.assign ? 0.0f : 1.0f;
          if (!transpose_b) {
            towerlab::batched_matmul(gb.grad, av, gy, !transpose_a, false, 1.0f, beta, t.stream(),
                                     math);
          } else {
            towerlab::batched_matmul(gb.grad, gy, av, true, transpose_a, 1.0f, beta, t.stream(),
                                     math);
          }
        }
      });
}

namespace {

// bias_add with its output written into y: a new tensor of x's shape and dtype, or
// x's own value where nothing else reads x (ag::linear's product, whose matmul
// backward reads its inputs, never its output; the kernels allow y to alias x).
Var bias_add_into(Tensor y, const Var& x, const Var& bias, Activation activation) {
  Tape& tape = x.tape();
  tape.check_owns("bias_add", {x, bias});
  TL_CHECK(x.value().dim() >= 2 && bias.value().dim() == 1 && bias.shape()[0] == x.shape()[1],
           ShapeError,
           "bias_add: " << bias.describe() << " does not match the channels of " << x.describe());
  if (activation == Activation::ReLU) {
    bias_add_relu_forward(y, x.value(), bias.value(), tape.stream());
    return tape.record(y, "bias_add_relu", {x, bias}, [x, bias](const Var& out) {
      Tape& t = out.tape();
      bias_add_relu_backward(grad_if_needed(t, x), grad_if_needed(t, bias), out.grad(),
                             widened(out.value(), t.stream()), t.stream());
    });
  }
  bias_add_forward(y, x.value(), bias.value(), tape.stream());
  return tape.record(y, "bias_add", {x, bias}, [x, bias](const Var& out) {
    Tape& t = out.tape();
    // The bias's sum first: x may then take the output's gradient itself.
    if (bias.requires_grad()) bias_add_backward(t.grad_for(bias), out.grad(), t.stream());
    if (x.requires_grad()) t.pass_grad(x, out.grad());
  });
}

}  // namespace

Var bias_add(const Var& x, const Var& bias, Activation activation) {
  return bias_add_into(new_tensor(x.tape(), x.shape(), x), x, bias, activation);
}

Var linear(const Var& x, const Var& weight, const Var& bias, Activation activation) {
  Tape& tape = x.tape();
  tape.check_owns("linear", {x, weight});
  TL_CHECK(x.value().dim() == 2, ShapeError,
           "linear: input " << x.describe() << " must be [N,features] (flatten it first)");
  TL_CHECK(weight.value().dim() == 2 && weight.shape()[1] == x.shape()[1], ShapeError,
           "linear: x " << x.describe() << " has " << x.shape()[1] << " features but "
                        << weight.describe() << " expects "
                        << (weight.value().dim() == 2 ? weight.shape()[1] : -1));
  Var y = matmul(x, weight, false, true);
  if (bias.defined()) return bias_add_into(y.value(), y, bias, activation);  // in place
  return activation == Activation::ReLU ? relu(y) : y;
}

Var conv2d(const Var& x, const Var& weight, const Var& bias, const Conv2dParams& params) {
  Tape& tape = x.tape();
  std::vector<Var> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  tape.check_owns("conv2d", inputs);
  TL_CHECK(x.value().dim() == 4 && weight.value().dim() == 4, ShapeError,
           "conv2d: input " << x.describe() << " and weight " << weight.describe()
                            << " must be [N,C,H,W] and [K,C,R,S]");
  // groups < 1 is left to the kernel's check, which names it.
  const std::int64_t G = params.groups;
  TL_CHECK(G < 1 || x.shape()[1] == weight.shape()[1] * G, ShapeError,
           "conv2d: input has " << x.shape()[1] << " channels but weight expects "
                                << weight.shape()[1] * G
                                << (G > 1 ? " (" + std::to_string(weight.shape()[1]) +
                                                " per group x " + std::to_string(G) + " groups)"
                                          : std::string())
                                << " (weight " << weight.describe() << ", input " << x.describe()
                                << ")");
  // xv, wv: as multiplied (16-bit under a mixed-precision tape, the bias float32);
  // y: their float32 sums (the bias added) in xv's dtype, which the kernel rounds
  // once as it stores them (kernels/conv2d.h): gemm_output's bits, no float32 copy.
  const Tensor xv = gemm_operand(x), wv = gemm_operand(weight);
  const Tensor y =
      Tensor::empty(conv2d_output_shape(x.shape(), weight.shape(), params), tape.stream(),
                    is_16bit(xv.dtype()) ? xv.dtype() : Tape::grad_dtype(x.value().dtype()));
  conv2d_forward(y, xv, wv, bias.defined() ? bias.value() : Tensor(), params, tape.stream(),
                 tape.float32_math());
  Var out = tape.record(y, "conv2d", inputs, [x, weight, bias, xv, wv, params](const Var& out) {
    Tape& t = out.tape();
    const Tape::GradTarget gx = written_whole(t, x);
    const Tensor grad_bias = bias.defined() ? grad_if_needed(t, bias) : Tensor();
    if (!is_16bit(xv.dtype())) {
      conv2d_backward(gx.grad, grad_if_needed(t, weight), grad_bias, out.grad(), xv, wv, params,
                      t.stream(), write_of(gx), t.float32_math());
      return;
    }
    // The bias is float32: its gradient sums the float32 output gradient.
    const Tensor grad_weight = grad_if_needed(t, weight);
    if (!conv2d_multiplies_16bit(xv.shape(), wv.shape(), xv.dtype(), params, t.stream())) {
      // Where conv2d widens 16-bit operands into float32 scratch (the CPU, but for its
      // bfloat16 GEMM path: kernels/conv2d.h): here
      // the output gradient is rounded and widened in one pass (round_through) and the
      // float32 passes run on the operands widened as the kernel would widen them
      // (x read for grad_weight only, weight for grad_x only): the same values and
      // sums, one pass over the output gradient and one copy of it fewer.
      const Stream& s = t.stream();
      const Tensor& g = out.grad();  // float32, or already rounded (grad_target_rounded)
      conv2d_backward(gx.grad, grad_weight, Tensor(),
                      g.dtype() == DType::Float32 ? round_through(g, xv.dtype(), s) : widened(g, s),
                      grad_weight.defined() ? widened(xv, s) : Tensor::empty(xv.shape(), s),
                      gx.grad.defined() ? widened(wv, s) : Tensor::empty(wv.shape(), s), params, s,
                      write_of(gx), t.float32_math());
    } else {
      conv2d_backward(gx.grad, grad_weight, Tensor(),
                      gemm_grad_output(out.grad(), xv.dtype(), t.stream()), xv, wv, params,
                      t.stream(), write_of(gx), t.float32_math());
    }
    if (grad_bias.defined()) bias_add_backward(grad_bias, out.grad(), t.stream());
  });
  // Without a bias (whose gradient sums the float32 output gradient) a 16-bit
  // convolution's backward reads its output gradient only rounded to xv's dtype.
  if (out.requires_grad() && is_16bit(xv.dtype()) && !bias.defined()) {
    tape.set_grad_read_rounded(out, xv.dtype());
  }
  return out;
}

Var max_pool2d(const Var& x, const Pool2dParams& params) {
  Tape& tape = x.tape();
  tape.check_owns("max_pool2d", {x});
  Tensor y = new_tensor(tape, pool2d_output_shape(x.shape(), params), x);
  if (!x.requires_grad() || !tape.grad_enabled()) {  // no backward will read an argmax
    max_pool2d_forward(y, x.value(), params, tape.stream());
    return tape.record(y, "max_pool2d", {x}, nullptr);
  }
  // float32 for a 16-bit x: bfloat16 cannot hold a plane's positions (kernels/pool2d.h).
  Tensor argmax = Tensor::empty(y.shape(), tape.stream(), pool2d_argmax_dtype(x.value().dtype()));
  max_pool2d_forward_with_argmax(y, argmax, x.value(), params, tape.stream());
  return tape.record(y, "max_pool2d", {x}, [x, argmax, params](const Var& out) {
    Tape& t = out.tape();
    const Tape::GradTarget gx = t.grad_target(x);  // every element of grad_x is written
    max_pool2d_backward_from_argmax(gx.grad, out.grad(), argmax, params, t.stream(), write_of(gx));
  });
}

Var avg_pool2d(const Var& x, const Pool2dParams& params) {
  Tape& tape = x.tape();
  tape.check_owns("avg_pool2d", {x});
  Tensor y = new_tensor(tape, pool2d_output_shape(x.shape(), params), x);
  avg_pool2d_forward(y, x.value(), params, tape.stream());
  return tape.record(y, "avg_pool2d", {x}, [x, params](const Var& out) {
    Tape& t = out.tape();
    avg_pool2d_backward(t.grad_for(x), out.grad(), params, t.stream());
  });
}

Var global_avg_pool2d(const Var& x) {
  TL_CHECK(x.value().dim() == 4 && x.shape()[2] > 0 && x.shape()[3] > 0, ShapeError,
           "global_avg_pool2d: x " << x.describe() << " must be [N,C,H,W] with H, W >= 1");
  Tape& tape = x.tape();
  tape.check_owns("global_avg_pool2d", {x});
  // One op rather than avg_pool2d then reshape: the same values, and no reshape's
  // gradient copy (whose kernels take no 16-bit tensors).
  const Shape& s = x.shape();
  const Pool2dParams plane = {s[2], s[3], 1, 1, 0, 0};
  Tensor y = new_tensor(tape, {s[0], s[1]}, x);
  avg_pool2d_forward(y.reshape({s[0], s[1], 1, 1}), x.value(), plane, tape.stream());
  return tape.record(y, "global_avg_pool2d", {x}, [x, plane](const Var& out) {
    Tape& t = out.tape();
    const Shape& g = out.grad().shape();
    avg_pool2d_backward(t.grad_for(x), out.grad().reshape({g[0], g[1], 1, 1}), plane, t.stream());
  });
}

Var batchnorm(const Var& x, const Var& gamma, const Var& beta, const Tensor& moving_mean,
              const Tensor& moving_var, bool training, double momentum, double eps,
              Activation activation) {
  Tape& tape = x.tape();
  tape.check_owns("batchnorm", {x, gamma, beta});
  TL_CHECK((x.value().dim() == 2 || x.value().dim() == 4) && gamma.value().dim() == 1 &&
               gamma.shape()[0] == x.shape()[1],
           ShapeError,
           "batchnorm: " << gamma.describe() << " does not match the channels of " << x.describe()
                         << " (expected [N,C] or [N,C,H,W] with C = " << gamma.shape()[0] << ")");
  Tensor y = new_tensor(tape, x.shape(), x);
  if (!training) {
    batchnorm_forward_inference({.y = y,
                                 .x = x.value(),
                                 .gamma = gamma.value(),
                                 .beta = beta.value(),
                                 .moving_mean = moving_mean,
                                 .moving_var = moving_var,
                                 .eps = eps,
                                 .activation = activation},
                                tape.stream());
    // Inference through moving statistics is affine in x; training never takes this path.
    return tape.record(y, "batchnorm", {x, gamma, beta}, [](const Var& out) {
      TL_THROW(NotSupported, "batchnorm: backward of the inference form ("
                                 << out.describe()
                                 << ") is not implemented; train in training mode");
    });
  }
  // The statistics in gamma's dtype: x's, or float32 beside a 16-bit x (kernels/batchnorm.h).
  const std::int64_t channels = x.shape()[1];
  Tensor save_mean = new_tensor(tape, {channels}, gamma);
  Tensor save_inv_std = new_tensor(tape, {channels}, gamma);
  batchnorm_forward_training({.y = y,
                              .save_mean = save_mean,
                              .save_inv_std = save_inv_std,
                              .moving_mean = moving_mean,
                              .moving_var = moving_var,
                              .x = x.value(),
                              .gamma = gamma.value(),
                              .beta = beta.value(),
                              .eps = eps,
                              .momentum = momentum,
                              .activation = activation},
                             tape.stream());
  const bool relu = activation == Activation::ReLU;
  return tape.record(y, relu ? "batchnorm_relu" : "batchnorm", {x, gamma, beta},
                     [x, gamma, beta, save_mean, save_inv_std, activation](const Var& out) {
                       Tape& t = out.tape();
                       const Tape::GradTarget gx = batchnorm_grad_x_target(t, x);
                       batchnorm_backward({.grad_x = gx.grad,
                                           .grad_gamma = grad_if_needed(t, gamma),
                                           .grad_beta = grad_if_needed(t, beta),
                                           .grad_y = out.grad(),
                                           .x = batchnorm_backward_x(x.value(), t.stream()),
                                           .gamma = gamma.value(),
                                           .beta = beta.value(),
                                           .save_mean = save_mean,
                                           .save_inv_std = save_inv_std,
                                           .activation = activation,
                                           .grad_x_write = write_of(gx)},
                                          t.stream());
                     });
}

Var batchnorm_max_pool2d(const Var& x, const Var& gamma, const Var& beta, const Tensor& moving_mean,
                         const Tensor& moving_var, bool training, const Pool2dParams& pool,
                         double momentum, double eps, Activation activation) {
  Tape& tape = x.tape();
  if (!training || !tape.stream().device().is_cpu()) {
    return max_pool2d(
        batchnorm(x, gamma, beta, moving_mean, moving_var, training, momentum, eps, activation),
        pool);
  }
  const char* op = "batchnorm_max_pool2d";
  tape.check_owns(op, {x, gamma, beta});
  TL_CHECK(x.value().dim() == 4 && gamma.value().dim() == 1 && gamma.shape()[0] == x.shape()[1],
           ShapeError,
           op << ": " << gamma.describe() << " does not match the channels of " << x.describe()
              << " (expected [N,C,H,W] with C = " << gamma.shape()[0] << ")");
  // A 16-bit x runs the fused kernels in its dtype (y too); the statistics are in
  // gamma's dtype and the argmax float32 (kernels/batchnorm.h), and the backward,
  // as batchnorm's, widens the saved x to meet the float32 gradients.
  Tensor y = new_tensor(tape, pool2d_output_shape(x.shape(), pool, op), x);
  const std::int64_t channels = x.shape()[1];
  Tensor save_mean = new_tensor(tape, {channels}, gamma);
  Tensor save_inv_std = new_tensor(tape, {channels}, gamma);
  Tensor argmax = Tensor::empty(y.shape(), tape.stream(), pool2d_argmax_dtype(x.value().dtype()));
  batchnorm_max_pool_forward_training({.y = y,
                                       .argmax = argmax,
                                       .save_mean = save_mean,
                                       .save_inv_std = save_inv_std,
                                       .moving_mean = moving_mean,
                                       .moving_var = moving_var,
                                       .x = x.value(),
                                       .gamma = gamma.value(),
                                       .beta = beta.value(),
                                       .eps = eps,
                                       .momentum = momentum,
                                       .pool = pool,
                                       .activation = activation},
                                      tape.stream());
  const bool relu = activation == Activation::ReLU;
  return tape.record(y, relu ? "batchnorm_relu_max_pool2d" : op, {x, gamma, beta},
                     [x, gamma, beta, argmax, save_mean, save_inv_std, pool](const Var& out) {
                       Tape& t = out.tape();
                       const Tape::GradTarget gx = batchnorm_grad_x_target(t, x);
                       batchnorm_max_pool_backward(
                           {.grad_x = gx.grad,
                            .grad_gamma = grad_if_needed(t, gamma),
                            .grad_beta = grad_if_needed(t, beta),
                            .grad_y = out.grad(),
                            .argmax = argmax,
                            .x = batchnorm_backward_x(x.value(), t.stream()),
                            .gamma = gamma.value(),
                            .save_mean = save_mean,
                            .save_inv_std = save_inv_std,
                            .pool = pool,
                            .grad_x_write = write_of(gx)},
                           t.stream());
                     });
}

Var sync_batchnorm(const Var& x, const Var& gamma, const Var& beta, const Tensor& moving_mean,
                   const Tensor& moving_var, BatchNormSync& sync, int tower, double momentum,
                   double eps, Activation activation) {
  Tape& tape = x.tape();
  tape.check_owns("sync_batchnorm", {x, gamma, beta});
  TL_CHECK(
      (x.value().dim() == 2 || x.value().dim() == 4) && gamma.value().dim() == 1 &&
          gamma.shape()[0] == x.shape()[1],
      ShapeError,
      "sync_batchnorm: " << gamma.describe() << " does not match the channels of " << x.describe());
  const std::int64_t channels = x.shape()[1];
  const std::int64_t local_count = x.value().numel() / std::max<std::int64_t>(channels, 1);
  // The statistics in gamma's dtype: x's, or float32 beside a 16-bit x (kernels/batchnorm.h).
  Tensor mean = new_tensor(tape, {channels}, gamma);
  Tensor m2 = new_tensor(tape, {channels}, gamma);
  batchnorm_stats({.mean = mean, .m2 = m2, .x = x.value()}, tape.stream());
  const std::int64_t total = sync.merge_stats(tower, mean, m2, local_count, tape.stream());
  Tensor y = new_tensor(tape, x.shape(), x);
  Tensor inv_std = new_tensor(tape, {channels}, gamma);
  batchnorm_forward_from_stats({.y = y,
                                .inv_std = inv_std,
                                .moving_mean = moving_mean,
                                .moving_var = moving_var,
                                .x = x.value(),
                                .gamma = gamma.value(),
                                .beta = beta.value(),
                                .mean = mean,
                                .m2 = m2,
                                .count = total,
                                .eps = eps,
                                .momentum = momentum,
                                .activation = activation},
                               tape.stream());
  const bool relu = activation == Activation::ReLU;
  return tape.record(
      y, relu ? "sync_batchnorm_relu" : "sync_batchnorm", {x, gamma, beta},
      [x, gamma, beta, mean, inv_std, total, tower, &sync, activation](const Var& out) {
        Tape& t = out.tape();
        const Stream& s = t.stream();
        const Tensor xw = batchnorm_backward_x(x.value(), s);  // beside the float32 grads
        const std::int64_t c = mean.numel();
        Tensor sum_grad_y = Tensor::empty({c}, s, mean.dtype());
        Tensor sum_grad_y_xhat = Tensor::empty({c}, s, mean.dtype());
        batchnorm_backward_reduce({.sum_grad_y = sum_grad_y,
                                   .sum_grad_y_xhat = sum_grad_y_xhat,
                                   .grad_y = out.grad(),
                                   .x = xw,
                                   .gamma = gamma.value(),
                                   .beta = beta.value(),
                                   .mean = mean,
                                   .inv_std = inv_std,
                                   .activation = activation},
                                  s);
        // This tower's share of dL/dbeta and dL/dgamma: the gradient all-reduce adds
        // the rest.
        if (beta.requires_grad()) axpy(t.grad_for(beta), 1.0, sum_grad_y, s);
        if (gamma.requires_grad()) axpy(t.grad_for(gamma), 1.0, sum_grad_y_xhat, s);
        // dL/dx depends on every tower's samples through the shared statistics.
        sync.sum(tower, sum_grad_y, sum_grad_y_xhat, s);
        if (x.requires_grad()) {
          const Tape::GradTarget gx = batchnorm_grad_x_target(t, x);  // every element written
          batchnorm_backward_apply({.grad_x = gx.grad,
                                    .grad_y = out.grad(),
                                    .x = xw,
                                    .gamma = gamma.value(),
                                    .beta = beta.value(),
                                    .mean = mean,
                                    .inv_std = inv_std,
                                    .sum_grad_y = sum_grad_y,
                                    .sum_grad_y_xhat = sum_grad_y_xhat,
                                    .count = total,
                                    .activation = activation,
                                    .grad_x_write = write_of(gx)},
                                   s);
        }
      });
}

}  // namespace towerlab::ag
