// The Optimizer's learning rate has one source of truth: a schedule, or the
// parameters' lr when no schedule is given. A parameters' lr that disagrees with
// the schedule is an error, not silently ignored.
#include "autograd/optimizer.h"
#include "autograd/variables.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

TEST(OptimizerLearningRate, AParamsLrThatDisagreesWithTheScheduleThrows) {
  EXPECT_THROW_WITH(Optimizer::adam({.lr = 0.5}, LearningRate::constant(3e-3)), InvalidArgument,
                    "optimizer adam: the parameters' lr (0.5) differs from the learning-rate "
                    "schedule's base (0.003)");
  EXPECT_THROW_WITH(Optimizer::adamw({.lr = 0.5}, LearningRate::cosine(3e-3, 10)), InvalidArgument,
                    "optimizer adamw: the parameters' lr");
  EXPECT_THROW_WITH(Optimizer::sgd({.lr = 0.5}, LearningRate::step(0.1, 5, 0.5)), InvalidArgument,
                    "optimizer sgd: the parameters' lr");
  EXPECT_THROW_WITH(Optimizer::rmsprop({.lr = 0.5}, LearningRate::constant(0.1)), InvalidArgument,
                    "optimizer rmsprop: the parameters' lr");
}

TEST(OptimizerLearningRate, TheScheduleGivesTheRateAndTheParamsSayIt) {
  const Optimizer unset = Optimizer::adam({}, LearningRate::constant(3e-3));
  EXPECT_EQ(unset.current_lr(), 3e-3);
  EXPECT_EQ(unset.adam_params().lr, 3e-3);  // not the struct's default 0.001
  const Optimizer same = Optimizer::sgd({.lr = 0.1, .momentum = 0.9}, LearningRate::constant(0.1));
  EXPECT_EQ(same.current_lr(), 0.1);
  EXPECT_EQ(same.sgd_params().lr, 0.1);
  EXPECT_EQ(same.sgd_params().momentum, 0.9);
}

TEST(OptimizerLearningRate, WithoutAScheduleTheParamsLrIsAConstantRate) {
  EXPECT_EQ(Optimizer::adam({.lr = 0.5}).current_lr(), 0.5);
  EXPECT_EQ(Optimizer::adamw({.lr = 0.25}).current_lr(), 0.25);
  EXPECT_EQ(Optimizer::rmsprop({.lr = 0.125}).current_lr(), 0.125);
  const Optimizer sgd = Optimizer::sgd({.lr = 0.5});
  EXPECT_EQ(sgd.learning_rate().kind, LearningRate::Kind::Constant);
  EXPECT_EQ(sgd.current_lr(), 0.5);

  // And a step uses it: plain SGD is p -= lr * g, exact in binary fractions.
  const Stream& cpu = default_stream(Device::cpu());
  VariableSet set;
  set.get("w", {3}, Initializer::constant(1.0f));
  VariableStore store(set, cpu, true);
  store.initialize(1, cpu);
  Optimizer step = Optimizer::sgd({.lr = 0.5});
  step.step(store, Tensor::from_host<float>({1.0f, -2.0f, 0.5f}, {3}, cpu), cpu);
  EXPECT_EQ(store.flat_values().to_host<float>(cpu), (std::vector<float>{0.5f, 2.0f, 0.75f}));
}

}  // namespace
}  // namespace towerlab::testing
