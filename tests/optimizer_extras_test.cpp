// Two training extras of the Optimizer: a linear learning-rate warmup before the
// schedule (LearningRate::with_warmup), and weight decay left off the variables of
// rank < 2 (WeightDecayOn::Matrices), on the whole flat buffer and on slices of it
// (a sharded master's update), which must give the whole buffer's bits; and the
// rounded copy an update can write (a mixed-precision working copy).
#include <cmath>
#include <numbers>
#include <string>

#include "autograd/optimizer.h"
#include "autograd/variables.h"
#include "kernels/cast.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

TEST(LearningRateWarmup, RampsLinearlyThenRunsTheScheduleFromItsOwnStepZero) {
  const LearningRate cosine = LearningRate::cosine(0.4, 10).with_warmup(4);
  EXPECT_DOUBLE_EQ(cosine.at(0), 0.1);  // lr(0) / W
  EXPECT_DOUBLE_EQ(cosine.at(1), 0.2);
  EXPECT_DOUBLE_EQ(cosine.at(3), 0.4);  // the ramp's last step reaches lr(0)
  EXPECT_DOUBLE_EQ(cosine.at(4), 0.4);  // the cosine's step 0
  EXPECT_DOUBLE_EQ(cosine.at(9), 0.2 * (1.0 + std::cos(std::numbers::pi * 5 / 10)));
  EXPECT_DOUBLE_EQ(cosine.at(14), 0.0);  // the cosine's end, 10 steps after the warmup
  EXPECT_DOUBLE_EQ(cosine.at(100), 0.0);

  const LearningRate step = LearningRate::step(1.0, 2, 0.5).with_warmup(2);
  EXPECT_EQ(step.at(0), 0.5);
  EXPECT_EQ(step.at(1), 1.0);
  EXPECT_EQ(step.at(3), 1.0);
  EXPECT_EQ(step.at(4), 0.5);

  // No warmup is the schedule itself, and the warmup is checked.
  const LearningRate plain = LearningRate::cosine(0.4, 10);
  EXPECT_EQ(plain.with_warmup(0).at(3), plain.at(3));
  EXPECT_THROW_WITH(plain.with_warmup(-1), InvalidArgument,
                    "learning rate: the warmup's length must be >= 0 steps, not -1");
}

TEST(LearningRateWarmup, TheOptimizerStepsThroughIt) {
  const Stream& cpu = default_stream(Device::cpu());
  VariableSet set;
  set.get("w", {1}, Initializer::constant(0.0f));
  VariableStore store(set, cpu, true);
  store.initialize(1, cpu);
  Optimizer sgd = Optimizer::sgd({}, LearningRate::constant(1.0).with_warmup(4));
  const Tensor one = Tensor::from_host<float>({1.0f}, {1}, cpu);
  std::vector<float> seen;
  for (int s = 0; s < 6; ++s) {
    seen.push_back(float(sgd.current_lr()));
    sgd.step(store, one, cpu);
  }
  EXPECT_EQ(seen, (std::vector<float>{0.25f, 0.5f, 0.75f, 1.0f, 1.0f, 1.0f}));
  // p = -sum(lr): 0.25 + 0.5 + 0.75 + 1 + 1 + 1, exact in binary fractions.
  EXPECT_EQ(store.flat_values().to_host<float>(cpu), (std::vector<float>{-4.5f}));
}

// A model's layout: a conv weight, its bias, a norm's scale, a linear weight, a bias.
VariableSet mixed_ranks() {
  VariableSet set;
  set.get("conv/weight", {2, 1, 2, 2}, Initializer::normal(0.0f, 1.0f));
  set.get("conv/bias", {2}, Initializer::normal(0.0f, 1.0f));
  set.get("bn/gamma", {2}, Initializer::normal(1.0f, 0.1f));
  set.get("bn/moving_mean", {2}, Initializer::constant(0.0f), /*trainable=*/false);
  set.get("fc/weight", {3, 2}, Initializer::normal(0.0f, 1.0f));
  set.get("fc/bias", {3}, Initializer::normal(0.0f, 1.0f));
  return set;
}

std::vector<Optimizer> decaying_optimizers() {
  return {Optimizer::sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5}),
          Optimizer::adam({.lr = 0.1, .weight_decay = 0.5}),
          Optimizer::adamw({.lr = 0.1, .weight_decay = 0.5})};
}

TEST(WeightDecayOn, MatricesDecaysRankTwoAndUpAndLeavesTheRestAsWithoutDecay) {
  const Stream& cpu = default_stream(Device::cpu());
  const VariableSet set = mixed_ranks();
  for (const Optimizer& base : decaying_optimizers()) {
    SCOPED_TRACE(base.name());
    VariableStore start(set, cpu, true);
    start.initialize(7, cpu);
    const Tensor grad = Tensor::from_host<float>(
        random_values(std::size_t(set.trainable_numel()), 3), {set.trainable_numel()}, cpu);
    auto run = [&](Optimizer optimizer) {
      VariableStore store(set, cpu, true);
      store.copy_from(start, cpu);
      for (int s = 0; s < 3; ++s) optimizer.step(store, grad, cpu);
      return store;
    };
    Optimizer matrices = base;
    matrices.decay(WeightDecayOn::Matrices);
    EXPECT_EQ(matrices.decays(), WeightDecayOn::Matrices);
    const VariableStore selective = run(matrices);
    const VariableStore all = run(base);
    Optimizer none = base;
    // The same optimizer with weight decay 0: what the excluded variables must get.
    if (base.kind() == Optimizer::Kind::Sgd) {
      SgdParams p = base.sgd_params();
      p.weight_decay = 0.0;
      none = Optimizer::sgd(p);
    } else {
      AdamParams p = base.adam_params();
      p.weight_decay = 0.0;
      none = base.kind() == Optimizer::Kind::Adam ? Optimizer::adam(p) : Optimizer::adamw(p);
    }
    const VariableStore undecayed = run(none);
    for (const VariableSpec& spec : set.specs()) {
      if (!spec.trainable) continue;
      SCOPED_TRACE(spec.name);
      const auto got = selective.value(spec.name).to_host<float>(cpu);
      const VariableStore& expected = spec.shape.size() >= 2 ? all : undecayed;
      EXPECT_EQ(got, expected.value(spec.name).to_host<float>(cpu));
      // Control: decay makes a difference here, so the comparison above can fail.
      EXPECT_NE(all.value(spec.name).to_host<float>(cpu),
                undecayed.value(spec.name).to_host<float>(cpu));
    }
  }
}

TEST(WeightDecayOn, SlicesGiveTheWholeBuffersBits) {
  const Stream& cpu = default_stream(Device::cpu());
  const VariableSet set = mixed_ranks();
  const std::int64_t n = set.trainable_numel();
  const Tensor grad = Tensor::from_host<float>(random_values(std::size_t(n), 4), {n}, cpu);
  for (const Optimizer& base : decaying_optimizers()) {
    SCOPED_TRACE(base.name());
    VariableStore whole(set, cpu, true);
    whole.initialize(9, cpu);
    const std::vector<float> start = whole.flat_values().to_host<float>(cpu);
    Optimizer one = base;
    one.decay(WeightDecayOn::Matrices);
    for (int s = 0; s < 3; ++s) one.step(whole, grad, cpu);
    // Cuts inside variables and at their borders, as a sharded master's slices fall.
    for (std::int64_t cut : {std::int64_t(1), std::int64_t(8), std::int64_t(9), n / 2, n - 1}) {
      SCOPED_TRACE(cut);
      std::vector<float> joined;
      for (auto [begin, end] : {std::pair{std::int64_t(0), cut}, std::pair{cut, n}}) {
        Tensor part = Tensor::from_host<float>(
            std::vector<float>(start.begin() + begin, start.begin() + end), {end - begin}, cpu);
        Optimizer shard = base;
        shard.decay(WeightDecayOn::Matrices);
        for (int s = 0; s < 3; ++s) shard.step(set, begin, part, grad.slice(begin, end), cpu);
        const auto values = part.to_host<float>(cpu);
        joined.insert(joined.end(), values.begin(), values.end());
      }
      EXPECT_EQ(joined, whole.flat_values().to_host<float>(cpu));
    }
  }
}

// Optimizer::step's rounded copy (a mixed-precision working copy) is the cast of the
// updated values, bit for bit, for every kind (Adam and AdamW round inside their
// update, SGD and RMSProp cast after it), over runs of variables with and without
// decay (WeightDecayOn::Matrices: one update a run, each with its part of the copy),
// and the values are those of the step without a copy. A float32 copy is refused.
TEST(OptimizerRoundedCopy, IsTheCastOfTheUpdatedValuesForEveryKind) {
  const Stream& cpu = default_stream(Device::cpu());
  const VariableSet set = mixed_ranks();
  const std::int64_t n = set.trainable_numel();
  const Tensor grad = Tensor::from_host<float>(random_values(std::size_t(n), 5), {n}, cpu);
  std::vector<Optimizer> kinds = decaying_optimizers();
  kinds.push_back(Optimizer::rmsprop({.lr = 0.01}));
  for (Optimizer& base : kinds) {
    for (bool matrices : {false, true}) {
      SCOPED_TRACE(std::string(base.name()) + (matrices ? ", matrices" : ""));
      if (matrices) base.decay(WeightDecayOn::Matrices);
      VariableStore with(set, cpu, true), without(set, cpu, true);
      with.initialize(11, cpu);
      without.copy_from(with, cpu);
      Optimizer a = base, b = base;
      Tensor rounded = Tensor::zeros({n}, cpu, DType::BFloat16);
      for (int s = 0; s < 3; ++s) {
        a.step(with, grad, cpu, rounded);
        b.step(without, grad, cpu);
      }
      EXPECT_EQ(with.flat_values().to_host<float>(cpu), without.flat_values().to_host<float>(cpu));
      std::vector<float> got, want;
      for (bfloat16 v : rounded.to_host<bfloat16>(cpu)) got.push_back(float(v));
      for (bfloat16 v : cast(without.flat_values(), DType::BFloat16, cpu).to_host<bfloat16>(cpu)) {
        want.push_back(float(v));
      }
      EXPECT_EQ(got, want);
      EXPECT_THROW(a.step(with, grad, cpu, Tensor::zeros({n}, cpu)), ShapeError);
    }
  }
}

TEST(WeightDecayOn, ASliceOutsideTheLayoutIsRefused) {
  const Stream& cpu = default_stream(Device::cpu());
  const VariableSet set = mixed_ranks();
  Optimizer sgd = Optimizer::sgd({.lr = 0.1});
  const Tensor four = Tensor::zeros({4}, cpu);
  EXPECT_THROW_WITH(sgd.step(set, set.trainable_numel() - 2, four, four, cpu), InvalidArgument,
                    "is not a flat slice of the model's 21 trainable values");
}

}  // namespace
}  // namespace towerlab::testing
