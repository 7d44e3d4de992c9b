// What the tests of batch norm with a fused max pool share (batchnorm_pool_test.cpp,
// batchnorm_pool_sixteen_bit_test.cpp): the problem, its two solutions (the fused op
// and the unfused composition its contract names), the exact comparison of two
// tensors, and the windows every case runs.
#pragma once

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "test_util.h"

namespace towerlab::testing {

constexpr double kEps = 1e-3;
constexpr double kMomentum = 0.9;

// --- the problem and its two solutions ----------------------------------------------

// One case: x [N,C,H,W] normal around 0.5 with a spread of 2; gamma [C] alternating
// in sign (odd channels negative); beta [C] = {-1, 0.2, 0.5, -1, ...}; grad_y
// normal of y's pooled shape [N,C,Ho,Wo]; moving statistics and the gradients'
// starting values (sentinels: the backward accumulates onto them) non-zero.
struct Problem {
  Shape x_shape, y_shape;
  Pool2dParams pool;
  Activation activation = Activation::None;
  DType dtype = DType::Float32;
  Tensor x, gamma, beta, grad_y;
  Tensor moving_mean0, moving_var0, grad_x0, grad_gamma0, grad_beta0;
};

inline Tensor with_dtype(const std::vector<float>& values, const Shape& shape, DType dtype) {
  return Tensor::from_host<float>(values, shape, cpu()).to(dtype, cpu());
}

inline Tensor normal(const Shape& shape, DType dtype, std::uint64_t subsequence, float mean = 0.0f,
                     float stddev = 1.0f) {
  Tensor t = Tensor::empty(shape, cpu());
  random_normal(t, 2024, subsequence, mean, stddev, cpu());
  return t.to(dtype, cpu());
}

inline Problem make_problem(const Shape& x_shape, const Pool2dParams& pool, Activation activation,
                            DType dtype) {
  Problem p;
  p.x_shape = x_shape;
  p.y_shape = pool2d_output_shape(x_shape, pool);
  p.pool = pool;
  p.activation = activation;
  p.dtype = dtype;
  const std::int64_t C = x_shape[1];
  constexpr float kBeta[] = {-1.0f, 0.2f, 0.5f};
  std::vector<float> gamma, beta, moving_mean, moving_var;
  const std::vector<float> scale = random_values(static_cast<std::size_t>(C), 7, 0.5f, 1.5f);
  for (std::int64_t c = 0; c < C; ++c) {
    gamma.push_back(c % 2 == 1 ? -scale[c] : scale[c]);
    beta.push_back(kBeta[c % 3]);
    moving_mean.push_back(0.1f * static_cast<float>(c));
    moving_var.push_back(1.0f + 0.5f * static_cast<float>(c));
  }
  p.x = normal(x_shape, dtype, 0, 0.5f, 2.0f);
  p.grad_y = normal(p.y_shape, dtype, 1);
  p.gamma = with_dtype(gamma, {C}, dtype);
  p.beta = with_dtype(beta, {C}, dtype);
  p.moving_mean0 = with_dtype(moving_mean, {C}, dtype);
  p.moving_var0 = with_dtype(moving_var, {C}, dtype);
  p.grad_x0 = normal(x_shape, dtype, 2);
  p.grad_gamma0 = normal({C}, dtype, 3);
  p.grad_beta0 = normal({C}, dtype, 4);
  return p;
}

inline std::string describe(const Problem& p) {
  return "x " + to_string(p.x_shape) + ", window " + std::to_string(p.pool.kernel_h) + "x" +
         std::to_string(p.pool.kernel_w) + " stride " + std::to_string(p.pool.stride_h) + "x" +
         std::to_string(p.pool.stride_w) + " pad " + std::to_string(p.pool.pad_h) + "x" +
         std::to_string(p.pool.pad_w) + ", " + dtype_name(p.dtype) +
         (p.activation == Activation::ReLU ? ", ReLU" : ", no activation");
}

// Everything either form produces.
struct Results {
  Tensor y, save_mean, save_inv_std, moving_mean, moving_var, grad_x, grad_gamma, grad_beta;
  Tensor argmax;
};

// Float32 beside a 16-bit x (kernels/batchnorm.h).
inline Tensor per_channel(const Problem& p) {
  return Tensor::empty({p.x_shape[1]}, cpu(), is_16bit(p.dtype) ? DType::Float32 : p.dtype);
}

// A tensor of NaN: an output that starts so shows every value left unwritten.
inline Tensor nans(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, cpu(), dtype);
  fill(t, std::numeric_limits<double>::quiet_NaN(), cpu());
  return t;
}

// Fresh outputs: moving statistics and gradients start from the problem's values,
// argmax from NaN.
inline Results fresh_outputs(const Problem& p) {
  return {Tensor::empty(p.y_shape, cpu(), p.dtype),
          per_channel(p),
          per_channel(p),
          p.moving_mean0.clone(cpu()),
          p.moving_var0.clone(cpu()),
          p.grad_x0.clone(cpu()),
          p.grad_gamma0.clone(cpu()),
          p.grad_beta0.clone(cpu()),
          nans(p.y_shape, pool2d_argmax_dtype(p.dtype))};
}

// The fused forward of p into r's outputs.
inline BatchNormMaxPoolForwardTraining fused_forward_args(const Problem& p, const Results& r) {
  return {.y = r.y,
          .argmax = r.argmax,
          .save_mean = r.save_mean,
          .save_inv_std = r.save_inv_std,
          .moving_mean = r.moving_mean,
          .moving_var = r.moving_var,
          .x = p.x,
          .gamma = p.gamma,
          .beta = p.beta,
          .eps = kEps,
          .momentum = kMomentum,
          .pool = p.pool,
          .activation = p.activation};
}

// The fused backward of forward f for p's grad_y, into r's gradients.
inline BatchNormMaxPoolBackward fused_backward_args(const Problem& p,
                                                    const BatchNormMaxPoolForwardTraining& f,
                                                    const Results& r) {
  return {.grad_x = r.grad_x,
          .grad_gamma = r.grad_gamma,
          .grad_beta = r.grad_beta,
          .grad_y = p.grad_y,
          .argmax = f.argmax,
          .x = f.x,
          .gamma = f.gamma,
          .save_mean = f.save_mean,
          .save_inv_std = f.save_inv_std,
          .pool = f.pool};
}

// The reference: the unfused sequence the contract names, step by step.
inline Results composed(const Problem& p, GradWrite grad_x_write = GradWrite::Accumulate) {
  Results r = fresh_outputs(p);
  Tensor activated = Tensor::empty(p.x_shape, cpu(), p.dtype);  // [N,C,H,W]
  batchnorm_forward_training({.y = activated,
                              .save_mean = r.save_mean,
                              .save_inv_std = r.save_inv_std,
                              .moving_mean = r.moving_mean,
                              .moving_var = r.moving_var,
                              .x = p.x,
                              .gamma = p.gamma,
                              .beta = p.beta,
                              .eps = kEps,
                              .momentum = kMomentum,
                              .activation = p.activation},
                             cpu());
  max_pool2d_forward_with_argmax(r.y, r.argmax, activated, p.pool, cpu());
  Tensor grad_activated = Tensor::empty(p.x_shape, cpu(), p.dtype);  // fresh, assigned
  max_pool2d_backward_from_argmax(grad_activated, p.grad_y, r.argmax, p.pool, cpu(),
                                  GradWrite::Assign);
  batchnorm_backward({.grad_x = r.grad_x,
                      .grad_gamma = r.grad_gamma,
                      .grad_beta = r.grad_beta,
                      .grad_y = grad_activated,
                      .x = p.x,
                      .gamma = p.gamma,
                      .beta = p.beta,
                      .save_mean = r.save_mean,
                      .save_inv_std = r.save_inv_std,
                      .activation = p.activation,
                      .grad_x_write = grad_x_write},
                     cpu());
  return r;
}

// The fused pair on the same problem.
inline Results fused(const Problem& p, GradWrite grad_x_write = GradWrite::Accumulate) {
  Results r = fresh_outputs(p);
  const BatchNormMaxPoolForwardTraining forward = fused_forward_args(p, r);
  batchnorm_max_pool_forward_training(forward, cpu());
  BatchNormMaxPoolBackward backward = fused_backward_args(p, forward, r);
  backward.grad_x_write = grad_x_write;
  batchnorm_max_pool_backward(backward, cpu());
  return r;
}

// The values of a CPU tensor, widened to double (exactly, so that == on them is ==
// on the tensor's own values).
inline std::vector<double> values(const Tensor& t) {
  if (t.dtype() == DType::Float64) return t.to_host<double>(cpu());
  if (is_16bit(t.dtype())) return values(cast(t, DType::Float32, cpu()));
  const std::vector<float> f = t.to_host<float>(cpu());
  return {f.begin(), f.end()};
}

// Every value equal (==: +0 equals -0, a NaN equals nothing), reporting how many
// differ and the first few with their index.
inline ::testing::AssertionResult identical(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << actual.describe() << " vs " << expected.describe();
  }
  const std::vector<double> a = values(actual), e = values(expected);
  std::size_t differ = 0;
  std::ostringstream first;
  first.precision(17);
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == e[i]) continue;
    if (++differ <= 3) first << " [" << i << "] " << a[i] << " vs " << e[i] << ";";
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << differ << " of " << a.size() << " values differ:" << first.str();
}

// The windows every case runs: FashionNet's 2x2 stride 2 on its two layer sizes
// (Wo = 14, and Wo = 7, whose last group of outputs on a vector path overlaps the
// group before it), odd planes whose last row and column no window covers, Wo < 4,
// overlapping 3x3 windows with and without padding, and a rectangular window.
struct Case {
  Shape x;
  Pool2dParams pool;
};

inline const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{4, 3, 28, 28}, Pool2dParams::square(2, 2)},
      {{4, 5, 14, 14}, Pool2dParams::square(2, 2)},
      {{3, 2, 7, 9}, Pool2dParams::square(2, 2)},
      {{3, 4, 6, 6}, Pool2dParams::square(2, 2)},  // Wo = 3
      {{5, 2, 3, 3}, Pool2dParams::square(2, 2)},  // one window per plane, Wo = 1
      {{2, 3, 11, 13}, Pool2dParams::square(3, 2)},
      {{2, 3, 11, 13}, Pool2dParams::square(3, 2, 1)},
      {{2, 3, 7, 9}, Pool2dParams{3, 2, 2, 1, 1, 1}},  // 3x2 window, stride 2x1, padding 1x1
  };
  return all;
}

}  // namespace towerlab::testing
