// Checks and backend dispatch for batch normalization (kernels/batchnorm.h). Each
// entry point checks its argument struct once, fills the backends' BatchNormArgs
// (kernels/cpu/batchnorm.h) and runs the steps below, which check nothing. The
// single-device training forward and backward are the split API's steps run in
// sequence, so that synchronized batch norm reuses exactly these steps.
#include "kernels/batchnorm.h"

#include "kernels/checks.h"
#include "kernels/cpu/batchnorm.h"
#include "kernels/cuda/batchnorm.h"
#include "kernels/elementwise.h"

namespace towerlab {

namespace {

// --- checks ----------------------------------------------------------------------

// The backend arguments with x and its view as [N,C,S] (S = H*W, 1 for [N,C]); each
// entry point below fills in the rest once its checks pass. x may be float32,
// bfloat16 or float16 on every device, float64 on the CPU.
BatchNormArgs args_of(const char* op, const Tensor& x, const Stream& stream) {
  TL_CHECK(x.defined(), InvalidArgument, op << ": x is undefined");
  kernels::check_placed(op, stream, {{"x", &x}});
  TL_CHECK(x.dim() == 2 || x.dim() == 4, ShapeError,
           op << ": x must be [N,C] or [N,C,H,W], got " << x.describe());
  TL_CHECK(!stream.device().is_cuda() || x.dtype() != DType::Float64, NotSupported,
           op << ": x is " << x.describe()
              << "; float64 runs on the CPU only (float32, bfloat16, float16 on cuda)");
  BatchNormArgs a;
  a.N = x.size(0);
  a.C = x.size(1);
  a.S = x.dim() == 4 ? x.size(2) * x.size(3) : 1;
  a.x = x;
  return a;
}

void check_channels(const char* op, const Tensor& x, std::int64_t C,
                    std::initializer_list<kernels::NamedTensor> tensors) {
  for (const kernels::NamedTensor& t : tensors) {
    TL_CHECK(t.second->dim() == 1 && t.second->size(0) == C, ShapeError,
             op << ": " << t.first << " is " << t.second->describe() << " but x " << x.describe()
                << " has " << C << " channels (expected [" << C << "])");
  }
}

// The dtype of the per-channel tensors beside x: x's own, or float32 beside a
// 16-bit x (the parameters and statistics stay float32).
DType per_channel_dtype(const Tensor& x) {
  return is_16bit(x.dtype()) ? DType::Float32 : x.dtype();
}

// Per-channel tensors: defined, on the stream, of per_channel_dtype(x), and [C].
void check_per_channel(const char* op, const BatchNormArgs& a, const Stream& stream,
                       std::initializer_list<kernels::NamedTensor> tensors) {
  const DType dtype = per_channel_dtype(a.x);
  for (const kernels::NamedTensor& t : tensors) {
    kernels::check_placed(op, stream, {t});
    TL_CHECK(t.second->dtype() == dtype, ShapeError,
             op << ": " << t.first << " is " << t.second->describe() << " but x is "
                << a.x.describe() << ", whose per-channel tensors are " << dtype_name(dtype)
                << (is_16bit(a.x.dtype())
                        ? " (beside 16-bit activations the parameters and statistics stay float32)"
                        : ""));
  }
  check_channels(op, a.x, a.C, tensors);
}

// A backward's gradient t (grad_y or grad_x, named `name`): on the stream, of x's
// dtype, or float32 beside a 16-bit x on the CPU (the policy's float32 gradients,
// x read widened: kernels/batchnorm.h), and of x's shape unless `any_shape` (a
// pooled grad_y, whose shape set_max_pool checks).
void check_gradient(const char* op, const Tensor& x, const char* name, const Tensor& t,
                    const Stream& stream, bool any_shape = false) {
  if (is_16bit(x.dtype()) && t.defined() && t.dtype() == DType::Float32) {
    TL_CHECK(stream.device().is_cpu(), NotSupported,
             op << ": " << name << " is " << t.describe() << " beside x " << x.describe()
                << ": float32 gradients beside a 16-bit x run on the CPU; on "
                << stream.device().str() << " widen x to float32 first");
    kernels::check_placed(op, stream, {{name, &t}});
    TL_CHECK(any_shape || t.shape() == x.shape(), ShapeError,
             op << ": " << name << " is " << t.describe() << " but x is " << x.describe());
  } else if (any_shape) {
    kernels::check_placed(op, stream, {{"x", &x}, {name, &t}});
  } else {
    kernels::check_same_shape_any_dtype(op, stream, {{"x", &x}, {name, &t}});
  }
}

// grad_x, where given, is of grad_y's dtype (both x's, or both float32), or x's
// 16-bit dtype beside float32 grad_y (rounded as it is stored; check_gradient has
// placed the float32 grad_y on the CPU).
void check_gradients_agree(const char* op, const Tensor& x, const Tensor& grad_y,
                           const Tensor& grad_x) {
  TL_CHECK(!grad_x.defined() || !grad_y.defined() || grad_x.dtype() == grad_y.dtype() ||
               (grad_y.dtype() == DType::Float32 && grad_x.dtype() == x.dtype()),
           ShapeError,
           op << ": grad_x is " << grad_x.describe() << " but grad_y is " << grad_y.describe()
              << " (the gradients share one dtype: x's, or float32 beside a 16-bit x, whose"
                 " grad_x may also be x's dtype)");
}

// Per-channel tensors that may be undefined (not computed): checked where given.
void check_optional_per_channel(const char* op, const BatchNormArgs& a, const Stream& stream,
                                std::initializer_list<kernels::NamedTensor> tensors) {
  for (const kernels::NamedTensor& t : tensors) {
    if (t.second->defined()) check_per_channel(op, a, stream, {t});
  }
}

// A backward's fused ReLU: the forward's gamma and beta, from which it recomputes
// the forward's mask. Sets the activation, gamma and beta in `a`.
void set_relu(const char* op, BatchNormArgs& a, Activation activation, const Tensor& gamma,
              const Tensor& beta, const Stream& stream) {
  if (activation != Activation::ReLU) return;
  TL_CHECK(gamma.defined() && beta.defined(), InvalidArgument,
           op << ": the ReLU backward needs the forward's gamma and beta (gamma is "
              << (gamma.defined() ? "defined" : "undefined") << ", beta is "
              << (beta.defined() ? "defined" : "undefined") << ")");
  check_per_channel(op, a, stream, {{"gamma", &gamma}, {"beta", &beta}});
  a.activation = Activation::ReLU;
  a.gamma = gamma;
  a.beta = beta;
}

// Both moving statistics or neither; sets them in `a` when given.
void set_moving(const char* op, BatchNormArgs& a, const Tensor& moving_mean,
                const Tensor& moving_var, const Stream& stream) {
  TL_CHECK(moving_mean.defined() == moving_var.defined(), InvalidArgument,
           op << ": give both moving_mean and moving_var, or neither (moving_mean is "
              << (moving_mean.defined() ? "defined" : "undefined") << ", moving_var is "
              << (moving_var.defined() ? "defined" : "undefined") << ")");
  if (!moving_mean.defined()) return;
  check_per_channel(op, a, stream, {{"moving_mean", &moving_mean}, {"moving_var", &moving_var}});
  a.moving_mean = moving_mean;
  a.moving_var = moving_var;
}

void check_eps_momentum(const char* op, double eps, double momentum) {
  TL_CHECK(eps >= 0.0, InvalidArgument, op << ": eps must be >= 0, got " << eps);
  TL_CHECK(momentum >= 0.0 && momentum <= 1.0, InvalidArgument,
           op << ": momentum must be in [0, 1] (TensorFlow's decay: the weight of the old "
                 "moving value), got "
              << momentum);
}

// A single-device training forward (BatchNormForwardTraining or
// BatchNormMaxPoolForwardTraining), once y is checked: its per-channel outputs and
// inputs, the moving statistics, eps and momentum, and at least 2 values per
// channel. Fills in `a` everything but y (and argmax), with `m2` as the scratch for
// the statistics.
template <typename Args>
void set_training_forward(const char* op, BatchNormArgs& a, const Args& args,
                          const Stream& stream) {
  check_per_channel(op, a, stream,
                    {{"save_mean", &args.save_mean},
                     {"save_inv_std", &args.save_inv_std},
                     {"gamma", &args.gamma},
                     {"beta", &args.beta}});
  TL_CHECK(a.C == 0 || a.N * a.S >= 2, InvalidArgument,
           op << ": training needs at least 2 values per channel, x is " << a.x.describe());
  set_moving(op, a, args.moving_mean, args.moving_var, stream);
  check_eps_momentum(op, args.eps, args.momentum);
  a.gamma = args.gamma;
  a.beta = args.beta;
  a.mean = args.save_mean;
  a.inv_std = args.save_inv_std;
  a.count = a.N * a.S;
  a.eps = args.eps;
  a.momentum = args.momentum;
  a.activation = args.activation;
}

// A single-device backward (BatchNormBackward or BatchNormMaxPoolBackward), once
// grad_y is checked: the forward's gamma and statistics, and the gradients given.
// Fills in `a` the inputs of the reduction and count; the caller adds the sums and
// grad_x.
template <typename Args>
void set_backward(const char* op, BatchNormArgs& a, const Args& args, const Stream& stream) {
  check_per_channel(op, a, stream,
                    {{"gamma", &args.gamma},
                     {"save_mean", &args.save_mean},
                     {"save_inv_std", &args.save_inv_std}});
  check_gradients_agree(op, args.x, args.grad_y, args.grad_x);
  if (args.grad_x.defined()) check_gradient(op, args.x, "grad_x", args.grad_x, stream);
  check_optional_per_channel(op, a, stream,
                             {{"grad_gamma", &args.grad_gamma}, {"grad_beta", &args.grad_beta}});
  a.grad_y = args.grad_y;
  a.gamma = args.gamma;
  a.mean = args.save_mean;
  a.inv_std = args.save_inv_std;
  a.count = a.N * a.S;
}

template <typename Args>
bool wants_gradients(const Args& args) {
  return args.grad_x.defined() || args.grad_gamma.defined() || args.grad_beta.defined();
}

// grad_gamma and grad_beta (where given) accumulate the reduction's sums.
template <typename Args>
void add_parameter_gradients(const Args& args, const BatchNormArgs& a, const Stream& stream) {
  if (args.grad_gamma.defined()) add(args.grad_gamma, args.grad_gamma, a.sum_grad_y_xhat, stream);
  if (args.grad_beta.defined()) add(args.grad_beta, args.grad_beta, a.sum_grad_y, stream);
}

// --- the steps, on checked arguments ---------------------------------------------

void run_stats(const BatchNormArgs& a, const Stream& stream) {
  if (a.x.numel() == 0) {  // an empty partial: count 0, mean 0, m2 0
    fill(a.mean, 0.0, stream);
    fill(a.m2, 0.0, stream);
    return;
  }
  TL_DISPATCH(stream, cpu::batchnorm_stats(a), cuda::batchnorm_stats(a, stream));
}

void run_forward_from_stats(const BatchNormArgs& a, const Stream& stream) {
  TL_DISPATCH(stream, cpu::batchnorm_forward_from_stats(a),
              cuda::batchnorm_forward_from_stats(a, stream));
}

void run_backward_reduce(const BatchNormArgs& a, const Stream& stream) {
  if (a.x.numel() == 0) {  // an empty tower's share of the sums
    fill(a.sum_grad_y, 0.0, stream);
    fill(a.sum_grad_y_xhat, 0.0, stream);
    return;
  }
  TL_DISPATCH(stream, cpu::batchnorm_backward_reduce(a),
              cuda::batchnorm_backward_reduce(a, stream));
}

void run_backward_apply(const BatchNormArgs& a, const Stream& stream) {
  TL_DISPATCH(stream, cpu::batchnorm_backward_apply(a), cuda::batchnorm_backward_apply(a, stream));
}

// The fields a forward's arguments (BatchNormForwardFromStats, BatchNormForwardInference)
// pass through unchanged once checked: y and the affine transform with its ReLU.
template <typename Args>
void take_affine(BatchNormArgs& a, const Args& args) {
  a.y = args.y;
  a.gamma = args.gamma;
  a.beta = args.beta;
  a.eps = args.eps;
  a.activation = args.activation;
}

// The fields both steps of the split backward (BatchNormBackwardReduce,
// BatchNormBackwardApply) pass through once checked: grad_y, the statistics and the sums.
template <typename Args>
void take_reduction(BatchNormArgs& a, const Args& args) {
  a.grad_y = args.grad_y;
  a.mean = args.mean;
  a.inv_std = args.inv_std;
  a.sum_grad_y = args.sum_grad_y;
  a.sum_grad_y_xhat = args.sum_grad_y_xhat;
}

// grad_x and how it is written, from a backward's arguments.
template <typename Args>
void take_grad_x(BatchNormArgs& a, const Args& args) {
  a.grad_x = args.grad_x;
  a.grad_x_write = args.grad_x_write;
}

// The [C] sums of a backward's reduction, in `a`.
void make_sums(BatchNormArgs& a, const Stream& stream) {
  a.sum_grad_y = Tensor::empty({a.C}, stream, per_channel_dtype(a.x));
  a.sum_grad_y_xhat = Tensor::empty({a.C}, stream, per_channel_dtype(a.x));
}

}  // namespace

// --- split API: forward ----------------------------------------------------------

void batchnorm_stats(const BatchNormPartialStats& args, const Stream& stream) {
  const char* op = "batchnorm_stats";
  BatchNormArgs d = args_of(op, args.x, stream);
  check_per_channel(op, d, stream, {{"mean", &args.mean}, {"m2", &args.m2}});
  if (d.C == 0) return;
  d.mean = args.mean;
  d.m2 = args.m2;
  run_stats(d, stream);
}

void batchnorm_merge_stats(const BatchNormMergeStats& args, const Stream& stream) {
  const char* op = "batchnorm_merge_stats";
  kernels::check_same_shape(op, stream,
                            {{"mean_a", &args.mean_a},
                             {"m2_a", &args.m2_a},
                             {"mean_b", &args.mean_b},
                             {"m2_b", &args.m2_b}});
  TL_CHECK(args.mean_a.dim() == 1, ShapeError,
           op << ": mean_a must be [C], got " << args.mean_a.describe());
  TL_CHECK(args.count_a >= 0 && args.count_b >= 0, InvalidArgument,
           op << ": counts must be >= 0, got " << args.count_a << " and " << args.count_b);
  if (stream.device().is_cuda()) kernels::check_float32(op, "mean_a", args.mean_a);
  if (args.mean_a.numel() == 0 || args.count_b == 0) return;
  TL_DISPATCH(stream, cpu::batchnorm_merge_stats(args), cuda::batchnorm_merge_stats(args, stream));
}

void batchnorm_forward_from_stats(const BatchNormForwardFromStats& args, const Stream& stream) {
  const char* op = "batchnorm_forward_from_stats";
  BatchNormArgs d = args_of(op, args.x, stream);
  kernels::check_same_shape_any_dtype(op, stream, {{"x", &args.x}, {"y", &args.y}});
  check_per_channel(op, d, stream,
                    {{"inv_std", &args.inv_std},
                     {"gamma", &args.gamma},
                     {"beta", &args.beta},
                     {"mean", &args.mean},
                     {"m2", &args.m2}});
  set_moving(op, d, args.moving_mean, args.moving_var, stream);
  check_eps_momentum(op, args.eps, args.momentum);
  TL_CHECK(args.count >= 2, InvalidArgument,
           op << ": training needs at least 2 values per channel, got count " << args.count
              << " (x " << args.x.describe() << ")");
  if (d.C == 0) return;
  // Not "return on empty x": a tower with no samples still takes its share of the
  // per-channel outputs (inv_std, moving statistics) in synchronized batch norm.
  take_affine(d, args);
  d.mean = args.mean;
  d.m2 = args.m2;
  d.inv_std = args.inv_std;
  d.count = args.count;
  d.momentum = args.momentum;
  run_forward_from_stats(d, stream);
}

// --- split API: backward ---------------------------------------------------------

void batchnorm_backward_reduce(const BatchNormBackwardReduce& args, const Stream& stream) {
  const char* op = "batchnorm_backward_reduce";
  BatchNormArgs d = args_of(op, args.x, stream);
  set_relu(op, d, args.activation, args.gamma, args.beta, stream);
  check_gradient(op, args.x, "grad_y", args.grad_y, stream);
  check_per_channel(op, d, stream,
                    {{"sum_grad_y", &args.sum_grad_y},
                     {"sum_grad_y_xhat", &args.sum_grad_y_xhat},
                     {"mean", &args.mean},
                     {"inv_std", &args.inv_std}});
  if (d.C == 0) return;
  take_reduction(d, args);
  run_backward_reduce(d, stream);
}

void batchnorm_backward_apply(const BatchNormBackwardApply& args, const Stream& stream) {
  const char* op = "batchnorm_backward_apply";
  BatchNormArgs d = args_of(op, args.x, stream);
  set_relu(op, d, args.activation, args.gamma, args.beta, stream);
  check_gradients_agree(op, args.x, args.grad_y, args.grad_x);
  check_gradient(op, args.x, "grad_x", args.grad_x, stream);
  check_gradient(op, args.x, "grad_y", args.grad_y, stream);
  check_per_channel(op, d, stream,
                    {{"gamma", &args.gamma},
                     {"mean", &args.mean},
                     {"inv_std", &args.inv_std},
                     {"sum_grad_y", &args.sum_grad_y},
                     {"sum_grad_y_xhat", &args.sum_grad_y_xhat}});
  TL_CHECK(
      args.count >= 1, InvalidArgument,
      op << ": count must be >= 1 (values per channel over the whole batch), got " << args.count);
  if (args.x.numel() == 0) return;
  take_reduction(d, args);
  take_grad_x(d, args);
  d.gamma = args.gamma;
  d.count = args.count;
  run_backward_apply(d, stream);
}

// --- single-device compositions --------------------------------------------------

void batchnorm_forward_training(const BatchNormForwardTraining& args, const Stream& stream) {
  const char* op = "batchnorm_forward_training";
  BatchNormArgs d = args_of(op, args.x, stream);
  kernels::check_same_shape_any_dtype(op, stream, {{"x", &args.x}, {"y", &args.y}});
  set_training_forward(op, d, args, stream);
  if (d.C == 0) return;
  d.y = args.y;
  d.m2 = Tensor::empty({d.C}, stream, per_channel_dtype(args.x));
  run_stats(d, stream);
  run_forward_from_stats(d, stream);
}

void batchnorm_forward_inference(const BatchNormForwardInference& args, const Stream& stream) {
  const char* op = "batchnorm_forward_inference";
  BatchNormArgs d = args_of(op, args.x, stream);
  kernels::check_same_shape_any_dtype(op, stream, {{"x", &args.x}, {"y", &args.y}});
  check_per_channel(op, d, stream,
                    {{"gamma", &args.gamma},
                     {"beta", &args.beta},
                     {"moving_mean", &args.moving_mean},
                     {"moving_var", &args.moving_var}});
  check_eps_momentum(op, args.eps, 0.0);
  if (args.x.numel() == 0) return;
  take_affine(d, args);
  d.moving_mean = args.moving_mean;
  d.moving_var = args.moving_var;
  TL_DISPATCH(stream, cpu::batchnorm_forward_inference(d),
              cuda::batchnorm_forward_inference(d, stream));
}

void batchnorm_backward(const BatchNormBackward& args, const Stream& stream) {
  const char* op = "batchnorm_backward";
  BatchNormArgs d = args_of(op, args.x, stream);
  set_relu(op, d, args.activation, args.gamma, args.beta, stream);
  check_gradients_agree(op, args.x, args.grad_y, args.grad_x);
  check_gradient(op, args.x, "grad_y", args.grad_y, stream);
  set_backward(op, d, args, stream);
  if (d.C == 0 || !wants_gradients(args)) return;
  make_sums(d, stream);
  run_backward_reduce(d, stream);
  if (args.grad_x.defined() && args.x.numel() > 0) {
    take_grad_x(d, args);
    run_backward_apply(d, stream);
  }
  add_parameter_gradients(args, d, stream);
}

// --- with a fused max pool (CPU) ---------------------------------------------------

namespace {

// The checks the fused max pool adds to args_of: a CPU stream, x [N,C,H,W], and
// `pooled` (y, or grad_y when `gradient`, named `name`) of x's dtype (a grad_y may
// be float32 beside a 16-bit x: check_gradient) and argmax of
// pool2d_argmax_dtype(x) (float32 beside a 16-bit x), both of the pool's shape.
// Sets max_pool, argmax, H, W, Ho, Wo in `a`.
void set_max_pool(const char* op, BatchNormArgs& a, const Pool2dParams& pool, const char* name,
                  const Tensor& pooled, const Tensor& argmax, const Stream& stream,
                  bool gradient = false) {
  TL_CHECK(stream.device().is_cpu(), NotSupported,
           op << ": the fused max pool runs on the CPU, not on " << stream.device().str()
              << " (compose batch norm and max_pool2d there, as ag::batchnorm_max_pool2d does)");
  TL_CHECK(a.x.dim() == 4, ShapeError, op << ": x must be [N,C,H,W], got " << a.x.describe());
  const Shape expected = pool2d_output_shape(a.x.shape(), pool, op);
  if (is_16bit(a.x.dtype())) {
    if (gradient) {
      check_gradient(op, a.x, name, pooled, stream, true);
    } else {
      kernels::check_placed(op, stream, {{"x", &a.x}, {name, &pooled}});
    }
    kernels::check_placed(op, stream, {{"argmax", &argmax}});
    TL_CHECK(argmax.dtype() == DType::Float32, ShapeError,
             op << ": argmax is " << argmax.describe() << " but x is " << a.x.describe()
                << ", whose argmax is float32 (as max_pool2d's, kernels/pool2d.h)");
  } else {
    kernels::check_on_stream(op, stream, {{"x", &a.x}, {name, &pooled}, {"argmax", &argmax}});
  }
  for (const kernels::NamedTensor& t :
       {kernels::NamedTensor{name, &pooled}, kernels::NamedTensor{"argmax", &argmax}}) {
    TL_CHECK(t.second->shape() == expected, ShapeError,
             op << ": " << t.first << " is " << t.second->describe() << " but the max pool of x "
                << a.x.describe() << " is " << to_string(expected));
  }
  // The argmax of a plane is held in pool2d_argmax_dtype(x) (kernels/pool2d.h).
  constexpr std::int64_t kExactFloat32 = std::int64_t{1} << 24;
  TL_CHECK(argmax.dtype() != DType::Float32 || a.S <= kExactFloat32, ShapeError,
           op << ": a plane of " << a.S << " values is larger than float32 positions can index ("
              << "at most 2^24), x " << a.x.describe());
  a.max_pool = pool;
  a.argmax = argmax;
  a.H = a.x.size(2);
  a.W = a.x.size(3);
  a.Ho = expected[2];
  a.Wo = expected[3];
}

}  // namespace

void batchnorm_max_pool_forward_training(const BatchNormMaxPoolForwardTraining& args,
                                         const Stream& stream) {
  const char* op = "batchnorm_max_pool_forward_training";
  BatchNormArgs d = args_of(op, args.x, stream);
  set_max_pool(op, d, args.pool, "y", args.y, args.argmax, stream);
  set_training_forward(op, d, args, stream);
  if (d.C == 0) return;
  d.y = args.y;
  d.m2 = Tensor::empty({d.C}, stream, per_channel_dtype(args.x));
  cpu::batchnorm_stats(d);
  cpu::batchnorm_forward_from_stats(d);
}

void batchnorm_max_pool_backward(const BatchNormMaxPoolBackward& args, const Stream& stream) {
  const char* op = "batchnorm_max_pool_backward";
  BatchNormArgs d = args_of(op, args.x, stream);
  set_max_pool(op, d, args.pool, "grad_y", args.grad_y, args.argmax, stream, true);
  set_backward(op, d, args, stream);
  if (d.C == 0 || !wants_gradients(args)) return;
  if (args.x.numel() == 0) return;
  make_sums(d, stream);
  cpu::batchnorm_backward_reduce(d);
  if (args.grad_x.defined()) {
    take_grad_x(d, args);
    cpu::batchnorm_backward_apply(d);
  }
  add_parameter_gradients(args, d, stream);
}

}  // namespace towerlab
