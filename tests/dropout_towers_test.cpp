// Dropout in a trained model (the Dropout layer, Context::dropout_key): N towers,
// even and uneven, take one device's steps because a sample's mask depends on its
// index in the whole batch, not on its tower; a control whose key forgets the
// slice's first sample does not; the trainer hands each tower its step and first
// sample; evaluation drops nothing.
#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <utility>

#include "test_util.h"

namespace towerlab::testing {
namespace {

// Dropout that keys every slice as if it were the batch's first rows: what a
// tower-local random stream would do.
class SliceLocalDropout : public Layer {
 public:
  Var forward(const Context& ctx, const Var& x) const override {
    DropoutKey key = ctx.dropout_key("drop");
    key.first_row = 0;
    return ag::dropout(x, 0.5, key, ctx.training);
  }
  std::string describe() const override { return "SliceLocalDropout"; }
};

// A small CNN with dropout before its classifier.
struct DropoutModel {
  VariableSet vars;
  Sequential net;
  explicit DropoutModel(bool slice_local = false) {
    net.add<Conv2d>(vars, "conv1", 1, 4, 3, Conv2dParams{.pad_h = 1, .pad_w = 1});
    net.add<ReLU>();
    net.add<MaxPool2d>(Pool2dParams::square(2, 2));
    net.add<Flatten>();
    if (slice_local) {
      net.add<SliceLocalDropout>();
    } else {
      net.add<Dropout>("drop", 0.5);
    }
    net.add<Linear>(vars, "fc", 4 * 4 * 4, 3);
  }
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Var logits = net(tower.context(), tower.input(batch[0], "images"));
      return TowerResult{ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels")),
                         {logits}};
    };
  }
};

TrainerOptions towers_on_cpu(int towers) {
  TrainerOptions o;
  o.devices.assign(std::size_t(towers), Device::cpu());
  o.seed = 5;
  return o;
}

// The losses of three steps and the final values, on `towers` towers.
struct TrainingRun {
  std::vector<double> losses;
  std::vector<float> values;
};
TrainingRun train(const DropoutModel& model, int towers, std::int64_t batch, double lr = 0.1) {
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("momentum", lr),
                  towers_on_cpu(towers));
  TrainingRun run;
  for (int s = 0; s < 3; ++s) {
    run.losses.push_back(trainer.step(small_image_batch(batch, 40 + s, 7)).loss);
  }
  run.values = trainer.master().flat_values().to_host<float>();
  return run;
}

bool same_steps(const TrainingRun& a, const TrainingRun& b) {
  for (std::size_t s = 0; s < a.losses.size(); ++s) {
    if (std::abs(a.losses[s] - b.losses[s]) > 1e-5 * std::abs(a.losses[s])) return false;
  }
  return all_close(a.values, b.values, 2e-6, 1e-4);
}

TEST(DropoutTowers, TowersTakeOneDevicesStepsWithDropout) {
  DropoutModel model;
  for (std::int64_t batch : {3, 7, 8}) {
    const TrainingRun one = train(model, 1, batch);
    for (int towers : {2, 3, 4}) {
      EXPECT_TRUE(same_steps(train(model, towers, batch), one))
          << "batch " << batch << ", " << towers << " towers";
    }
  }
}

// The control: masks keyed per slice differ from one device's as soon as a tower's
// slice does not start at sample 0.
TEST(DropoutTowers, ControlSliceLocalMasksDiffer) {
  DropoutModel model(/*slice_local=*/true);
  EXPECT_TRUE(same_steps(train(model, 1, 8), train(model, 1, 8)));  // deterministic
  EXPECT_FALSE(same_steps(train(model, 2, 8), train(model, 1, 8)));
}

// The trainer hands each tower the step and its slice's first sample (the key's
// parts), and evaluation drops nothing.
TEST(DropoutTowers, TowersSeeTheStepAndTheirFirstSampleAndEvaluationDropsNothing) {
  DropoutModel model;
  std::vector<std::pair<std::int64_t, std::int64_t>> seen;  // (step, first sample)
  std::mutex seen_mutex;
  TowerFn fn = [&](const Tower& tower, const std::vector<Tensor>& batch) {
    {
      std::lock_guard lock(seen_mutex);
      seen.emplace_back(tower.step, tower.first_sample);
    }
    EXPECT_EQ(tower.seed, 5u);
    return model.tower_fn()(tower, batch);
  };
  Trainer trainer(model.vars, fn, Optimizer::by_name("sgd", 0.1), towers_on_cpu(3));
  const std::vector<Tensor> batch = small_image_batch(8, 50, 7);  // slices 0-2, 3-5, 6-7
  trainer.step(batch);
  trainer.step(batch);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::pair<std::int64_t, std::int64_t>>{
                      {0, 0}, {0, 3}, {0, 6}, {1, 0}, {1, 3}, {1, 6}}));
  const StepResult a = trainer.evaluate(batch);
  const StepResult b = trainer.evaluate(batch);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.outputs[0].to_host<float>(), b.outputs[0].to_host<float>());
}

TEST(DropoutTowers, RejectsABadProbability) {
  EXPECT_THROW_WITH(Dropout("head/dropout", 1.5), InvalidArgument,
                    "Dropout head/dropout: p is 1.5");
  EXPECT_EQ(Dropout("head/dropout", 0.1).describe(), "head/dropout: Dropout p 0.1");
}

}  // namespace
}  // namespace towerlab::testing
