// The tape: gradients through composed ops match central differences, gradients
// accumulate, and misuse (two tapes, backward twice, no trainable input) is a
// clear error.
#include <cmath>

#include "gradcheck.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// Float64 leaves with their own gradient buffers, for gradient checks.
struct Leaf {
  Tensor value;
  Tensor grad;
  Leaf(const Shape& shape, unsigned seed)
      : value(random_double_tensor(shape, seed)),
        grad(Tensor::zeros(shape, cpu(), DType::Float64)) {}
};

TEST(Autograd, ComposedOpsMatchCentralDifferences) {
  Leaf a({3, 4}, 1), b({3, 4}, 2), target({3, 4}, 3);
  // L = mse(relu(a * b + a) - 0.5 b, target) + l2(b) + mean(a)
  auto forward = [&](Tape& tape, const Tensor& va, const Tensor& vb, bool trainable) {
    Var x = trainable ? tape.variable(va, a.grad, "a") : tape.constant(va, "a");
    Var y = trainable ? tape.variable(vb, b.grad, "b") : tape.constant(vb, "b");
    Var t = tape.constant(target.value, "target");
    Var h = ag::relu(ag::add(ag::mul(x, y), x));
    Var out = ag::sub(h, ag::scale(y, 0.5));
    return ag::add_n({ag::mse(out, t), ag::l2_loss(y, 0.1), ag::mean(x)});
  };
  auto loss_fn = [&](const std::vector<Tensor>& in) {
    Tape tape(cpu());
    return forward(tape, in[0], in[1], false).value().to_host<double>()[0];
  };
  Tape tape(cpu());
  Var loss = forward(tape, a.value, b.value, true);
  tape.backward(loss);
  GradcheckOptions options;
  // Skip elements sitting within eps of the ReLU kink.
  const double* pa = a.value.data<double>();
  const double* pb = b.value.data<double>();
  options.skip = [&](std::size_t, std::int64_t i) {
    return std::abs(pa[i] * pb[i] + pa[i]) < 1e-4;
  };
  EXPECT_TRUE(check_gradient(loss_fn, {a.value, b.value}, {a.grad, b.grad}, options));
}

// ag::linear adds its bias in place on the product (nothing else reads it): its output
// and every gradient are the bits of matmul then bias_add on a new tensor, with and
// without the ReLU. The control: another bias gives other outputs.
TEST(Autograd, LinearAddsItsBiasInPlaceWithTheSameBits) {
  for (Activation activation : {Activation::None, Activation::ReLU}) {
    SCOPED_TRACE(activation == Activation::ReLU ? "ReLU" : "none");
    const Tensor x = Tensor::from_host<float>(random_values(7 * 5, 61), {7, 5}, cpu());
    const Tensor w = Tensor::from_host<float>(random_values(3 * 5, 62), {3, 5}, cpu());
    const std::vector<float> bias_values = random_values(3, 63);
    const auto run = [&](bool fused, const std::vector<float>& b_values) {
      Tape tape(cpu());
      Tensor gx = Tensor::zeros({7, 5}, cpu()), gw = Tensor::zeros({3, 5}, cpu()),
             gb = Tensor::zeros({3}, cpu());
      Var xv = tape.variable(x, gx, "x"), wv = tape.variable(w, gw, "w");
      Var bv = tape.variable(Tensor::from_host<float>(b_values, {3}, cpu()), gb, "b");
      Var y = fused ? ag::linear(xv, wv, bv, activation)
                    : ag::bias_add(ag::matmul(xv, wv, false, true), bv, activation);
      const std::vector<float> out = y.value().to_host<float>();
      tape.backward(ag::sum(ag::mul(y, y)));
      return std::vector<std::vector<float>>{out, gx.to_host<float>(), gw.to_host<float>(),
                                             gb.to_host<float>()};
    };
    const auto fused = run(true, bias_values), apart = run(false, bias_values);
    for (std::size_t i = 0; i < fused.size(); ++i) EXPECT_EQ(bits(fused[i]), bits(apart[i])) << i;
    std::vector<float> other = bias_values;
    other[0] += 0.5f;
    EXPECT_NE(bits(run(true, other)[0]), bits(fused[0]));
  }
}

TEST(Autograd, ValueUsedTwiceGetsBothContributions) {
  Tape tape(cpu());
  Leaf a({4}, 5);
  Var x = tape.variable(a.value, a.grad, "a");
  tape.backward(ag::sum(ag::mul(x, x)));  // d/dx sum(x^2) = 2x
  const auto g = a.grad.to_host<double>();
  const auto v = a.value.to_host<double>();
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_DOUBLE_EQ(g[i], 2 * v[i]);
}

TEST(Autograd, GradientsAccumulateAcrossBackwardPasses) {
  Tape tape(cpu());
  Leaf a({2}, 6);
  tape.backward(ag::sum(tape.variable(a.value, a.grad, "a")));
  tape.reset();
  tape.backward(ag::scale(ag::sum(tape.variable(a.value, a.grad, "a")), 3.0), 0.5);
  EXPECT_EQ(a.grad.to_host<double>(), (std::vector<double>{2.5, 2.5}));
}

TEST(Autograd, FlattenKeepsTheBatchDimension) {
  Tape tape(cpu());
  Leaf a({2, 3, 2}, 7);
  Var f = ag::flatten(tape.variable(a.value, a.grad, "a"));
  EXPECT_EQ(f.shape(), (Shape{2, 6}));
  tape.backward(ag::sum(f));
  EXPECT_EQ(a.grad.to_host<double>(), std::vector<double>(12, 1.0));
}

TEST(Autograd, InferenceModeRecordsNothing) {
  Tape tape(cpu());
  Leaf a({3}, 8);
  Var x = tape.variable(a.value, a.grad, "a");
  {
    NoGradGuard no_grad(tape);
    Var y = ag::relu(ag::scale(x, 2.0));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(tape.num_records(), 0u);
    EXPECT_THROW_WITH(tape.backward(ag::sum(y)), InvalidArgument,
                      "does not depend on any trainable variable");
  }
  EXPECT_TRUE(tape.grad_enabled());
}

TEST(Autograd, MisuseIsAClearError) {
  Tape tower0(cpu(), "tower 0 (cpu)"), tower1(cpu(), "tower 1 (cpu)");
  Leaf a({2, 2}, 9), b({2, 3}, 10);
  Var x = tower0.variable(a.value, a.grad, "conv1/weight");
  Var y = tower1.constant(b.value, "input");
  EXPECT_THROW_WITH(ag::add(x, y), InvalidArgument,
                    "add: input float64[2,3] belongs to tower 1 (cpu), not to tower 0 (cpu)");
  Var z = tower0.constant(b.value, "input");
  EXPECT_THROW_WITH(ag::add(x, z), ShapeError,
                    "add: conv1/weight float64[2,2] and input float64[2,3] do not broadcast "
                    "(dimension -1: 2 against 3)");
  EXPECT_THROW_WITH(ag::sub(x, z), ShapeError,
                    "sub: conv1/weight float64[2,2] and input float64[2,3] do not broadcast");
  Var loss = ag::sum(x);
  tower0.backward(loss);
  EXPECT_THROW_WITH(tower0.backward(loss), InvalidArgument, "backward() called twice");
  EXPECT_THROW_WITH(ag::sum(x), InvalidArgument, "after backward(); call reset()");
  tower0.reset();
  EXPECT_NO_THROW(tower0.backward(ag::sum(x)));
}

TEST(Autograd, LossMustBeAScalar) {
  Tape tape(cpu());
  Leaf a({3}, 11);
  EXPECT_THROW_WITH(tape.backward(ag::relu(tape.variable(a.value, a.grad, "a"))), ShapeError,
                    "needs a loss with one element, got relu float64[3]");
}

TEST(Autograd, BackwardFromAnOutputTakesTheUpstreamGradient) {
  Leaf a({2, 3}, 12);
  const Tensor upstream = random_double_tensor({2, 3}, 13);
  Tape tape(cpu());
  Var x = tape.variable(a.value, a.grad, "a");
  tape.backward(ag::mul(x, x), upstream);  // dL/dx = 2 x * upstream
  const auto got = a.grad.to_host<double>();
  const auto v = a.value.to_host<double>();
  const auto g = upstream.to_host<double>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_NE(got[i], 0.0) << i;
    EXPECT_NEAR(got[i], 2 * v[i] * g[i], 1e-14) << i;
  }

  Tape other(cpu());
  Var y = ag::mul(other.variable(a.value, a.grad, "a"), other.constant(a.value, "b"));
  EXPECT_THROW_WITH(other.backward(y, Tensor::zeros({3, 2}, cpu(), DType::Float64)), ShapeError,
                    "backward() from mul float64[2,3]: the upstream gradient is float64[3,2] on "
                    "cpu; it must be float64[2,3] (the output's shape, its gradient's dtype)");
  EXPECT_THROW_WITH(other.backward(y, Tensor::zeros({2, 3}, cpu())), ShapeError,
                    "the upstream gradient is float32[2,3] on cpu");
  EXPECT_THROW_WITH(other.backward(y, Tensor()), InvalidArgument,
                    "the upstream gradient is undefined");
}

TEST(Variables, DeclaredByNameAndSharedByReuse) {
  VariableSet set;
  const VariableSpec& w = set.get("conv1/weight", {32, 1, 3, 3}, Initializer::he_normal());
  set.get("conv1/bias", {32}, Initializer::zeros());
  set.get("bn1/moving_mean", {32}, Initializer::zeros(), false);
  EXPECT_EQ(&set.get("conv1/weight", {32, 1, 3, 3}, Initializer::zeros()), &w);  // reuse
  EXPECT_EQ(set.trainable_numel(), 288 + 32);
  EXPECT_EQ(set.state_numel(), 32);
  EXPECT_THROW_WITH(
      set.get("conv1/weight", {16, 1, 3, 3}, Initializer::zeros()), ShapeError,
      "variable conv1/weight exists with shape [32,1,3,3] but is asked for with shape [16,1,3,3]");
  EXPECT_THROW_WITH(set.get("conv1/bias", {32}, Initializer::zeros(), false), InvalidArgument,
                    "exists as trainable");
  EXPECT_THROW_WITH(
      set.at("conv2/weight"), InvalidArgument,
      "no variable named 'conv2/weight' (declared: conv1/weight, conv1/bias, bn1/moving_mean)");
}

TEST(Variables, StoreViewsLiveInFlatBuffers) {
  VariableSet set;
  set.get("a", {2, 3}, Initializer::constant(1.5f));
  set.get("b", {4}, Initializer::ones());
  set.get("s", {2}, Initializer::constant(-2.0f), false);
  VariableStore store(set, cpu());
  store.initialize(7, cpu());
  EXPECT_EQ(store.flat_values().to_host<float>(),
            (std::vector<float>{1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1, 1, 1, 1}));
  EXPECT_EQ(store.flat_state().to_host<float>(), (std::vector<float>{-2, -2}));
  fill(store.grad("b"), 3.0, cpu());
  EXPECT_EQ(store.flat_grads().to_host<float>()[6], 3.0f);
  store.zero_grad(cpu());
  EXPECT_EQ(store.flat_grads().to_host<float>(), std::vector<float>(10, 0.0f));
  EXPECT_THROW_WITH(store.grad("s"), InvalidArgument, "variable s is not trainable");
}

// A store that shares another's values reads and writes them: one memory. Its
// gradients and state stay its own; a store of another set, dtype or device is
// refused.
TEST(Variables, AStoreCanShareAnothersValues) {
  VariableSet set;
  set.get("a", {2, 3}, Initializer::constant(1.5f));
  set.get("s", {2}, Initializer::constant(-2.0f), false);
  VariableStore master(set, cpu());
  master.initialize(7, cpu());
  VariableStore replica(set, cpu());
  replica.set_working_dtype(DType::BFloat16, cpu());
  EXPECT_FALSE(replica.shares_values_with(master));
  replica.share_values(master);
  EXPECT_TRUE(replica.shares_values_with(master));
  fill(master.value("a"), 4.0, cpu());
  EXPECT_EQ(replica.flat_values().to_host<float>(), std::vector<float>(6, 4.0f));
  EXPECT_NE(replica.flat_grads().raw_data(), master.flat_grads().raw_data());
  EXPECT_NE(replica.flat_state().raw_data(), master.flat_state().raw_data());
  EXPECT_TRUE(replica.has_working()) << "the master has no working copy to share";
  VariableStore second(set, cpu());
  second.set_working_dtype(DType::BFloat16, cpu());
  second.share_values(replica);
  EXPECT_TRUE(second.shares_values_with(master));
  EXPECT_EQ(second.flat_working().raw_data(), replica.flat_working().raw_data());

  VariableSet other;
  other.get("a", {2, 3}, Initializer::zeros());
  VariableStore stranger(other, cpu());
  EXPECT_THROW_WITH(replica.share_values(stranger), InvalidArgument, "different variable sets");
  VariableStore in_float64(set, cpu(), true, DType::Float64);
  EXPECT_THROW_WITH(in_float64.share_values(master), InvalidArgument,
                    "a store on cpu in float64 cannot share the memory of one on cpu in float32");
}

// Two stores trade their gradient buffers whole (the Trainer's host master takes its
// CPU towers' averaged gradient so): each then holds the other's values, in the
// other's memory; values and state stay where they were. A store of another set,
// dtype or device, or without gradients, is refused.
TEST(Variables, TwoStoresTradeTheirGradientBuffers) {
  VariableSet set;
  set.get("a", {2, 3}, Initializer::constant(1.5f));
  set.get("s", {2}, Initializer::constant(-2.0f), false);
  VariableStore master(set, cpu()), tower(set, cpu());
  fill(master.grad("a"), 1.0, cpu());
  fill(tower.grad("a"), 2.0, cpu());
  const void* master_memory = master.flat_grads().raw_data();
  const void* tower_memory = tower.flat_grads().raw_data();
  const void* values = master.flat_values().raw_data();
  master.swap_grads(tower);
  EXPECT_EQ(master.flat_grads().raw_data(), tower_memory);
  EXPECT_EQ(tower.flat_grads().raw_data(), master_memory);
  EXPECT_EQ(master.grad("a").to_host<float>(), std::vector<float>(6, 2.0f));
  EXPECT_EQ(tower.grad("a").to_host<float>(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(master.flat_values().raw_data(), values);

  VariableSet other;
  other.get("a", {2, 3}, Initializer::zeros());
  VariableStore stranger(other, cpu());
  EXPECT_THROW_WITH(master.swap_grads(stranger), InvalidArgument, "different variable sets");
  VariableStore in_float64(set, cpu(), true, DType::Float64);
  EXPECT_THROW_WITH(in_float64.swap_grads(master), InvalidArgument,
                    "gradients on cpu in float64 cannot trade buffers with gradients on cpu in "
                    "float32");
  VariableStore without(set, cpu(), false);
  EXPECT_THROW_WITH(without.swap_grads(master), InvalidArgument,
                    "swap_grads: this store holds no gradients");
  EXPECT_THROW_WITH(master.swap_grads(without), InvalidArgument,
                    "swap_grads: the other store holds no gradients");
}

TEST(Variables, InitializersAreScaledByFanAndIndependentOfOrder) {
  VariableSet one, two;
  one.get("conv/weight", {64, 32, 3, 3}, Initializer::he_normal());
  one.get("fc/weight", {10, 128}, Initializer::glorot_uniform());
  two.get("fc/weight", {10, 128}, Initializer::glorot_uniform());  // other order
  two.get("conv/weight", {64, 32, 3, 3}, Initializer::he_normal());
  VariableStore s1(one, cpu()), s2(two, cpu());
  s1.initialize(42, cpu());
  s2.initialize(42, cpu());
  EXPECT_EQ(s1.value("conv/weight").to_host<float>(), s2.value("conv/weight").to_host<float>());
  EXPECT_EQ(s1.value("fc/weight").to_host<float>(), s2.value("fc/weight").to_host<float>());
  const auto w = s1.value("conv/weight").to_host<float>();
  double var = 0.0;
  for (float v : w) var += double(v) * v;
  var /= double(w.size());
  EXPECT_NEAR(var, 2.0 / (32 * 9), 0.1 * 2.0 / (32 * 9));  // He: 2 / fan_in
  const float limit = std::sqrt(6.0f / (128 + 10));
  for (float v : s1.value("fc/weight").to_host<float>()) ASSERT_LE(std::abs(v), limit);
  VariableStore s3(one, cpu());
  s3.initialize(43, cpu());
  EXPECT_NE(s3.value("conv/weight").to_host<float>(), w);
}

}  // namespace
}  // namespace towerlab::testing
