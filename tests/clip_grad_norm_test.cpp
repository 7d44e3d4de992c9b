// Clipping by the global norm (TrainerOptions::clip_grad_norm): the averaged
// gradient scaled by c / (|g| + 1e-6) when its norm exceeds c, PyTorch's
// clip_grad_norm_; the norm computed once per step, the same bits for a master on
// one device and a sharded one, and on every process.
#include <cmath>
#include <cstring>
#include <map>

#include "cnn_model.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

struct Model : CnnModel {
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Var logits = net(tower.context(), tower.input(batch[0], "images"));
      return TowerResult{ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels"))};
    };
  }
};

TrainerOptions options(int towers, double clip,
                       MasterPlacement placement = MasterPlacement::OneDevice) {
  TrainerOptions o;
  o.devices = std::vector<Device>(std::size_t(towers), Device::cpu());
  o.seed = 5;
  o.clip_grad_norm = clip;
  o.master_placement = placement;
  return o;
}

double host_norm(const Tensor& grad) {
  double total = 0.0;
  for (float g : grad.to_host<float>()) total += double(g) * double(g);
  return std::sqrt(total);
}

// Plain SGD at rate 1 moves the values by exactly the (clipped) gradient, so a
// trainer without clipping gives the expectation: v - g * c / (|g| + 1e-6).
TEST(ClipGradNorm, ScalesTheAveragedGradientAsPyTorchDoes) {
  Model model;
  const auto batch = small_image_batch(12, 3, 7);
  Trainer plain(model.vars, model.tower_fn(), Optimizer::sgd({.lr = 1.0}), options(2, 0.0));
  const std::vector<float> start = plain.master().flat_values().to_host<float>();
  const StepResult unclipped = plain.step(batch);
  EXPECT_EQ(unclipped.grad_norm, 0.0) << "no norm reported without clipping";
  const std::vector<float> g = plain.gradients().to_host<float>();
  const double norm = host_norm(plain.gradients());
  ASSERT_GT(norm, 0.1);

  const double limit = norm / 4;
  Trainer clipped(model.vars, model.tower_fn(), Optimizer::sgd({.lr = 1.0}), options(2, limit));
  const StepResult r = clipped.step(batch);
  EXPECT_NEAR(r.grad_norm, norm, 1e-6 * norm);
  const double coefficient = limit / (norm + 1e-6);
  const std::vector<float> values = clipped.master().flat_values().to_host<float>();
  const std::vector<float> clipped_grad = clipped.gradients().to_host<float>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double expected_g = double(g[i]) * coefficient;
    ASSERT_NEAR(clipped_grad[i], expected_g, 1e-6 * std::abs(expected_g) + 1e-9) << "element " << i;
    ASSERT_NEAR(values[i], double(start[i]) - expected_g, 1e-6) << "element " << i;
  }
  EXPECT_NEAR(host_norm(clipped.gradients()), limit, 1e-5 * limit);
}

TEST(ClipGradNorm, ANormUnderTheLimitChangesNoBit) {
  Model model;
  Trainer plain(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options(3, 0.0));
  Trainer loose(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), options(3, 1e6));
  for (unsigned s = 0; s < 3; ++s) {
    const auto batch = small_image_batch(10, 20 + s, 7);
    plain.step(batch);
    const StepResult r = loose.step(batch);
    EXPECT_GT(r.grad_norm, 0.0);
    EXPECT_LT(r.grad_norm, 1e6);
  }
  EXPECT_EQ(bits(loose.master().flat_values().to_host<float>()),
            bits(plain.master().flat_values().to_host<float>()));
}

// The norm is the chunks' sums of squares added in chunk order wherever the chunks
// are, so a sharded master clips to the host master's bits; the control (the same
// comparison without clipping on one side) must see a difference.
TEST(ClipGradNorm, AShardedMasterClipsToTheHostMastersBits) {
  Model model;
  for (int towers : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(towers) + " towers");
    TrainerOptions host = options(towers, 0.05);
    host.master = Device::cpu();
    Trainer one(model.vars, model.tower_fn(), Optimizer::by_name("adamw", 1e-2), host);
    Trainer sharded(model.vars, model.tower_fn(), Optimizer::by_name("adamw", 1e-2),
                    options(towers, 0.05, MasterPlacement::Sharded));
    Trainer control(model.vars, model.tower_fn(), Optimizer::by_name("adamw", 1e-2),
                    options(towers, 0.0, MasterPlacement::Sharded));
    for (unsigned s = 0; s < 3; ++s) {
      const auto batch = small_image_batch(11, 30 + s, 7);
      const StepResult a = one.step(batch);
      const StepResult b = sharded.step(batch);
      control.step(batch);
      EXPECT_GT(a.grad_norm, 0.05)
          << "step " << s << ": the limit must bite for the test to mean anything";
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
    }
    const auto expected = bits(one.master().flat_values().to_host<float>());
    EXPECT_EQ(bits(sharded.master().flat_values().to_host<float>()), expected);
    EXPECT_NE(bits(control.master().flat_values().to_host<float>()), expected);
  }
}

// Two processes (threads, tests/thread_process_group.h) of two towers: every rank
// gets the same norms and values, with the master on the host of each and sharded
// across the four towers (each process's parts of the norm summed across them).
TEST(ClipGradNorm, EveryProcessSeesTheSameNormSharded) {
  Model model;
  std::map<MasterPlacement, std::vector<std::vector<double>>> norms;
  std::map<MasterPlacement, std::vector<std::vector<float>>> values;
  for (MasterPlacement placement : {MasterPlacement::OneDevice, MasterPlacement::Sharded}) {
    norms[placement].resize(2);
    values[placement].resize(2);
    const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
      TrainerOptions o = options(2, 0.05, placement);
      o.process_group = &group;
      Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), o);
      for (unsigned s = 0; s < 3; ++s) {
        norms[placement][std::size_t(rank)].push_back(
            trainer.step(small_image_batch(9, 40 + s, 7)).grad_norm);
      }
      values[placement][std::size_t(rank)] = trainer.master().flat_values().to_host<float>();
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    EXPECT_EQ(norms[placement][0], norms[placement][1]);
    EXPECT_GT(norms[placement][0].front(), 0.05) << "the limit must bite";
    EXPECT_EQ(bits(values[placement][0]), bits(values[placement][1]));
  }
  EXPECT_EQ(norms[MasterPlacement::Sharded][0], norms[MasterPlacement::OneDevice][0]);
  EXPECT_EQ(bits(values[MasterPlacement::Sharded][0]), bits(values[MasterPlacement::OneDevice][0]));
}

TEST(ClipGradNorm, ANegativeOrNonFiniteLimitIsRefused) {
  Model model;
  for (double bad : {-1.0, std::nan(""), double(INFINITY)}) {
    EXPECT_THROW_WITH(
        Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), options(1, bad)),
        InvalidArgument, "Trainer: clip_grad_norm must be a finite number >= 0");
  }
}

}  // namespace
}  // namespace towerlab::testing
