// Checks and backend dispatch for batch normalization (kernels/batchnorm.h). The
// single-device training forward and backward are written here as compositions
// of the split API, so that synchronized batch norm reuses exactly these steps.
#include "kernels/batchnorm.h"

#include "kernels/checks.h"
#include "kernels/cpu/batchnorm.h"
#include "kernels/cuda/batchnorm.h"
#include "kernels/elementwise.h"

namespace towerlab {

namespace {

// The backend arguments with x and its view as [N,C,S] (S = H*W, 1 for [N,C]); each
// entry point below fills in the rest once its checks pass.
BatchNormArgs args_of(const char* op, const Tensor& x, const Stream& stream) {
  TL_CHECK(x.defined(), InvalidArgument, op << ": x is undefined");
  TL_CHECK(x.dim() == 2 || x.dim() == 4, ShapeError,
           op << ": x must be [N,C] or [N,C,H,W], got " << x.describe());
  if (stream.device().is_cuda()) kernels::check_float32(op, "x", x);
  BatchNormArgs a;
  a.N = x.size(0);
  a.C = x.size(1);
  a.S = x.dim() == 4 ? x.size(2) * x.size(3) : 1;
  a.x = x;
  return a;
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
  kernels::check_on_stream(op, stream, {{"x", &a.x}, {"gamma", &gamma}, {"beta", &beta}});
  for (const Tensor* t : {&gamma, &beta}) {
    TL_CHECK(t->dim() == 1 && t->size(0) == a.C, ShapeError,
             op << ": " << (t == &gamma ? "gamma" : "beta") << " is " << t->describe() << " but x "
                << a.x.describe() << " has " << a.C << " channels (expected [" << a.C << "])");
  }
  a.activation = Activation::ReLU;
  a.gamma = gamma;
  a.beta = beta;
}

void check_channels(const char* op, const Tensor& x, std::int64_t C,
                    std::initializer_list<kernels::NamedTensor> tensors) {
  for (const kernels::NamedTensor& t : tensors) {
    TL_CHECK(t.second->dim() == 1 && t.second->size(0) == C, ShapeError,
             op << ": " << t.first << " is " << t.second->describe() << " but x " << x.describe()
                << " has " << C << " channels (expected [" << C << "])");
  }
}

// Both moving statistics or neither.
bool wants_moving(const char* op, const Tensor& moving_mean, const Tensor& moving_var) {
  TL_CHECK(moving_mean.defined() == moving_var.defined(), InvalidArgument,
           op << ": give both moving_mean and moving_var, or neither (moving_mean is "
              << (moving_mean.defined() ? "defined" : "undefined") << ", moving_var is "
              << (moving_var.defined() ? "defined" : "undefined") << ")");
  return moving_mean.defined();
}

void check_eps_momentum(const char* op, double eps, double momentum) {
  TL_CHECK(eps >= 0.0, InvalidArgument, op << ": eps must be >= 0, got " << eps);
  TL_CHECK(momentum >= 0.0 && momentum <= 1.0, InvalidArgument,
           op << ": momentum must be in [0, 1] (TensorFlow's decay: the weight of the old "
                 "moving value), got "
              << momentum);
}

// A single-device training forward's per-channel outputs and inputs, and at least
// 2 values per channel.
void check_training_forward(const char* op, const BatchNormArgs& d, const Tensor& save_mean,
                            const Tensor& save_inv_std, const Tensor& gamma, const Tensor& beta,
                            const Stream& stream) {
  kernels::check_on_stream(op, stream,
                           {{"x", &d.x},
                            {"save_mean", &save_mean},
                            {"save_inv_std", &save_inv_std},
                            {"gamma", &gamma},
                            {"beta", &beta}});
  check_channels(op, d.x, d.C,
                 {{"save_mean", &save_mean},
                  {"save_inv_std", &save_inv_std},
                  {"gamma", &gamma},
                  {"beta", &beta}});
  TL_CHECK(d.C == 0 || d.N * d.S >= 2, InvalidArgument,
           op << ": training needs at least 2 values per channel, x is " << d.x.describe());
}

}  // namespace

// --- split API: forward ----------------------------------------------------------

void batchnorm_stats(const Tensor& mean, const Tensor& m2, const Tensor& x, const Stream& stream) {
  const char* op = "batchnorm_stats";
  BatchNormArgs d = args_of(op, x, stream);
  kernels::check_on_stream(op, stream, {{"x", &x}, {"mean", &mean}, {"m2", &m2}});
  check_channels(op, x, d.C, {{"mean", &mean}, {"m2", &m2}});
  if (d.C == 0) return;
  if (x.numel() == 0) {  // an empty partial: count 0, mean 0, m2 0
    fill(mean, 0.0, stream);
    fill(m2, 0.0, stream);
    return;
  }
  d.mean = mean;
  d.m2 = m2;
  TL_DISPATCH(stream, cpu::batchnorm_stats(d), cuda::batchnorm_stats(d, stream));
}

void batchnorm_merge_stats(const Tensor& mean_a, const Tensor& m2_a, std::int64_t count_a,
                           const Tensor& mean_b, const Tensor& m2_b, std::int64_t count_b,
                           const Stream& stream) {
  const char* op = "batchnorm_merge_stats";
  kernels::check_same_shape(
      op, stream, {{"mean_a", &mean_a}, {"m2_a", &m2_a}, {"mean_b", &mean_b}, {"m2_b", &m2_b}});
  TL_CHECK(mean_a.dim() == 1, ShapeError, op << ": mean_a must be [C], got " << mean_a.describe());
  TL_CHECK(count_a >= 0 && count_b >= 0, InvalidArgument,
           op << ": counts must be >= 0, got " << count_a << " and " << count_b);
  if (stream.device().is_cuda()) kernels::check_float32(op, "mean_a", mean_a);
  if (mean_a.numel() == 0 || count_b == 0) return;
  TL_DISPATCH(stream, cpu::batchnorm_merge_stats(mean_a, m2_a, count_a, mean_b, m2_b, count_b),
              cuda::batchnorm_merge_stats(mean_a, m2_a, count_a, mean_b, m2_b, count_b, stream));
}

void batchnorm_forward_from_stats(const Tensor& y, const Tensor& inv_std, const Tensor& moving_mean,
                                  const Tensor& moving_var, const Tensor& x, const Tensor& gamma,
                                  const Tensor& beta, const Tensor& mean, const Tensor& m2,
                                  std::int64_t count, double eps, double momentum,
                                  const Stream& stream, Activation activation) {
  const char* op = "batchnorm_forward_from_stats";
  BatchNormArgs d = args_of(op, x, stream);
  kernels::check_same_shape(op, stream, {{"x", &x}, {"y", &y}});
  kernels::check_on_stream(op, stream,
                           {{"x", &x},
                            {"inv_std", &inv_std},
                            {"gamma", &gamma},
                            {"beta", &beta},
                            {"mean", &mean},
                            {"m2", &m2}});
  check_channels(
      op, x, d.C,
      {{"inv_std", &inv_std}, {"gamma", &gamma}, {"beta", &beta}, {"mean", &mean}, {"m2", &m2}});
  const bool moving = wants_moving(op, moving_mean, moving_var);
  if (moving) {
    kernels::check_on_stream(
        op, stream, {{"x", &x}, {"moving_mean", &moving_mean}, {"moving_var", &moving_var}});
    check_channels(op, x, d.C, {{"moving_mean", &moving_mean}, {"moving_var", &moving_var}});
  }
  check_eps_momentum(op, eps, momentum);
  TL_CHECK(count >= 2, InvalidArgument,
           op << ": training needs at least 2 values per channel, got count " << count << " (x "
              << x.describe() << ")");
  if (d.C == 0) return;
  // Not "return on empty x": a tower with no samples still takes its share of the
  // per-channel outputs (inv_std, moving statistics) in synchronized batch norm.
  d.y = y;
  d.gamma = gamma;
  d.beta = beta;
  d.mean = mean;
  d.m2 = m2;
  d.inv_std = inv_std;
  d.moving_mean = moving_mean;
  d.moving_var = moving_var;
  d.count = count;
  d.eps = eps;
  d.momentum = momentum;
  d.activation = activation;
  TL_DISPATCH(stream, cpu::batchnorm_forward_from_stats(d),
              cuda::batchnorm_forward_from_stats(d, stream));
}

// --- split API: backward ---------------------------------------------------------

void batchnorm_backward_reduce(const Tensor& sum_grad_y, const Tensor& sum_grad_y_xhat,
                               const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                               const Tensor& inv_std, const Stream& stream, Activation activation,
                               const Tensor& gamma, const Tensor& beta) {
  const char* op = "batchnorm_backward_reduce";
  BatchNormArgs d = args_of(op, x, stream);
  set_relu(op, d, activation, gamma, beta, stream);
  kernels::check_same_shape(op, stream, {{"x", &x}, {"grad_y", &grad_y}});
  kernels::check_on_stream(op, stream,
                           {{"x", &x},
                            {"sum_grad_y", &sum_grad_y},
                            {"sum_grad_y_xhat", &sum_grad_y_xhat},
                            {"mean", &mean},
                            {"inv_std", &inv_std}});
  check_channels(op, x, d.C,
                 {{"sum_grad_y", &sum_grad_y},
                  {"sum_grad_y_xhat", &sum_grad_y_xhat},
                  {"mean", &mean},
                  {"inv_std", &inv_std}});
  if (d.C == 0) return;
  if (x.numel() == 0) {  // an empty tower's share of the sums
    fill(sum_grad_y, 0.0, stream);
    fill(sum_grad_y_xhat, 0.0, stream);
    return;
  }
  d.grad_y = grad_y;
  d.mean = mean;
  d.inv_std = inv_std;
  d.sum_grad_y = sum_grad_y;
  d.sum_grad_y_xhat = sum_grad_y_xhat;
  TL_DISPATCH(stream, cpu::batchnorm_backward_reduce(d),
              cuda::batchnorm_backward_reduce(d, stream));
}

void batchnorm_backward_apply(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                              const Tensor& gamma, const Tensor& mean, const Tensor& inv_std,
                              const Tensor& sum_grad_y, const Tensor& sum_grad_y_xhat,
                              std::int64_t count, const Stream& stream, Activation activation,
                              const Tensor& beta, GradWrite grad_x_write) {
  const char* op = "batchnorm_backward_apply";
  BatchNormArgs d = args_of(op, x, stream);
  set_relu(op, d, activation, gamma, beta, stream);
  kernels::check_same_shape(op, stream, {{"x", &x}, {"grad_x", &grad_x}, {"grad_y", &grad_y}});
  kernels::check_on_stream(op, stream,
                           {{"x", &x},
                            {"gamma", &gamma},
                            {"mean", &mean},
                            {"inv_std", &inv_std},
                            {"sum_grad_y", &sum_grad_y},
                            {"sum_grad_y_xhat", &sum_grad_y_xhat}});
  check_channels(op, x, d.C,
                 {{"gamma", &gamma},
                  {"mean", &mean},
                  {"inv_std", &inv_std},
                  {"sum_grad_y", &sum_grad_y},
                  {"sum_grad_y_xhat", &sum_grad_y_xhat}});
  TL_CHECK(count >= 1, InvalidArgument,
           op << ": count must be >= 1 (values per channel over the whole batch), got " << count);
  if (x.numel() == 0) return;
  d.grad_x = grad_x;
  d.grad_x_write = grad_x_write;
  d.grad_y = grad_y;
  d.gamma = gamma;
  d.mean = mean;
  d.inv_std = inv_std;
  d.sum_grad_y = sum_grad_y;
  d.sum_grad_y_xhat = sum_grad_y_xhat;
  d.count = count;
  TL_DISPATCH(stream, cpu::batchnorm_backward_apply(d), cuda::batchnorm_backward_apply(d, stream));
}

// --- single-device compositions --------------------------------------------------

void batchnorm_forward_training(const Tensor& y, const Tensor& save_mean,
                                const Tensor& save_inv_std, const Tensor& moving_mean,
                                const Tensor& moving_var, const Tensor& x, const Tensor& gamma,
                                const Tensor& beta, double eps, double momentum,
                                const Stream& stream, Activation activation) {
  const char* op = "batchnorm_forward_training";
  const BatchNormArgs d = args_of(op, x, stream);
  kernels::check_same_shape(op, stream, {{"x", &x}, {"y", &y}});
  check_training_forward(op, d, save_mean, save_inv_std, gamma, beta, stream);
  if (d.C == 0) return;
  Tensor m2 = Tensor::empty({d.C}, stream, x.dtype());
  batchnorm_stats(save_mean, m2, x, stream);
  batchnorm_forward_from_stats(y, save_inv_std, moving_mean, moving_var, x, gamma, beta, save_mean,
                               m2, d.N * d.S, eps, momentum, stream, activation);
}

void batchnorm_forward_inference(const Tensor& y, const Tensor& x, const Tensor& gamma,
                                 const Tensor& beta, const Tensor& moving_mean,
                                 const Tensor& moving_var, double eps, const Stream& stream,
                                 Activation activation) {
  const char* op = "batchnorm_forward_inference";
  BatchNormArgs d = args_of(op, x, stream);
  kernels::check_same_shape(op, stream, {{"x", &x}, {"y", &y}});
  kernels::check_on_stream(op, stream,
                           {{"x", &x},
                            {"gamma", &gamma},
                            {"beta", &beta},
                            {"moving_mean", &moving_mean},
                            {"moving_var", &moving_var}});
  check_channels(op, x, d.C,
                 {{"gamma", &gamma},
                  {"beta", &beta},
                  {"moving_mean", &moving_mean},
                  {"moving_var", &moving_var}});
  check_eps_momentum(op, eps, 0.0);
  if (x.numel() == 0) return;
  d.y = y;
  d.gamma = gamma;
  d.beta = beta;
  d.moving_mean = moving_mean;
  d.moving_var = moving_var;
  d.eps = eps;
  d.activation = activation;
  TL_DISPATCH(stream, cpu::batchnorm_forward_inference(d),
              cuda::batchnorm_forward_inference(d, stream));
}

void batchnorm_backward(const Tensor& grad_x, const Tensor& grad_gamma, const Tensor& grad_beta,
                        const Tensor& grad_y, const Tensor& x, const Tensor& gamma,
                        const Tensor& save_mean, const Tensor& save_inv_std, const Stream& stream,
                        Activation activation, const Tensor& beta, GradWrite grad_x_write) {
  const char* op = "batchnorm_backward";
  const BatchNormArgs d = args_of(op, x, stream);
  if (grad_gamma.defined()) {
    kernels::check_on_stream(op, stream, {{"x", &x}, {"grad_gamma", &grad_gamma}});
    check_channels(op, x, d.C, {{"grad_gamma", &grad_gamma}});
  }
  if (grad_beta.defined()) {
    kernels::check_on_stream(op, stream, {{"x", &x}, {"grad_beta", &grad_beta}});
    check_channels(op, x, d.C, {{"grad_beta", &grad_beta}});
  }
  if (!grad_x.defined() && !grad_gamma.defined() && !grad_beta.defined()) return;
  Tensor sum_grad_y = Tensor::empty({d.C}, stream, x.dtype());
  Tensor sum_grad_y_xhat = Tensor::empty({d.C}, stream, x.dtype());
  batchnorm_backward_reduce(sum_grad_y, sum_grad_y_xhat, grad_y, x, save_mean, save_inv_std, stream,
                            activation, gamma, beta);
  if (grad_x.defined() && x.numel() > 0) {
    batchnorm_backward_apply(grad_x, grad_y, x, gamma, save_mean, save_inv_std, sum_grad_y,
                             sum_grad_y_xhat, d.N * d.S, stream, activation, beta, grad_x_write);
  }
  if (grad_gamma.defined()) add(grad_gamma, grad_gamma, sum_grad_y_xhat, stream);
  if (grad_beta.defined()) add(grad_beta, grad_beta, sum_grad_y, stream);
}

// --- with a fused max pool (CPU) ---------------------------------------------------

namespace {

// The checks the fused max pool adds to args_of: a CPU stream, x [N,C,H,W], and
// `pooled` (y or grad_y, named `name`) and argmax of the pool's shape. Sets
// max_pool, argmax, H, W, Ho, Wo in `a`.
void set_max_pool(const char* op, BatchNormArgs& a, const Pool2dParams& pool, const char* name,
                  const Tensor& pooled, const Tensor& argmax, const Stream& stream) {
  TL_CHECK(stream.device().is_cpu(), NotSupported,
           op << ": the fused max pool runs on the CPU, not on " << stream.device().str()
              << " (compose batch norm and max_pool2d there, as ag::batchnorm_max_pool2d does)");
  TL_CHECK(a.x.dim() == 4, ShapeError, op << ": x must be [N,C,H,W], got " << a.x.describe());
  const Shape expected = pool2d_output_shape(a.x.shape(), pool, op);
  kernels::check_on_stream(op, stream, {{"x", &a.x}, {name, &pooled}, {"argmax", &argmax}});
  for (const kernels::NamedTensor& t :
       {kernels::NamedTensor{name, &pooled}, kernels::NamedTensor{"argmax", &argmax}}) {
    TL_CHECK(t.second->shape() == expected, ShapeError,
             op << ": " << t.first << " is " << t.second->describe() << " but the max pool of x "
                << a.x.describe() << " is " << to_string(expected));
  }
  // The argmax of a plane is held in x's dtype (kernels/pool2d.h).
  constexpr std::int64_t kExactFloat32 = std::int64_t{1} << 24;
  TL_CHECK(a.x.dtype() != DType::Float32 || a.S <= kExactFloat32, ShapeError,
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

void batchnorm_max_pool_forward_training(const Tensor& y, const Tensor& argmax,
                                         const Tensor& save_mean, const Tensor& save_inv_std,
                                         const Tensor& moving_mean, const Tensor& moving_var,
                                         const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         double eps, double momentum, const Pool2dParams& pool,
                                         const Stream& stream, Activation activation) {
  const char* op = "batchnorm_max_pool_forward_training";
  BatchNormArgs d = args_of(op, x, stream);
  set_max_pool(op, d, pool, "y", y, argmax, stream);
  check_training_forward(op, d, save_mean, save_inv_std, gamma, beta, stream);
  if (wants_moving(op, moving_mean, moving_var)) {
    kernels::check_on_stream(
        op, stream, {{"x", &x}, {"moving_mean", &moving_mean}, {"moving_var", &moving_var}});
    check_channels(op, x, d.C, {{"moving_mean", &moving_mean}, {"moving_var", &moving_var}});
  }
  check_eps_momentum(op, eps, momentum);
  if (d.C == 0) return;
  Tensor m2 = Tensor::empty({d.C}, stream, x.dtype());
  d.y = y;
  d.gamma = gamma;
  d.beta = beta;
  d.mean = save_mean;
  d.m2 = m2;
  d.inv_std = save_inv_std;
  d.moving_mean = moving_mean;
  d.moving_var = moving_var;
  d.count = d.N * d.S;
  d.eps = eps;
  d.momentum = momentum;
  d.activation = activation;
  cpu::batchnorm_stats(d);
  cpu::batchnorm_forward_from_stats(d);
}

void batchnorm_max_pool_backward(const Tensor& grad_x, const Tensor& grad_gamma,
                                 const Tensor& grad_beta, const Tensor& grad_y,
                                 const Tensor& argmax, const Tensor& x, const Tensor& gamma,
                                 const Tensor& save_mean, const Tensor& save_inv_std,
                                 const Pool2dParams& pool, const Stream& stream,
                                 GradWrite grad_x_write) {
  const char* op = "batchnorm_max_pool_backward";
  BatchNormArgs d = args_of(op, x, stream);
  set_max_pool(op, d, pool, "grad_y", grad_y, argmax, stream);
  kernels::check_on_stream(
      op, stream,
      {{"x", &x}, {"gamma", &gamma}, {"save_mean", &save_mean}, {"save_inv_std", &save_inv_std}});
  check_channels(op, x, d.C,
                 {{"gamma", &gamma}, {"save_mean", &save_mean}, {"save_inv_std", &save_inv_std}});
  if (grad_x.defined()) kernels::check_same_shape(op, stream, {{"x", &x}, {"grad_x", &grad_x}});
  for (const kernels::NamedTensor& t : {kernels::NamedTensor{"grad_gamma", &grad_gamma},
                                        kernels::NamedTensor{"grad_beta", &grad_beta}}) {
    if (!t.second->defined()) continue;
    kernels::check_on_stream(op, stream, {{"x", &x}, t});
    check_channels(op, x, d.C, {t});
  }
  if (d.C == 0 || (!grad_x.defined() && !grad_gamma.defined() && !grad_beta.defined())) return;
  if (x.numel() == 0) return;
  Tensor sum_grad_y = Tensor::empty({d.C}, stream, x.dtype());
  Tensor sum_grad_y_xhat = Tensor::empty({d.C}, stream, x.dtype());
  d.gamma = gamma;
  d.grad_y = grad_y;
  d.mean = save_mean;
  d.inv_std = save_inv_std;
  d.sum_grad_y = sum_grad_y;
  d.sum_grad_y_xhat = sum_grad_y_xhat;
  cpu::batchnorm_backward_reduce(d);
  if (grad_x.defined()) {
    d.grad_x = grad_x;
    d.grad_x_write = grad_x_write;
    d.count = d.N * d.S;
    cpu::batchnorm_backward_apply(d);
  }
  if (grad_gamma.defined()) add(grad_gamma, grad_gamma, sum_grad_y_xhat, stream);
  if (grad_beta.defined()) add(grad_beta, grad_beta, sum_grad_y, stream);
}

}  // namespace towerlab
