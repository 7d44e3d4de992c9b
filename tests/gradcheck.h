// The one gradient checker: central differences in float64 on the CPU, one input
// element at a time (STYLE.md 11).
//
// Typical use for an op y = f(x, w) with a backward that accumulates:
//   1. make float64 CPU inputs and a fixed random "upstream" tensor g of y's shape;
//   2. the scalar loss is L = sum_i g[i] * y[i], so dL/dy = g;
//   3. run the backward with grad_y = g into zeroed grad_x, grad_w;
//   4. check_gradient(loss_fn, inputs, {grad_x, grad_w}).
// The checker perturbs each element of each input by +-eps, evaluates loss_fn,
// and compares (L(x+eps) - L(x-eps)) / 2eps with the analytic gradient.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "towerlab.h"

namespace towerlab::testing {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-5;
  // Return true to skip element `index` of input `input` (a kink, e.g. ReLU at 0
  // or a max-pool tie, where the derivative is not defined).
  std::function<bool(std::size_t input, std::int64_t index)> skip;
};

// `loss` maps the inputs (float64 CPU tensors, perturbed in place between calls)
// to a scalar. `analytic[k]` is dL/d inputs[k] (same shape), or an undefined Tensor
// to leave input k unchecked.
::testing::AssertionResult check_gradient(
    const std::function<double(const std::vector<Tensor>&)>& loss,
    const std::vector<Tensor>& inputs, const std::vector<Tensor>& analytic,
    const GradcheckOptions& options = {});

// An op's gradients through the tape, the way a model reaches them. `forward` builds
// a scalar loss on `tape` from one Var per input; it runs once on constants as the
// loss of the central differences, and once per first-write mode (the assigning
// write, and the one that poisons a tape-made gradient with NaN before its first
// write, so a first write that read it shows) with the inputs as variables whose
// float64 gradients start at zero. The variables are named x0, x1, ...
::testing::AssertionResult check_tape_gradient(
    const std::function<Var(Tape&, const std::vector<Var>&)>& forward,
    const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

// sum_i g[i] * y[i] for two float64 CPU tensors of one size: the usual loss.
double weighted_sum(const Tensor& g, const Tensor& y);

// A float64 CPU tensor of uniform values in [low, high) from a fixed seed.
Tensor random_double_tensor(const Shape& shape, unsigned seed, double low = -1.0,
                            double high = 1.0);

// The gradient of every variable of `store` (float64) for the cross-entropy of
// net(x) against labels, plus l2 * the L2 regularization (l2_regularization),
// against central differences over the store's flat values (rtol 1e-4: the loss
// passes through several layers). A training pass: batch norm uses batch statistics.
::testing::AssertionResult variable_gradients_match(const Layer& net, VariableStore& store,
                                                    const Tensor& x, const Tensor& labels,
                                                    double l2 = 0.0);

}  // namespace towerlab::testing
