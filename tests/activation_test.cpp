// The activations (sigmoid, tanh, both GELUs, SiLU, leaky ReLU) forward and
// backward on every backend against their reference, at the extremes, and their
// gradients in float64, through the kernels and through the tape; in bfloat16 and
// float16 against the reference rounded once (its bits on the CPU, one unit in the
// last place on CUDA, kernels/activation.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "cpu_isa.h"
#include "gradcheck.h"
#include "kernels/reference/activation.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Every activation, leaky ReLU with its default slope and another.
std::vector<ActivationOp> all_activations() {
  return {ActivationOp::sigmoid(),
          ActivationOp::tanh(),
          ActivationOp::gelu(GeluApproximate::None),
          ActivationOp::gelu(GeluApproximate::Tanh),
          ActivationOp::silu(),
          ActivationOp::leaky_relu(),
          ActivationOp::leaky_relu(0.2)};
}

std::string name(const ActivationOp& act) {
  std::string s = activation_name(act.kind);
  if (act.kind == ActivationKind::LeakyReLU) s += "(" + std::to_string(act.negative_slope) + ")";
  return s;
}

// The reference in float, element for element.
std::vector<float> reference_forward(const std::vector<float>& x, const ActivationOp& act) {
  std::vector<float> y(x.size());
  reference::activation_forward(y.data(), x.data(), std::int64_t(x.size()), act);
  return y;
}

std::vector<float> reference_backward(std::vector<float> grad_x, const std::vector<float>& grad_y,
                                      const std::vector<float>& x, const ActivationOp& act,
                                      GradWrite write) {
  reference::activation_backward(grad_x.data(), grad_y.data(), x.data(), std::int64_t(x.size()),
                                 act, write);
  return grad_x;
}

// all_close, with a NaN expected exactly where one is found and infinities equal.
::testing::AssertionResult matches_reference(const std::vector<float>& actual,
                                             const std::vector<float>& expected) {
  std::vector<float> a = actual, e = expected;
  for (std::size_t i = 0; i < e.size(); ++i) {
    if (std::isnan(e[i]) != std::isnan(a[i]) || (std::isinf(e[i]) && a[i] != e[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << ", the reference has " << e[i];
    }
    if (!std::isfinite(e[i])) a[i] = e[i] = 0.0f;
  }
  return all_close(a, e, 1e-6, 1e-5);
}

class ActivationTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(ActivationTest);

TEST_P(ActivationTest, MatchesReferenceOnOddSizes) {
  for (const ActivationOp& act : all_activations()) {
    for (std::int64_t n : {0, 1, 7, 257, 100003}) {
      const auto values = random_values(std::size_t(n), 5, -8.0f, 8.0f);
      const auto grad_y = random_values(std::size_t(n), 6);
      Tensor x = make(values, {n});
      Tensor y = Tensor::empty({n}, stream());
      activation_forward(y, x, act, stream());
      EXPECT_TRUE(matches_reference(host(y), reference_forward(values, act)))
          << name(act) << ", n = " << n;
      Tensor grad_x = make(std::vector<float>(std::size_t(n), 0.5f), {n});
      activation_backward(grad_x, make(grad_y, {n}), x, act, stream());
      EXPECT_TRUE(matches_reference(
          host(grad_x), reference_backward(std::vector<float>(std::size_t(n), 0.5f), grad_y, values,
                                           act, GradWrite::Accumulate)))
          << name(act) << ", n = " << n;
    }
  }
}

TEST_P(ActivationTest, ExtremesGiveTheLimitsAndKeepNaN) {
  const std::vector<float> values = {kInf,  -kInf, kNaN,   100.0f, -100.0f, 0.0f,
                                     -0.0f, 20.0f, -20.0f, 1e-30f, -1e30f};
  const std::int64_t n = std::int64_t(values.size());
  const std::vector<float> ones(values.size(), 1.0f);
  for (const ActivationOp& act : all_activations()) {
    Tensor x = make(values, {n});
    Tensor y = Tensor::empty({n}, stream());
    activation_forward(y, x, act, stream());
    const auto out = host(y);
    EXPECT_TRUE(matches_reference(out, reference_forward(values, act))) << name(act);
    Tensor grad_x = Tensor::empty({n}, stream());
    activation_backward(grad_x, make(ones, {n}), x, act, stream(), GradWrite::Assign);
    const auto grad = host(grad_x);
    EXPECT_TRUE(
        matches_reference(grad, reference_backward(ones, ones, values, act, GradWrite::Assign)))
        << name(act);
    // The NaN input is the only NaN (leaky ReLU's backward takes the slope there).
    for (std::size_t i = 0; i < values.size(); ++i) {
      const bool nan_in = std::isnan(values[i]);
      EXPECT_EQ(std::isnan(out[i]), nan_in) << name(act) << " at " << values[i];
      if (act.kind != ActivationKind::LeakyReLU) {
        EXPECT_EQ(std::isnan(grad[i]), nan_in) << name(act) << "' at " << values[i];
      } else {
        EXPECT_FALSE(std::isnan(grad[i])) << name(act) << "' at " << values[i];
      }
    }
  }
}

TEST_P(ActivationTest, InfinitiesGiveTheLimits) {
  Tensor x = make({kInf, -kInf}, {2});
  Tensor y = Tensor::empty({2}, stream());
  Tensor g = Tensor::empty({2}, stream());
  auto run = [&](const ActivationOp& act) {
    activation_forward(y, x, act, stream());
    activation_backward(g, make({1.0f, 1.0f}, {2}), x, act, stream(), GradWrite::Assign);
    return std::pair{host(y), host(g)};
  };
  using V = std::vector<float>;
  EXPECT_EQ(run(ActivationOp::sigmoid()), std::pair(V{1.0f, 0.0f}, V{0.0f, 0.0f}));
  EXPECT_EQ(run(ActivationOp::tanh()), std::pair(V{1.0f, -1.0f}, V{0.0f, 0.0f}));
  EXPECT_EQ(run(ActivationOp::gelu()), std::pair(V{kInf, 0.0f}, V{1.0f, 0.0f}));
  EXPECT_EQ(run(ActivationOp::gelu(GeluApproximate::Tanh)),
            std::pair(V{kInf, 0.0f}, V{1.0f, 0.0f}));
  EXPECT_EQ(run(ActivationOp::silu()), std::pair(V{kInf, 0.0f}, V{1.0f, 0.0f}));
  EXPECT_EQ(run(ActivationOp::leaky_relu(0.25)), std::pair(V{kInf, -kInf}, V{1.0f, 0.25f}));
}

TEST_P(ActivationTest, BackwardAccumulatesOrAssigns) {
  const std::vector<float> values = {-1.5f, -0.25f, 0.5f, 2.0f};
  const std::vector<float> grad_y = {10.0f, 20.0f, 30.0f, 40.0f};
  for (const ActivationOp& act : all_activations()) {
    Tensor x = make(values, {2, 2});
    Tensor gy = make(grad_y, {2, 2});
    const auto contribution =
        reference_backward({0, 0, 0, 0}, grad_y, values, act, GradWrite::Assign);
    Tensor grad_x = make({1.0f, 1.0f, 1.0f, 1.0f}, {2, 2});  // sentinel: must be added to
    activation_backward(grad_x, gy, x, act, stream());
    std::vector<float> expected;
    for (float c : contribution) expected.push_back(1.0f + c);
    EXPECT_TRUE(all_close(host(grad_x), expected)) << name(act);
    Tensor assigned = make({kNaN, kNaN, kNaN, kNaN}, {2, 2});  // sentinel: must not be read
    activation_backward(assigned, gy, x, act, stream(), GradWrite::Assign);
    EXPECT_TRUE(all_close(host(assigned), contribution)) << name(act);
  }
}

TEST_P(ActivationTest, RejectsMismatchedShapesAndABadSlope) {
  Tensor x = Tensor::zeros({2, 3}, stream());
  Tensor y = Tensor::zeros({3, 2}, stream());
  EXPECT_THROW_WITH(activation_forward(y, x, ActivationOp::gelu(), stream()), ShapeError,
                    "activation_forward: x is float32[2,3]");
  EXPECT_THROW_WITH(activation_backward(x, x, y, ActivationOp::silu(), stream()), ShapeError,
                    "activation_backward: x is float32[3,2]");
  EXPECT_THROW_WITH(activation_forward(x, x, ActivationOp::leaky_relu(std::nan("")), stream()),
                    InvalidArgument, "leaky_relu's negative_slope is nan; it must be finite");
}

// --- float32 on every ISA of the CPU ------------------------------------------------

// Inputs for the CPU's float32 lanes (kernels/cpu/float_lanes.h): a dense grid over
// [-14, 14] (both tails, the branch points of tanh at 0.625 and of exp's reduction),
// +-10^k from the subnormals to the largest floats, the tails' points -30, -10 and
// +10, and +-0, +-inf, NaN; shuffled so that special values fall in every lane.
std::vector<float> float32_edge_inputs() {
  std::vector<float> v = random_values(20000, 41, -14.0f, 14.0f);
  for (int k = -45; k <= 38; ++k) {
    for (float m : {1.0f, 3.0f}) {
      const auto x = static_cast<float>(m * std::pow(10.0, k));
      if (std::isfinite(x)) v.insert(v.end(), {x, -x});
    }
  }
  v.insert(v.end(), {-30.0f, -10.0f, 10.0f, 0.625f, -0.625f, std::nextafter(0.625f, 0.0f), 0.0f,
                     -0.0f, kInf, -kInf, kNaN, std::numeric_limits<float>::denorm_min(),
                     std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()});
  std::mt19937 shuffle(7);
  std::shuffle(v.begin(), v.end(), shuffle);
  return v;
}

// The float32 CPU path is float math in vector lanes, not the reference: on every
// ISA this CPU has, forward and backward (accumulated into a sentinel and
// assigned) must stay within kernels/activation.h's 1e-6 + 1e-5 |reference| of the
// double reference, with NaN exactly where it has one, over float32_edge_inputs
// cut into rows of 1, 7, 17 and 1029 values (partial vector groups). The control
// is the test run once with a planted error in the approximations (the report of
// the commit that added this).
TEST(ActivationCpu, EveryIsaMatchesTheReferenceInFloat32) {
  const std::vector<float> all = float32_edge_inputs();
  for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
    for (const ActivationOp& act : all_activations()) {
      for (std::size_t n : {1, 7, 17, 1029, 0}) {
        const std::vector<float> x = n == 0 ? all : std::vector<float>(all.end() - n, all.end());
        const auto rows = std::int64_t(x.size());
        const auto grad_y = random_values(x.size(), 43, -2.0f, 2.0f);
        const std::vector<float> sentinel(x.size(), 0.5f);
        const std::string where = isa + ", " + name(act) + ", n = " + std::to_string(rows);
        Tensor tx = Tensor::from_host<float>(x, {rows}, cpu());
        Tensor y = Tensor::empty({rows}, cpu());
        activation_forward(y, tx, act, cpu());
        EXPECT_TRUE(matches_reference(y.to_host<float>(cpu()), reference_forward(x, act))) << where;
        Tensor gy = Tensor::from_host<float>(grad_y, {rows}, cpu());
        for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
          Tensor gx = Tensor::from_host<float>(sentinel, {rows}, cpu());
          activation_backward(gx, gy, tx, act, cpu(), write);
          EXPECT_TRUE(matches_reference(gx.to_host<float>(cpu()),
                                        reference_backward(sentinel, grad_y, x, act, write)))
              << where << (write == GradWrite::Assign ? ", assigned" : ", accumulated");
        }
      }
    }
  });
}

// GELU and the sigmoid family keep their value relative to itself in the negative
// tail (kernels/activation.h), where the tolerance's 1e-6 would hide any error:
// there the float32 path must hold 1e-5 relative alone, down to the smallest normal
// results (GELU's tanh form to x = -6: its u is a float32 polynomial whose rounding
// grows with |u|).
TEST(ActivationCpu, NegativeTailsAreAccurateRelativeToTheirValue) {
  struct Tail {
    ActivationOp act;
    float low;
  };
  for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
    for (const Tail& tail :
         {Tail{ActivationOp::gelu(), -12.5f}, Tail{ActivationOp::sigmoid(), -85.0f},
          Tail{ActivationOp::silu(), -80.0f},
          Tail{ActivationOp::gelu(GeluApproximate::Tanh), -6.0f}}) {
      const auto x = random_values(4099, 47, tail.low, -1.0f);
      const auto n = std::int64_t(x.size());
      const std::vector<float> ones(x.size(), 1.0f);
      Tensor tx = Tensor::from_host<float>(x, {n}, cpu());
      Tensor y = Tensor::empty({n}, cpu());
      activation_forward(y, tx, tail.act, cpu());
      Tensor g = Tensor::empty({n}, cpu());
      activation_backward(g, Tensor::from_host<float>(ones, {n}, cpu()), tx, tail.act, cpu(),
                          GradWrite::Assign);
      const std::string where = isa + ", " + name(tail.act);
      EXPECT_TRUE(all_close(y.to_host<float>(cpu()), reference_forward(x, tail.act), 0.0, 1e-5))
          << where;
      EXPECT_TRUE(all_close(g.to_host<float>(cpu()),
                            reference_backward(ones, ones, x, tail.act, GradWrite::Assign), 0.0,
                            1e-5))
          << where << "'";
    }
  });
}

// The reference itself at a few points whose values are known in closed form or
// from PyTorch (torch.nn.functional, float64), so that the specification the
// backends are compared with is not wrong in the same way they are.
class ActivationSixteenBitTest : public SixteenBitTest {};
TL_INSTANTIATE_SIXTEEN_BIT(ActivationSixteenBitTest);

// The elements of `actual` outside the 16-bit tolerance of kernels/activation.h:
// one unit in the last place of T at the expected value, plus 1e-6 + 1e-5
// |expected|; a NaN must meet a NaN and an infinity itself.
template <typename T>
std::size_t beyond_tolerance(const std::vector<float>& actual, const std::vector<float>& expected) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const float a = actual[i], e = expected[i];
    if (std::isnan(e) || std::isinf(e)) {
      count += (std::isnan(e) ? !std::isnan(a) : a != e) ? 1 : 0;
      continue;
    }
    const T rounded(e);
    const float ulp = static_cast<float>(T::from_bits(std::uint16_t((rounded.bits & 0x7fff) + 1))) -
                      std::fabs(static_cast<float>(rounded));
    count += std::fabs(a - e) <= ulp + 1e-6f + 1e-5f * std::fabs(e) ? 0 : 1;
  }
  return count;
}

// Forward, accumulated and assigned backward of every activation on odd sizes (4099
// crosses the CPU kernels' conversion blocks of 1024 values), with NaN, infinities
// and signed zeros among the inputs and the gradients: on the CPU the reference's
// bits under every ISA it has, on CUDA within the tolerance. The control: the
// activations of the inputs before their rounding to 16 bits fall outside that
// tolerance somewhere, so it is tight enough to see one rounding.
TEST_P(ActivationSixteenBitTest, TheReferenceRoundedOnce) {
  for_each_cpu_isa([&](const std::string& isa) {
    for (const ActivationOp& act : all_activations()) {
      for (std::int64_t n : {1, 7, 1029, 4099}) {
        const auto size = static_cast<std::size_t>(n);
        const auto xv = values_with_specials(size, 31, -6.0f, 6.0f);
        const auto gyv = values_with_specials(size, 32);
        const auto sentinel = random_values(size, 33, -4.0f, 4.0f);
        Tensor x = make(xv, {n}), grad_y = make(gyv, {n});
        Tensor y = Tensor::empty({n}, stream(), dtype());
        activation_forward(y, x, act, stream());
        Tensor added = make(sentinel, {n}), assigned = make(sentinel, {n});
        activation_backward(added, grad_y, x, act, stream());
        activation_backward(assigned, grad_y, x, act, stream(), GradWrite::Assign);
        typed([&]<typename T>() {
          const std::vector<T> x16 = narrow<T>(xv), gy16 = narrow<T>(gyv);
          std::vector<T> ey(size), eadded = narrow<T>(sentinel), eassigned = eadded;
          reference::activation_forward(ey.data(), x16.data(), n, act);
          reference::activation_backward(eadded.data(), gy16.data(), x16.data(), n, act,
                                         GradWrite::Accumulate);
          reference::activation_backward(eassigned.data(), gy16.data(), x16.data(), n, act,
                                         GradWrite::Assign);
          const std::string where = isa + ", " + name(act) + ", n = " + std::to_string(n);
          if (device().is_cpu()) {
            EXPECT_EQ(bits(host(y)), bits(widen(ey))) << where;
            EXPECT_EQ(bits(host(added)), bits(widen(eadded))) << where;
            EXPECT_EQ(bits(host(assigned)), bits(widen(eassigned))) << where;
          } else {
            EXPECT_EQ(beyond_tolerance<T>(host(y), widen(ey)), 0u) << where;
            EXPECT_EQ(beyond_tolerance<T>(host(added), widen(eadded)), 0u) << where;
            EXPECT_EQ(beyond_tolerance<T>(host(assigned), widen(eassigned)), 0u) << where;
          }
          if (n < 1029) return;  // the controls, on values past the specials
          EXPECT_GT(beyond_tolerance<T>(widen(eassigned), widen(eadded)), 0u)
              << "control, " << where;
          if (act.kind == ActivationKind::Sigmoid) {
            const std::vector<T> unrounded = narrow<T>(reference_forward(xv, act));
            EXPECT_GT(beyond_tolerance<T>(widen(unrounded), widen(ey)), 0u) << "control, " << where;
          }
        });
      }
    }
  });
}

TEST(ActivationReference, KnownValues) {
  auto f = [](const ActivationOp& act, double x) { return reference::activation_value(act, x); };
  auto df = [](const ActivationOp& act, double x) {
    return reference::activation_derivative(act, x);
  };
  EXPECT_DOUBLE_EQ(f(ActivationOp::sigmoid(), 0.0), 0.5);
  EXPECT_NEAR(f(ActivationOp::sigmoid(), -800.0), 0.0, 1e-300);  // no overflow on the way
  EXPECT_NEAR(f(ActivationOp::sigmoid(), 2.0), 0.8807970779778823, 1e-15);
  EXPECT_NEAR(f(ActivationOp::tanh(), 1.0), 0.7615941559557649, 1e-15);
  EXPECT_NEAR(f(ActivationOp::gelu(), 1.0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(f(ActivationOp::gelu(GeluApproximate::Tanh), 1.0), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(f(ActivationOp::silu(), 1.0), 0.7310585786300049, 1e-15);
  EXPECT_DOUBLE_EQ(f(ActivationOp::leaky_relu(), -2.0), -0.02);
  EXPECT_NEAR(df(ActivationOp::gelu(), 1.0), 1.0833154705876864, 1e-14);
  EXPECT_NEAR(df(ActivationOp::gelu(GeluApproximate::Tanh), 1.0), 1.0829640838457826, 1e-14);
  EXPECT_NEAR(df(ActivationOp::silu(), 1.0), 0.9276705118714869, 1e-15);
  // The negative tail keeps its relative accuracy: Phi(-10) = 7.6198530241605e-24.
  EXPECT_NEAR(f(ActivationOp::gelu(), -10.0) / (-10.0 * 7.6198530241605e-24), 1.0, 1e-12);
}

TEST(ActivationGradient, MatchesCentralDifferences) {
  const Stream& cpu = default_stream(Device::cpu());
  for (const ActivationOp& act : all_activations()) {
    Tensor x = random_double_tensor({4, 5}, 21, -4.0, 4.0);
    Tensor g = random_double_tensor({4, 5}, 22);
    auto loss = [&](const std::vector<Tensor>& in) {
      Tensor y = Tensor::empty({4, 5}, cpu, DType::Float64);
      activation_forward(y, in[0], act, cpu);
      return weighted_sum(g, y);
    };
    Tensor grad_x = Tensor::zeros({4, 5}, cpu, DType::Float64);
    activation_backward(grad_x, g, x, act, cpu);
    GradcheckOptions options;
    const double* p = x.data<double>();
    if (act.kind == ActivationKind::LeakyReLU) {  // the kink at 0
      options.skip = [p](std::size_t, std::int64_t i) { return std::abs(p[i]) < 1e-4; };
    }
    EXPECT_TRUE(check_gradient(loss, {x}, {grad_x}, options)) << name(act);
  }
}

TEST(ActivationGradient, ThroughTheTape) {
  using Op = Var (*)(const Var&);
  const std::vector<std::pair<const char*, std::function<Var(const Var&)>>> ops = {
      {"sigmoid", static_cast<Op>(ag::sigmoid)},
      {"tanh", static_cast<Op>(ag::tanh)},
      {"gelu", [](const Var& v) { return ag::gelu(v); }},
      {"gelu tanh", [](const Var& v) { return ag::gelu(v, GeluApproximate::Tanh); }},
      {"silu", static_cast<Op>(ag::silu)},
      {"leaky_relu", [](const Var& v) { return ag::leaky_relu(v, 0.1); }}};
  for (const auto& [op_name, op] : ops) {
    Tensor x = random_double_tensor({3, 4}, 31, -3.0, 3.0);
    Tensor grad = Tensor::zeros({3, 4}, cpu(), DType::Float64);
    auto loss_fn = [&](const std::vector<Tensor>& in) {
      Tape tape(cpu());
      // x used twice: the two contributions must add up.
      Var v = tape.constant(in[0]);
      return ag::sum(ag::add(op(v), ag::mul(op(v), v))).value().to_host<double>()[0];
    };
    Tape tape(cpu());
    Var v = tape.variable(x, grad, "x");
    tape.backward(ag::sum(ag::add(op(v), ag::mul(op(v), v))));
    EXPECT_TRUE(check_gradient(loss_fn, {x}, {grad})) << op_name;
  }
}

}  // namespace
}  // namespace towerlab::testing
