// The trainer's numerical guard (NumericGuard, parallel/trainer.h): a NaN or an
// infinity in the loss or the averaged gradient stops the step (the default) or
// skips it. Either way nothing is updated, and the trainer then trains on exactly
// as if the bad batch had never come. Off lets the NaN through: the control.
#include <cmath>
#include <limits>
#include <sstream>

#include "test_util.h"

namespace towerlab::testing {
namespace {

// conv -> batch norm -> linear: the forward pass moves the moving statistics, so
// a refused step has state to put back, not only values.
struct GuardedModel {
  VariableSet vars;
  Sequential net;
  GuardedModel() {
    net.add<Conv2d>(vars, "conv", 1, 3, 3, Conv2dParams{.pad_h = 1, .pad_w = 1}, false);
    net.add<BatchNorm>(vars, "bn", 3, 0.9);
    net.add<ReLU>();
    net.add<Flatten>();
    net.add<Linear>(vars, "fc", 3 * 6 * 6, 4);
  }
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Var logits = net(tower.context(), tower.input(batch[0], "images"));
      return TowerResult{
          ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels")), {}, {}};
    };
  }
};

// Eight 6x6 images; with `poison`, pixel (2,3) of sample `at` holds it.
std::vector<Tensor> batch_of(unsigned seed, std::optional<float> poison = {}, std::int64_t at = 6) {
  const std::int64_t n = 8;
  Tensor images = Tensor::empty({n, 1, 6, 6}, cpu());
  random_normal(images, seed, 0, 0.0f, 1.0f, cpu());
  if (poison) {
    std::vector<float> pixels = images.to_host<float>();
    pixels[std::size_t(at * 36 + 2 * 6 + 3)] = *poison;
    images = Tensor::from_host<float>(pixels, {n, 1, 6, 6}, cpu());
  }
  std::vector<float> labels;
  for (std::int64_t i = 0; i < n; ++i) labels.push_back(float((i * 5 + seed) % 4));
  return {images, Tensor::from_host<float>(labels, {n}, cpu())};
}

TrainerOptions two_towers(NumericGuard guard, std::ostream* log = nullptr) {
  TrainerOptions o;
  o.devices = {Device::cpu(), Device::cpu()};
  o.seed = 5;
  o.numeric_guard = guard;
  o.log = log;
  return o;
}

struct Snapshot {
  std::vector<float> values, state;
  std::int64_t updates;
  explicit Snapshot(Trainer& t)
      : values(t.master().flat_values().to_host<float>()),
        state(t.master().flat_state().to_host<float>()),
        updates(t.optimizer().steps()) {}
  bool operator==(const Snapshot&) const = default;
};

void expect_replicas_match_master(const Trainer& t) {
  for (std::size_t i = 0; i < t.num_towers(); ++i) {
    EXPECT_EQ(t.replica(i).flat_values().to_host<float>(),
              t.master().flat_values().to_host<float>())
        << "tower " << i;
    EXPECT_EQ(t.replica(i).flat_state().to_host<float>(), t.master().flat_state().to_host<float>())
        << "tower " << i;
  }
}

// Steps 1, 2 and 4 of a trainer that never saw batch 3.
Snapshot clean_run(const GuardedModel& m) {
  Trainer clean(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2),
                two_towers(NumericGuard::Stop));
  for (unsigned seed : {1u, 2u, 4u}) clean.step(batch_of(seed));
  return Snapshot(clean);
}

TEST(NumericGuard, StopIsTheDefaultNamesWhatWentWrongAndUpdatesNothing) {
  EXPECT_EQ(TrainerOptions{}.numeric_guard, NumericGuard::Stop);
  GuardedModel m;
  Trainer trainer(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), two_towers({}));
  trainer.step(batch_of(1));
  trainer.step(batch_of(2));
  const Snapshot before(trainer);
  // Sample 6 is in tower 1's half; its batch norm spreads the NaN to the whole tower.
  try {
    trainer.step(batch_of(3, std::numeric_limits<float>::quiet_NaN()));
    ADD_FAILURE() << "a NaN input trained without an error";
  } catch (const NumericError& e) {
    const std::string message = e.what();
    for (const char* part :
         {"Trainer: non-finite values at global step 2: the loss is nan", "tower 1 on cpu: nan",
          "the averaged gradient of conv/weight [3,1,3,3] is nan at element 0",
          "nothing was updated (NumericGuard::Stop"}) {
      EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in\n"
                                                       << message;
    }
    EXPECT_EQ(message.find("tower 0 on cpu: nan"), std::string::npos) << message;
  }
  EXPECT_TRUE(Snapshot(trainer) == before) << "a stopped step changed the master";
  expect_replicas_match_master(trainer);
  // Usable after: the next step is the step of a run that never saw the bad batch.
  trainer.step(batch_of(4));
  EXPECT_TRUE(Snapshot(trainer) == clean_run(m));
}

TEST(NumericGuard, StopCatchesInfinitiesInEitherTower) {
  GuardedModel m;
  for (const float bad :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    for (const std::int64_t at : {0, 7}) {
      Trainer trainer(m.vars, m.tower_fn(), Optimizer::by_name("sgd", 0.1), two_towers({}));
      EXPECT_THROW_WITH(trainer.step(batch_of(1, bad, at)), NumericError,
                        "non-finite values at global step 0");
      EXPECT_EQ(trainer.optimizer().steps(), 0);
    }
  }
}

TEST(NumericGuard, SkipLeavesEverythingAsItWasCountsAndWarns) {
  GuardedModel m;
  std::ostringstream log;
  Trainer trainer(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2),
                  two_towers(NumericGuard::Skip, &log));
  EXPECT_FALSE(trainer.step(batch_of(1)).skipped);
  trainer.step(batch_of(2));
  const Snapshot before(trainer);
  const StepResult r = trainer.step(batch_of(3, std::numeric_limits<float>::quiet_NaN()));
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(trainer.skipped_steps(), 1);
  EXPECT_NE(log.str().find("warning: skipped the step: non-finite values at global step 2: the "
                           "loss is nan"),
            std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("1 skipped so far"), std::string::npos) << log.str();
  EXPECT_TRUE(Snapshot(trainer) == before) << "a skipped step changed the master";
  expect_replicas_match_master(trainer);
  EXPECT_FALSE(trainer.step(batch_of(4)).skipped);
  EXPECT_TRUE(Snapshot(trainer) == clean_run(m));
}

TEST(NumericGuard, OffLetsTheNaNIntoTheVariables) {
  GuardedModel m;
  Trainer trainer(m.vars, m.tower_fn(), Optimizer::by_name("sgd", 0.1),
                  two_towers(NumericGuard::Off));
  const StepResult r = trainer.step(batch_of(1, std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(r.skipped);
  EXPECT_TRUE(std::isnan(r.loss));
  EXPECT_GE(first_nonfinite(trainer.master().flat_values(), cpu()), 0)
      << "without the guard the update should have spread the NaN (else this test proves nothing)";
}

}  // namespace
}  // namespace towerlab::testing
