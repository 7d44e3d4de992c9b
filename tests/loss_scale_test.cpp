// fp16 with dynamic loss scaling (Precision::Fp16, LossScale in parallel/precision.h):
// GradScaler's rules step by step (start 2^16, halve and skip on an overflow, double
// after the growth interval's clean steps); a forced overflow (the loss times 1e30:
// finite in float32, infinite once the scaled output gradient is rounded to
// float16) skips the step on every tower and every process, whichever tower or
// process overflowed, and changes nothing (master, slots, step count); 1, 2 and 3
// towers and two processes see the same scales and skips; N towers take one tower's
// steps to kFp16Tolerance, and fp32 and bf16 are further than that (the controls);
// the same run gives the same bits, and so does a sharded master; the gradient is
// unscaled before clipping and the update; the scale is in the training state,
// and a resumed run continues bit for bit; a master value beyond float16's range
// gives the guard's NumericError. With two CUDA devices (the emulated GPUs), fp16
// towers there take the CPU's fp16 steps.
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "cnn_model.h"
#include "file_test_util.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

// How far N fp16 towers may be from one fp16 tower after three SGD steps at rate
// 0.1 (absolute, on the variables): as precision_test.cpp's kTowerTolerance for
// bf16, a float32 sum in another order can move a value across a float16 rounding
// boundary, now 2^-11 relative instead of 2^-8, so eight times less. The towers
// otherwise differ by float32 order alone (near 1e-7).
constexpr double kFp16Tolerance = 1.25e-5;

struct Model : CnnModel {
  // The tower's loss is multiplied by boost(tower) (1: the plain loss). 1e30 keeps
  // the float32 loss finite, while its scaled gradient overflows float16 at the
  // first GEMM's backward: a forced overflow.
  std::function<double(const Tower&)> boost = [](const Tower&) { return 1.0; };
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Var logits = net(tower.context(), tower.input(batch[0], "images"));
      Var loss = ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels"));
      const double b = boost(tower);
      return TowerResult{b == 1.0 ? loss : ag::scale(loss, b), {logits}, {}};
    };
  }
};

TrainerOptions towers(int n, Precision precision = Precision::Fp16,
                      std::int64_t growth_interval = LossScale::kGrowthInterval) {
  TrainerOptions o;
  o.devices.assign(std::size_t(n), Device::cpu());
  o.seed = 5;
  o.precision = precision;
  o.loss_scale_growth_interval = growth_interval;
  return o;
}

// What a skipped step must leave alone.
struct Snapshot {
  std::vector<float> values, slots;
  std::int64_t steps;
  explicit Snapshot(Trainer& t)
      : values(t.master().flat_values().to_host<float>()),
        slots(t.optimizer().slots().at("m").to_host<float>()),
        steps(t.optimizer().steps()) {}
  bool operator==(const Snapshot&) const = default;
};

// One step's loss scale as the trainer reported it.
struct ScaleStep {
  double scale;
  bool overflow;
  bool operator==(const ScaleStep&) const = default;
};

// `steps` steps of batch size `batch`: each step's scale and overflow, and the
// final values. `now`, when given, holds the index of the step being taken (a step
// skipped for overflow does not advance Tower::step, so a forced overflow is
// keyed to this instead).
struct ScaleRun {
  std::vector<ScaleStep> steps;
  std::vector<float> values;
};
ScaleRun scale_run(Trainer& trainer, int steps, std::int64_t batch = 7, int* now = nullptr) {
  ScaleRun run;
  for (int s = 0; s < steps; ++s) {
    if (now != nullptr) *now = s;
    const StepResult r = trainer.step(small_image_batch(batch, 100 + unsigned(s), 7));
    run.steps.push_back({r.loss_scale, r.overflow});
  }
  run.values = trainer.master().flat_values().to_host<float>();
  return run;
}

TEST(LossScale, FollowsGradScalersRulesStepByStep) {
  LossScale s(true, 3);
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.clean_steps(), 2);
  s.update(false);  // the third clean step in a row
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.clean_steps(), 0);
  s.update(false);
  s.update(true);  // an overflow halves and restarts the count
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.clean_steps(), 0);
  s.update(true);
  EXPECT_EQ(s.scale(), 32768.0);

  LossScale off;  // every other precision
  EXPECT_FALSE(off.enabled());
  off.update(true);
  EXPECT_EQ(off.scale(), 1.0);

  EXPECT_THROW_WITH(LossScale(true, 0), InvalidArgument,
                    "loss_scale_growth_interval must be at least 1");
  EXPECT_THROW_WITH(s.restore(3.0, 0), InvalidArgument, "a positive power of two");
  EXPECT_THROW_WITH(s.restore(0.5, -1), InvalidArgument, "a positive power of two");
  s.restore(0.25, 5);  // a count past a smaller interval: the next clean step doubles
  s.update(false);
  EXPECT_EQ(s.scale(), 0.5);
}

// The rules inside the trainer with no forced overflow: with a growth interval of 2
// the scale doubles until the scaled output gradients overflow float16 on their
// own, then backs off; every reported step follows the rules, the overflow steps
// are not counted as updates, and the test sees both events.
TEST(LossScale, GrowsAfterTheIntervalAndBacksOffAtFloat16sEdge) {
  Model model;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-3),
                  towers(2, Precision::Fp16, 2));
  const ScaleRun run = scale_run(trainer, 24);
  double scale = 65536.0;
  int clean = 0, growths = 0, overflows = 0, updates = 0;
  for (std::size_t s = 0; s < run.steps.size(); ++s) {
    EXPECT_EQ(run.steps[s].scale, scale) << "step " << s;
    if (run.steps[s].overflow) {
      scale /= 2, clean = 0, ++overflows;
    } else if (++updates, ++clean == 2) {
      scale *= 2, clean = 0, ++growths;
    }
  }
  EXPECT_EQ(trainer.loss_scale().scale(), scale);
  EXPECT_EQ(trainer.loss_scale().clean_steps(), clean);
  EXPECT_EQ(trainer.optimizer().steps(), updates);
  EXPECT_EQ(trainer.skipped_steps(), 0) << "overflows are not NumericGuard::Skip's skips";
  EXPECT_GE(growths, 2);
  EXPECT_GE(overflows, 2) << "the scale never reached float16's edge: the test proves nothing";
}

// A forced overflow in one tower only skips the step on every tower, with the
// default NumericGuard::Stop (the loss is finite: the overflow is the scale's): the
// master, the optimizer's slots and step count stay, every replica holds the master,
// and the scale halves. The next step trains at the halved scale.
TEST(LossScale, AnOverflowInOneTowerSkipsTheStepOnEveryTowerAndHalvesTheScale) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " towers");
    Model model;
    bool force = false;
    model.boost = [&force](const Tower& t) { return force && t.index == 1 ? 1e30 : 1.0; };
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), towers(n));
    const StepResult first = trainer.step(small_image_batch(8, 1, 7));
    EXPECT_EQ(first.loss_scale, 65536.0);
    EXPECT_FALSE(first.overflow || first.skipped);
    const Snapshot before(trainer);
    force = true;
    const StepResult r = trainer.step(small_image_batch(8, 2, 7));
    EXPECT_TRUE(r.overflow);
    EXPECT_TRUE(r.skipped);
    EXPECT_TRUE(std::isfinite(r.loss)) << r.loss;
    EXPECT_EQ(r.loss_scale, 65536.0) << "the scale the step used";
    EXPECT_EQ(trainer.loss_scale().scale(), 32768.0);
    EXPECT_EQ(trainer.loss_scale().clean_steps(), 0);
    EXPECT_TRUE(Snapshot(trainer) == before) << "a skipped step changed the master";
    for (std::size_t i = 0; i < trainer.num_towers(); ++i) {
      EXPECT_EQ(bits(trainer.replica(i).flat_values().to_host<float>()), bits(before.values))
          << "tower " << i;
    }
    force = false;
    const StepResult next = trainer.step(small_image_batch(8, 3, 7));
    EXPECT_EQ(next.loss_scale, 32768.0);
    EXPECT_FALSE(next.skipped);
    EXPECT_EQ(trainer.optimizer().steps(), 2);
  }
}

// The control for the test above: the same factor under bf16, whose working dtype
// has float32's range, overflows nothing; so the skip is float16's range at work.
TEST(LossScale, TheSameForcedLossUnderBf16DoesNotOverflow) {
  Model model;
  model.boost = [](const Tower& t) { return t.index == 1 ? 1e30 : 1.0; };
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
                  towers(2, Precision::Bf16));
  const StepResult r = trainer.step(small_image_batch(8, 2, 7));
  EXPECT_FALSE(r.overflow || r.skipped);
  EXPECT_EQ(r.loss_scale, 1.0);
  EXPECT_EQ(trainer.optimizer().steps(), 1);
}

// 1, 2 and 3 towers see the same scales and overflows, and so do two processes
// (threads, tests/thread_process_group.h) of two towers, where only rank 1 is
// forced to overflow at step 3: the overflow verdict reads the gradient summed over
// every tower and process, so it is one verdict. (Across tower counts it is also the
// data's: each sample's output gradient is the same number whatever the split.)
TEST(LossScale, EveryTowerCountAndEveryProcessSkipsTheSameSteps) {
  Model model;
  std::vector<ScaleRun> runs;
  for (int n : {1, 2, 3}) {
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.05),
                    towers(n, Precision::Fp16, 2));
    runs.push_back(scale_run(trainer, 20));
  }
  EXPECT_EQ(runs[1].steps, runs[0].steps);
  EXPECT_EQ(runs[2].steps, runs[0].steps);
  EXPECT_GE(std::count_if(runs[0].steps.begin(), runs[0].steps.end(),
                          [](const ScaleStep& s) { return s.overflow; }),
            1);

  std::vector<std::vector<ScaleStep>> by_rank(2);
  std::vector<std::vector<float>> values(2);
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
    TrainerOptions o = towers(2, Precision::Fp16, 2);
    o.process_group = &group;
    Model mine;
    int now = 0;
    mine.boost = [rank, &now](const Tower&) { return rank == 1 && now == 3 ? 1e30 : 1.0; };
    Trainer trainer(mine.vars, mine.tower_fn(), Optimizer::by_name("adam", 1e-2), o);
    const ScaleRun run = scale_run(trainer, 8, 9, &now);
    by_rank[std::size_t(rank)] = run.steps;
    values[std::size_t(rank)] = run.values;
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
  EXPECT_EQ(by_rank[0], by_rank[1]);
  EXPECT_EQ(bits(values[0]), bits(values[1]));
  ASSERT_GT(by_rank[0].size(), 4u);
  EXPECT_TRUE(by_rank[0][3].overflow) << "rank 1's forced overflow, seen by rank 0";
}

// N towers take one tower's fp16 steps to kFp16Tolerance; fp32 and bf16 are
// further (the controls: a tower multiplying unrounded or bfloat16 values fails).
TEST(LossScale, Fp16TowersTakeOneTowersStepsToTheRoundingsTolerance) {
  const Model model;
  const auto three_steps = [&](const TrainerOptions& o, std::int64_t batch) {
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), o);
    for (unsigned s = 0; s < 3; ++s) trainer.step(small_image_batch(batch, 40 + s, 7));
    return trainer.master().flat_values().to_host<float>();
  };
  for (std::int64_t batch : {7, 8}) {
    const auto one = three_steps(towers(1), batch);
    for (int n : {2, 3}) {
      EXPECT_LE(max_difference(three_steps(towers(n), batch), one), kFp16Tolerance)
          << n << " towers, batch " << batch;
    }
    for (Precision other : {Precision::Fp32, Precision::Bf16}) {
      EXPECT_GT(max_difference(three_steps(towers(1, other), batch), one), 4 * kFp16Tolerance)
          << precision_name(other) << ", batch " << batch;
    }
  }
}

// The same run twice, through growth and a forced overflow, gives the same bits;
// a sharded master gives them too (its unscaling and clipping act on the slices).
TEST(LossScale, Fp16RepeatsItsBitsAndAShardedMasterGivesThem) {
  Model model;
  int now = 0;
  model.boost = [&now](const Tower& t) { return now == 2 && t.index == 2 ? 1e30 : 1.0; };
  const auto run = [&](MasterPlacement placement) {
    TrainerOptions o = towers(3, Precision::Fp16, 2);
    o.master_placement = placement;
    o.clip_grad_norm = 0.5;
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adamw", 1e-2), o);
    return scale_run(trainer, 8, 7, &now);
  };
  const ScaleRun a = run(MasterPlacement::OneDevice), b = run(MasterPlacement::OneDevice);
  const ScaleRun sharded = run(MasterPlacement::Sharded);
  EXPECT_TRUE(a.steps[2].overflow);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(bits(a.values), bits(b.values));
  EXPECT_EQ(sharded.steps, a.steps);
  EXPECT_EQ(bits(sharded.values), bits(a.values));
}

// The optimizer and the clipping see the unscaled gradient: fp16's is fp32's to
// float16's rounding (not 2^16 times it), and so is the norm the step reports.
TEST(LossScale, TheGradientIsUnscaledBeforeClippingAndTheUpdate) {
  const Model model;
  const auto batch = small_image_batch(9, 7, 7);
  TrainerOptions fp16 = towers(2), fp32 = towers(2, Precision::Fp32);
  fp16.clip_grad_norm = fp32.clip_grad_norm = 1e6;  // reports the norm, clips nothing
  Trainer a(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), fp16);
  Trainer b(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), fp32);
  const StepResult ra = a.step(batch), rb = b.step(batch);
  EXPECT_EQ(ra.loss_scale, 65536.0);
  EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-2 * rb.grad_norm);
  const auto g16 = a.gradients().to_host<float>(), g32 = b.gradients().to_host<float>();
  double largest = 0;
  for (float g : g32) largest = std::max(largest, double(std::fabs(g)));
  const double difference = max_difference(g16, g32);
  EXPECT_LE(difference, 1e-2 * largest);
  EXPECT_GT(difference, 0.0) << "control: float16's rounding shows";
}

// The scale and its clean steps are in the training state: a run saved after a
// growth and an overflow and resumed continues bit for bit, scale included (the
// control: the same steps without the restore end elsewhere); a state without them (saved under
// bf16) restores into fp16 at the initial scale, and an fp16 state restores under fp32.
TEST(LossScale, TheScaleIsInTheStateAndAResumedRunContinuesBitForBit) {
  Model model;
  int now = 0;
  model.boost = [&now](const Tower&) { return now == 1 ? 1e30 : 1.0; };
  ScratchDir dir;
  const std::string path = dir.file("state.safetensors");
  const auto optimizer = [] { return Optimizer::by_name("adam", 1e-2); };
  const auto steps = [&now](Trainer& t, int from, int to) {
    for (now = from; now < to; ++now) t.step(small_image_batch(7, 200 + unsigned(now), 7));
  };
  Trainer first(model.vars, model.tower_fn(), optimizer(), towers(2, Precision::Fp16, 3));
  steps(first, 0, 6);  // clean, overflow, then 3 clean (a growth) and 1
  ASSERT_EQ(first.optimizer().steps(), 5);
  ASSERT_EQ(first.loss_scale().scale(), 65536.0);
  ASSERT_EQ(first.loss_scale().clean_steps(), 1);
  first.save_state(path);
  steps(first, 6, 10);  // two clean steps grow the scale again

  Trainer resumed(model.vars, model.tower_fn(), optimizer(), towers(2, Precision::Fp16, 3));
  resumed.restore_state(path);
  EXPECT_EQ(resumed.loss_scale().scale(), 65536.0);
  EXPECT_EQ(resumed.loss_scale().clean_steps(), 1);
  steps(resumed, 6, 10);
  EXPECT_EQ(resumed.loss_scale().scale(), first.loss_scale().scale());
  EXPECT_EQ(resumed.loss_scale().clean_steps(), first.loss_scale().clean_steps());
  EXPECT_EQ(bits(resumed.master().flat_values().to_host<float>()),
            bits(first.master().flat_values().to_host<float>()));
  EXPECT_EQ(bits(resumed.optimizer().slots().at("m").to_host<float>()),
            bits(first.optimizer().slots().at("m").to_host<float>()));

  // The control: the same steps without the restore end elsewhere.
  Trainer fresh(model.vars, model.tower_fn(), optimizer(), towers(2, Precision::Fp16, 3));
  steps(fresh, 6, 10);
  EXPECT_NE(bits(fresh.master().flat_values().to_host<float>()),
            bits(first.master().flat_values().to_host<float>()));

  // A state without a loss scale: saved under bf16, restored under fp16.
  Trainer bf16(model.vars, model.tower_fn(), optimizer(), towers(2, Precision::Bf16));
  steps(bf16, 0, 1);
  bf16.save_state(dir.file("bf16.safetensors"));
  Trainer defaults(model.vars, model.tower_fn(), optimizer(), towers(2, Precision::Fp16, 3));
  steps(defaults, 0, 3);
  ASSERT_NE(defaults.loss_scale().clean_steps(), 0);
  defaults.restore_state(dir.file("bf16.safetensors"));
  EXPECT_EQ(defaults.loss_scale().scale(), LossScale::kInitial);
  EXPECT_EQ(defaults.loss_scale().clean_steps(), 0);

  // An fp16 state under fp32: the master is float32 under both.
  Trainer fp32(model.vars, model.tower_fn(), optimizer(), towers(1, Precision::Fp32));
  fp32.restore_state(path);
  EXPECT_EQ(fp32.loss_scale().scale(), 1.0);
  EXPECT_EQ(fp32.optimizer().steps(), 5);
}

// float16's largest finite value is 65504; a master value of 65520 or more rounds
// to an infinity in the working copy, and the forward's loss is then not finite:
// the numeric guard's NumericError, not an overflow skip (a smaller scale would not
// cure it).
TEST(LossScale, AMasterValueBeyondFloat16sRangeIsTheGuardsError) {
  const Model model;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), towers(2));
  Tensor w = trainer.master().value("conv1/weight");
  std::vector<float> values = w.to_host<float>();
  values[0] = 1e5f;
  copy_tensor(w, Tensor::from_host<float>(values, w.shape(), cpu()), cpu());
  trainer.broadcast();
  EXPECT_THROW_WITH(trainer.step(small_image_batch(8, 1, 7)), NumericError, "the loss is");
  EXPECT_EQ(trainer.loss_scale().scale(), 65536.0) << "not the scale's overflow";
}

TEST(LossScale, Fp16OnTwoGpusTakesTheCpusSteps) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Model model;
  const auto two_steps = [&](std::vector<Device> devices) {
    TrainerOptions o = towers(1);
    o.devices = std::move(devices);
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), o);
    for (unsigned s = 0; s < 2; ++s) trainer.step(small_image_batch(5, 40 + s, 7));
    return trainer.master().flat_values().to_host<float>();
  };
  EXPECT_LE(
      max_difference(two_steps({Device::cuda(0), Device::cuda(1)}), two_steps({Device::cpu()})),
      kFp16Tolerance);
}

}  // namespace
}  // namespace towerlab::testing
