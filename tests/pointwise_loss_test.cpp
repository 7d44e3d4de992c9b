// Pointwise losses (kernels/pointwise_loss.h) on every backend: values by hand,
// the double reference on odd sizes, extreme logits, the NaN rule, add-versus-assign
// sentinels, empty tensors, typed errors, and float64 gradient checks of the
// kernels and of the ag:: functions through the tape.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "kernels/pointwise_loss.h"
#include "kernels/reference/pointwise_loss.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr PointwiseLossOp kBce{PointwiseLossKind::BinaryCrossEntropyWithLogits};
constexpr PointwiseLossOp kL1{PointwiseLossKind::L1};
constexpr PointwiseLossOp kHuber{PointwiseLossKind::Huber, 1.0};
constexpr PointwiseLossOp kHuberWide{PointwiseLossKind::Huber, 2.5};

std::vector<PointwiseLossOp> all_losses() {
  return {kBce, kL1, kHuber, kHuberWide};
}

std::string name(const PointwiseLossOp& op) {
  return std::string(pointwise_loss_name(op.kind)) + " delta " + std::to_string(op.delta);
}

class PointwiseLossTest : public BackendTest {
 protected:
  float scalar(const Tensor& t) { return host(t).at(0); }
};
TL_INSTANTIATE_BACKENDS(PointwiseLossTest);

// x = {-2, 0, 0.5, 3}, t = {0, 1, 0.5, 1}, d = x - t = {-2, -1, 0, 2}.
// BCE terms max(x,0) - x t + log1p(exp(-|x|)):
//   log1p(e^-2) = 0.126928011, log 2 = 0.693147181, 0.5 - 0.25 + log1p(e^-0.5) = 0.724076984,
//   3 - 3 + log1p(e^-3) = 0.048587352; sum 1.592739528.
// L1 terms {2, 1, 0, 2}: sum 5. Huber (delta 1) terms {1.5, 0.5, 0, 1.5}: sum 3.5.
TEST_P(PointwiseLossTest, ForwardByHand) {
  Tensor pred = make({-2, 0, 0.5f, 3}, {2, 2});
  Tensor target = make({0, 1, 0.5f, 1}, {2, 2});
  Tensor loss = make({-7}, {1});
  pointwise_loss_forward(loss, pred, target, kBce, Reduction::Sum, stream());
  EXPECT_NEAR(scalar(loss), 1.592739528f, 2e-6);
  pointwise_loss_forward(loss, pred, target, kBce, Reduction::Mean, stream());
  EXPECT_NEAR(scalar(loss), 1.592739528f / 4, 1e-6);
  pointwise_loss_forward(loss, pred, target, kL1, Reduction::Sum, stream());
  EXPECT_FLOAT_EQ(scalar(loss), 5.0f);
  pointwise_loss_forward(loss, pred, target, kHuber, Reduction::Mean, stream());
  EXPECT_FLOAT_EQ(scalar(loss), 3.5f / 4);
  // delta 2.5 puts every |d| inside: d^2 / 2 = {2, 0.5, 0, 2}.
  pointwise_loss_forward(loss, pred, target, kHuberWide, Reduction::Sum, stream());
  EXPECT_FLOAT_EQ(scalar(loss), 4.5f);
}

// Gradients with grad_loss 2 and Sum, onto sentinels of 1:
//   BCE  d/dx = sigmoid(x) - t = {0.119202922, -0.5, 0.122459331, -0.047425873},  d/dt = -x
//   L1   d/dx = sign(d) = {-1, -1, 0, 1}      Huber d/dx = clamp(d, -1, 1) = {-1, -1, 0, 1}
TEST_P(PointwiseLossTest, BackwardAccumulatesByHand) {
  Tensor pred = make({-2, 0, 0.5f, 3}, {4});
  Tensor target = make({0, 1, 0.5f, 1}, {4});
  Tensor grad_loss = make({2}, {1});
  Tensor grad_pred = make({1, 1, 1, 1}, {4});
  Tensor grad_target = make({1, 1, 1, 1}, {4});
  pointwise_loss_backward(grad_pred, grad_target, grad_loss, pred, target, kBce, Reduction::Sum,
                          stream());
  EXPECT_TRUE(all_close(host(grad_pred), {1.238405844f, 0.0f, 1.244918662f, 0.905148254f}));
  EXPECT_TRUE(all_close(host(grad_target), {5, 1, 0, -5}));
  for (const PointwiseLossOp& op : {kL1, kHuber}) {
    grad_pred = make({1, 1, 1, 1}, {4});
    grad_target = make({1, 1, 1, 1}, {4});
    pointwise_loss_backward(grad_pred, grad_target, grad_loss, pred, target, op, Reduction::Sum,
                            stream());
    EXPECT_EQ(host(grad_pred), (std::vector<float>{-1, -1, 1, 3})) << name(op);
    EXPECT_EQ(host(grad_target), (std::vector<float>{3, 3, 1, -1})) << name(op);
  }
  // Mean over 4 and only grad_pred asked for: Huber with delta 2.5 gives d / 2.
  grad_pred = make({1, 1, 1, 1}, {4});
  pointwise_loss_backward(grad_pred, Tensor(), grad_loss, pred, target, kHuberWide, Reduction::Mean,
                          stream());
  EXPECT_EQ(host(grad_pred), (std::vector<float>{0, 0.5f, 1, 2}));
}

TEST_P(PointwiseLossTest, MatchesDoubleReferenceOnOddSizes) {
  for (const PointwiseLossOp& op : all_losses()) {
    for (std::int64_t n : {1, 7, 257, 100003}) {
      const auto p = random_values(static_cast<std::size_t>(n), 41, -6.0f, 6.0f);
      const auto t = op.kind == PointwiseLossKind::BinaryCrossEntropyWithLogits
                         ? random_values(static_cast<std::size_t>(n), 42, 0.0f, 1.0f)
                         : random_values(static_cast<std::size_t>(n), 42, -6.0f, 6.0f);
      const double total = reference::pointwise_loss_sum(op, p.data(), t.data(), n);
      Tensor pred = make(p, {n}), target = make(t, {n}), loss = make({0}, {1});
      pointwise_loss_forward(loss, pred, target, op, Reduction::Mean, stream());
      const double mean = total / static_cast<double>(n);
      EXPECT_NEAR(scalar(loss), mean, 1e-5 * std::abs(mean)) << name(op) << ", n = " << n;

      Tensor grad_pred = make(std::vector<float>(p.size(), -0.25f), {n});
      Tensor grad_target = make(std::vector<float>(p.size(), 0.75f), {n});
      pointwise_loss_backward(grad_pred, grad_target, make({3.0f}, {1}), pred, target, op,
                              Reduction::Sum, stream());
      std::vector<float> expected_pred(p.size(), -0.25f), expected_target(p.size(), 0.75f);
      reference::pointwise_loss_backward(op, expected_pred.data(), expected_target.data(), p.data(),
                                         t.data(), 3.0, n);
      EXPECT_TRUE(all_close(host(grad_pred), expected_pred)) << name(op) << ", n = " << n;
      EXPECT_TRUE(all_close(host(grad_target), expected_target)) << name(op) << ", n = " << n;
    }
  }
}

// The comparison above can fail: a reference for another delta is far off.
TEST_P(PointwiseLossTest, ControlAnotherDeltaDiffers) {
  const std::int64_t n = 257;
  const auto p = random_values(n, 41, -6.0f, 6.0f), t = random_values(n, 42, -6.0f, 6.0f);
  Tensor grad_pred = Tensor::zeros({n}, stream());
  pointwise_loss_backward(grad_pred, Tensor(), make({1.0f}, {1}), make(p, {n}), make(t, {n}),
                          kHuber, Reduction::Sum, stream());
  std::vector<float> other(p.size(), 0.0f);
  reference::pointwise_loss_backward(kHuberWide, other.data(), static_cast<float*>(nullptr),
                                     p.data(), t.data(), 1.0, n);
  EXPECT_FALSE(all_close(host(grad_pred), other));
}

// Logits of any size give finite terms and gradients (no exp overflows, no log of 0).
TEST_P(PointwiseLossTest, BinaryCrossEntropyStaysFiniteForLargeLogits) {
  Tensor pred = make({-1e4f, -100, 100, 1e4f}, {4});
  Tensor target = make({0, 1, 0, 1}, {4});
  Tensor loss = make({0}, {1});
  // Terms: 0, 100, 100, 0 (to float rounding of log1p(e^-100)).
  pointwise_loss_forward(loss, pred, target, kBce, Reduction::Sum, stream());
  EXPECT_NEAR(scalar(loss), 200.0f, 1e-4);
  Tensor grad_pred = Tensor::zeros({4}, stream());
  pointwise_loss_backward(grad_pred, Tensor(), make({1.0f}, {1}), pred, target, kBce,
                          Reduction::Sum, stream());
  EXPECT_TRUE(all_close(host(grad_pred), {0, -1, 1, 0}));
}

// At |d| == delta Huber's two pieces meet; at d == 0 L1's gradient is 0.
TEST_P(PointwiseLossTest, KinksTakeTheStatedValues) {
  Tensor pred = make({1, -1, 3}, {3});
  Tensor target = make({0, 0, 3}, {3});
  Tensor loss = make({0}, {1});
  pointwise_loss_forward(loss, pred, target, kHuber, Reduction::Sum, stream());
  EXPECT_FLOAT_EQ(scalar(loss), 1.0f);  // 0.5 + 0.5 + 0
  Tensor grad_pred = Tensor::zeros({3}, stream());
  pointwise_loss_backward(grad_pred, Tensor(), make({1.0f}, {1}), pred, target, kHuber,
                          Reduction::Sum, stream());
  EXPECT_EQ(host(grad_pred), (std::vector<float>{1, -1, 0}));
  grad_pred = Tensor::zeros({3}, stream());
  pointwise_loss_backward(grad_pred, Tensor(), make({1.0f}, {1}), pred, target, kL1, Reduction::Sum,
                          stream());
  EXPECT_EQ(host(grad_pred), (std::vector<float>{1, -1, 0}));
}

TEST_P(PointwiseLossTest, NaNReachesTheLossAndOnlyItsOwnGradients) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const PointwiseLossOp& op : all_losses()) {
    for (int where : {0, 1}) {  // NaN in pred, then in target
      Tensor pred = make({0.5f, where == 0 ? nan : 2.0f, -1.0f}, {3});
      Tensor target = make({0.25f, where == 1 ? nan : 0.5f, 1.0f}, {3});
      Tensor loss = make({0}, {1});
      pointwise_loss_forward(loss, pred, target, op, Reduction::Mean, stream());
      EXPECT_TRUE(std::isnan(scalar(loss))) << name(op);
      Tensor grad_pred = Tensor::zeros({3}, stream()), grad_target = Tensor::zeros({3}, stream());
      pointwise_loss_backward(grad_pred, grad_target, make({1.0f}, {1}), pred, target, op,
                              Reduction::Sum, stream());
      for (const Tensor& g : {grad_pred, grad_target}) {
        const auto v = host(g);
        EXPECT_TRUE(std::isfinite(v[0]) && std::isnan(v[1]) && std::isfinite(v[2]))
            << name(op) << ", NaN in " << (where == 0 ? "pred" : "target") << ": " << v[0] << " "
            << v[1] << " " << v[2];
      }
    }
  }
}

TEST_P(PointwiseLossTest, EmptyTensorsGiveZero) {
  Tensor pred = Tensor::zeros({0, 3}, stream()), target = Tensor::zeros({0, 3}, stream());
  for (const PointwiseLossOp& op : all_losses()) {
    Tensor loss = make({7}, {1});
    pointwise_loss_forward(loss, pred, target, op, Reduction::Mean, stream());
    EXPECT_EQ(scalar(loss), 0.0f) << name(op);
    pointwise_loss_backward(Tensor::zeros({0, 3}, stream()), Tensor(), make({1}, {1}), pred, target,
                            op, Reduction::Mean, stream());
  }
}

TEST_P(PointwiseLossTest, RejectsBadArguments) {
  Tensor pred = Tensor::zeros({2, 3}, stream()), target = Tensor::zeros({3, 2}, stream());
  Tensor loss = Tensor::zeros({1}, stream());
  EXPECT_THROW_WITH(pointwise_loss_forward(loss, pred, target, kL1, Reduction::Mean, stream()),
                    ShapeError, "l1_loss_forward: target is float32[3,2]");
  EXPECT_THROW_WITH(pointwise_loss_forward(Tensor::zeros({2}, stream()), pred, pred, kBce,
                                           Reduction::Sum, stream()),
                    ShapeError,
                    "binary_cross_entropy_with_logits_forward: loss must have one element");
  EXPECT_THROW_WITH(pointwise_loss_backward(Tensor::zeros({6}, stream()), Tensor(), loss, pred,
                                            pred, kHuber, Reduction::Mean, stream()),
                    ShapeError, "huber_loss_backward: grad_pred is float32[6]");
  for (double delta : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    EXPECT_THROW_WITH(pointwise_loss_forward(loss, pred, pred, {PointwiseLossKind::Huber, delta},
                                             Reduction::Mean, stream()),
                      InvalidArgument, "huber_loss_forward: delta is");
  }
  Tensor half = Tensor::zeros({2, 3}, stream(), DType::BFloat16);
  EXPECT_THROW_WITH(pointwise_loss_forward(loss, half, half, kL1, Reduction::Mean, stream()),
                    NotSupported, "l1_loss_forward: bfloat16 is not supported");
}

// --- float64 gradient checks on the CPU ---------------------------------------

// A target for the op: probabilities for BCE, values for the others.
Tensor target_for(const PointwiseLossOp& op, const Shape& shape, unsigned seed) {
  return op.kind == PointwiseLossKind::BinaryCrossEntropyWithLogits
             ? random_double_tensor(shape, seed, 0.0, 1.0)
             : random_double_tensor(shape, seed, -3.0, 3.0);
}

// Skips the kinks: d within 1e-4 of 0 (L1) or of +-delta (Huber).
GradcheckOptions skip_kinks(const PointwiseLossOp& op, const Tensor& pred, const Tensor& target) {
  GradcheckOptions options;
  const double* x = pred.data<double>();
  const double* t = target.data<double>();
  options.skip = [op, x, t](std::size_t, std::int64_t i) {
    const double a = std::abs(x[i] - t[i]);
    if (op.kind == PointwiseLossKind::L1) return a < 1e-4;
    if (op.kind == PointwiseLossKind::Huber) return std::abs(a - op.delta) < 1e-4;
    return false;
  };
  return options;
}

TEST(PointwiseLossGradient, MatchesCentralDifferences) {
  const Stream& cpu = default_stream(Device::cpu());
  for (const PointwiseLossOp& op : all_losses()) {
    for (Reduction reduction : {Reduction::Mean, Reduction::Sum}) {
      Tensor pred = random_double_tensor({3, 5}, 51, -3.0, 3.0);
      Tensor target = target_for(op, {3, 5}, 52);
      const double upstream = 1.75;
      auto loss = [&](const std::vector<Tensor>& in) {
        Tensor l = Tensor::empty({1}, cpu, DType::Float64);
        pointwise_loss_forward(l, in[0], in[1], op, reduction, cpu);
        return upstream * l.data<double>()[0];
      };
      Tensor grad_pred = Tensor::zeros({3, 5}, cpu, DType::Float64);
      Tensor grad_target = Tensor::zeros({3, 5}, cpu, DType::Float64);
      Tensor grad_loss = Tensor::from_host<double>({upstream}, {1}, cpu);
      pointwise_loss_backward(grad_pred, grad_target, grad_loss, pred, target, op, reduction, cpu);
      EXPECT_TRUE(check_gradient(loss, {pred, target}, {grad_pred, grad_target},
                                 skip_kinks(op, pred, target)))
          << name(op);
    }
  }
}

TEST(PointwiseLossGradient, ThroughTheTape) {
  using LossFn = std::function<Var(const Var&, const Var&)>;
  const std::vector<std::pair<PointwiseLossOp, LossFn>> losses = {
      {kBce, [](const Var& p, const Var& t) { return ag::binary_cross_entropy_with_logits(p, t); }},
      {kL1, [](const Var& p, const Var& t) { return ag::l1_loss(p, t, Reduction::Sum); }},
      {kHuberWide, [](const Var& p, const Var& t) { return ag::huber_loss(p, t, 2.5); }}};
  for (const auto& [op, fn] : losses) {
    Tensor pred = random_double_tensor({2, 4}, 61, -3.0, 3.0);
    Tensor target = target_for(op, {2, 4}, 62);
    auto loss_fn = [&](const std::vector<Tensor>& in) {
      Tape tape(cpu());
      // pred used twice (the loss of 2 pred): the two contributions must add up.
      Var p = tape.constant(in[0]);
      return fn(ag::add(p, p), tape.constant(in[1])).value().to_host<double>()[0];
    };
    Tensor grad_pred = Tensor::zeros({2, 4}, cpu(), DType::Float64);
    Tensor grad_target = Tensor::zeros({2, 4}, cpu(), DType::Float64);
    Tape tape(cpu());
    Var p = tape.variable(pred, grad_pred, "pred");
    Var t = tape.variable(target, grad_target, "target");
    tape.backward(fn(ag::add(p, p), t));
    Tensor doubled = Tensor::empty({2, 4}, cpu(), DType::Float64);
    for (std::int64_t i = 0; i < 8; ++i) doubled.data<double>()[i] = 2 * pred.data<double>()[i];
    EXPECT_TRUE(check_gradient(loss_fn, {pred, target}, {grad_pred, grad_target},
                               skip_kinks(op, doubled, target)))
        << name(op);
  }
}

}  // namespace
}  // namespace towerlab::testing
