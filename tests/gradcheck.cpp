#include "gradcheck.h"

#include "test_util.h"

#include <cmath>
#include <random>
#include <sstream>
#include <string>

namespace towerlab::testing {

::testing::AssertionResult check_gradient(
    const std::function<double(const std::vector<Tensor>&)>& loss,
    const std::vector<Tensor>& inputs, const std::vector<Tensor>& analytic,
    const GradcheckOptions& options) {
  if (analytic.size() != inputs.size()) {
    return ::testing::AssertionFailure() << "check_gradient: " << inputs.size() << " inputs but "
                                         << analytic.size() << " analytic gradients";
  }
  std::ostringstream bad;
  std::size_t mismatches = 0, checked = 0;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!analytic[k].defined()) continue;
    const Tensor& x = inputs[k];
    if (x.dtype() != DType::Float64 || !x.device().is_cpu() || analytic[k].numel() != x.numel()) {
      return ::testing::AssertionFailure()
             << "check_gradient: input " << k << " is " << x.describe() << " with gradient "
             << analytic[k].describe() << " (need float64 CPU tensors of one size)";
    }
    double* values = x.data<double>();
    const std::vector<double> grad = analytic[k].to_host<double>();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      if (options.skip && options.skip(k, i)) continue;
      const double saved = values[i];
      values[i] = saved + options.eps;
      const double up = loss(inputs);
      values[i] = saved - options.eps;
      const double down = loss(inputs);
      values[i] = saved;
      const double numeric = (up - down) / (2.0 * options.eps);
      const double g = grad[static_cast<std::size_t>(i)];
      ++checked;
      if (!(std::abs(numeric - g) <= options.atol + options.rtol * std::abs(numeric))) {
        if (++mismatches <= 5) {
          bad << "\n  input " << k << " element " << i << ": analytic " << g << ", numeric "
              << numeric;
        }
      }
    }
  }
  if (checked == 0) return ::testing::AssertionFailure() << "check_gradient: nothing was checked";
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << checked << " gradient elements differ:" << bad.str();
}

::testing::AssertionResult check_tape_gradient(
    const std::function<Var(Tape&, const std::vector<Var>&)>& forward,
    const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  auto loss = [&](const std::vector<Tensor>& in) {
    Tape tape(cpu());
    std::vector<Var> constants;
    for (const Tensor& t : in) constants.push_back(tape.constant(t));
    return forward(tape, constants).value().to_host<double>()[0];
  };
  for (Tape::FirstWrite mode : {Tape::FirstWrite::Assign, Tape::FirstWrite::Poisoned}) {
    Tape tape(cpu());
    tape.set_first_write(mode);
    std::vector<Tensor> grads;
    std::vector<Var> vars;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      grads.push_back(Tensor::zeros(inputs[k].shape(), cpu(), DType::Float64));
      vars.push_back(tape.variable(inputs[k], grads.back(), "x" + std::to_string(k)));
    }
    tape.backward(forward(tape, vars));
    ::testing::AssertionResult result = check_gradient(loss, inputs, grads, options);
    if (!result) {
      return result << " (first write: "
                    << (mode == Tape::FirstWrite::Assign ? "assign" : "poisoned") << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

double weighted_sum(const Tensor& g, const Tensor& y) {
  const double* a = g.data<double>();
  const double* b = y.data<double>();
  double total = 0.0;
  for (std::int64_t i = 0; i < y.numel(); ++i) total += a[i] * b[i];
  return total;
}

Tensor random_double_tensor(const Shape& shape, unsigned seed, double low, double high) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(low, high);
  std::vector<double> v(static_cast<std::size_t>(numel_of(shape)));
  for (double& x : v) x = dist(gen);
  return Tensor::from_host<double>(v, shape, default_stream(Device::cpu()));
}

::testing::AssertionResult variable_gradients_match(const Layer& net, VariableStore& store,
                                                    const Tensor& x, const Tensor& labels,
                                                    double l2) {
  const Stream& cpu = default_stream(Device::cpu());
  auto forward = [&](Tape& tape) {
    Context ctx{tape, store, true};
    Var logits = net(ctx, tape.constant(x, "images"));
    Var loss = ag::softmax_cross_entropy(logits, tape.constant(labels, "labels"));
    return l2 == 0.0 ? loss : ag::add_n({loss, l2_regularization(ctx, l2)});
  };
  auto loss_fn = [&](const std::vector<Tensor>&) {
    Tape tape(cpu);
    NoGradGuard no_grad(tape);
    return forward(tape).value().to_host<double>()[0];
  };
  Tape tape(cpu);
  store.zero_grad(cpu);
  tape.backward(forward(tape));
  GradcheckOptions options;
  options.rtol = 1e-4;
  options.atol = 1e-6;
  return check_gradient(loss_fn, {store.flat_values()}, {store.flat_grads()}, options);
}

}  // namespace towerlab::testing
