// Inference without a Trainer (infer(), autograd/layers.h): a model trained on two
// CPU towers, saved and loaded into a store made without gradients, predicts what
// Trainer::evaluate predicts; the pass records nothing on its tape; and a store
// without gradients refuses a training pass with a message that says what to do.
#include <gtest/gtest.h>

#include <cstring>

#include "bn_model.h"
#include "file_test_util.h"
#include "test_util.h"
#include "towerlab.h"

namespace towerlab::testing {
namespace {

// A BnModel trained for a few steps on two CPU towers, so that the moving
// statistics and the weights are far from their initial values.
struct Trained {
  BnModel model;
  Trainer trainer;
  std::vector<Tensor> batch = small_image_batch(10, 5, 1);

  Trained() : trainer(model.vars, model.tower_fn(), Optimizer::by_name("adam", 0.05), options()) {
    for (unsigned step = 0; step < 4; ++step) trainer.step(small_image_batch(12, 20 + step, 2));
  }
  static TrainerOptions options() {
    TrainerOptions o;
    o.devices.assign(2, Device::cpu());
    o.seed = 3;
    return o;
  }
};

VariableStore inference_copy(const Trained& t, const ScratchDir& dir) {
  save_checkpoint(dir.file("model.safetensors"), t.trainer.master());
  VariableStore store(t.model.vars, cpu(), /*with_grads=*/false);
  load_checkpoint(dir.file("model.safetensors"), store, nullptr, cpu());
  return store;
}

// Bitwise: each row's logits are the same sums in the same order whichever tower
// computes them and however many rows share the call (inference batch norm is a
// per-channel affine map), and the checkpoint keeps float32 exactly.
TEST(Inference, ReloadedStorePredictsWhatEvaluateDoes) {
  Trained t;
  ScratchDir dir;
  VariableStore store = inference_copy(t, dir);
  EXPECT_FALSE(store.has_grads());

  const Tensor expected = t.trainer.evaluate(t.batch).outputs.at(0);
  const Tensor got = infer(t.model.net, store, t.batch[0], cpu());
  ASSERT_EQ(got.shape(), expected.shape());
  const auto want = expected.to_host<float>(cpu());
  const auto have = got.to_host<float>(cpu());
  EXPECT_EQ(0, std::memcmp(want.data(), have.data(), want.size() * sizeof(float)));

  // Control: the comparison can fail. A store left at its initial values predicts
  // other logits.
  VariableStore fresh(t.model.vars, cpu(), false);
  fresh.initialize(3, cpu());
  const auto other = infer(t.model.net, fresh, t.batch[0], cpu()).to_host<float>(cpu());
  EXPECT_NE(0, std::memcmp(want.data(), other.data(), want.size() * sizeof(float)));
}

TEST(Inference, RecordsNothingAndLeavesMovingStatistics) {
  Trained t;
  ScratchDir dir;
  VariableStore store = inference_copy(t, dir);
  const auto state_before = store.flat_state().to_host<float>(cpu());
  ASSERT_FALSE(state_before.empty());

  // Recording left on: the variables are constants, so no op has a backward.
  Tape tape(cpu(), "inference test");
  ASSERT_TRUE(tape.grad_enabled());
  const Var logits =
      t.model.net(Context{tape, store, /*training=*/false}, tape.constant(t.batch[0], "images"));
  EXPECT_FALSE(logits.requires_grad());
  EXPECT_EQ(tape.num_records(), 0u);
  infer(t.model.net, store, t.batch[0], cpu());
  EXPECT_EQ(store.flat_state().to_host<float>(cpu()), state_before);

  // Control: a training pass on a store with gradients does record.
  VariableStore trainable(t.model.vars, cpu());
  trainable.copy_from(store, cpu());
  Tape training_tape(cpu(), "training test");
  t.model.net(Context{training_tape, trainable, true}, training_tape.constant(t.batch[0]));
  EXPECT_GT(training_tape.num_records(), 0u);
}

TEST(Inference, StoreWithoutGradientsRefusesTraining) {
  BnModel model;
  VariableStore store(model.vars, cpu(), false);
  store.initialize(1, cpu());
  Tape tape(cpu());
  const std::vector<Tensor> batch = small_image_batch(4, 1, 1);
  try {
    model.net(Context{tape, store, /*training=*/true}, tape.constant(batch[0]));
    FAIL() << "a training pass ran on a store without gradients";
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("variable conv1/weight: this store was made without gradients"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("with_grads = true"), std::string::npos) << message;
  }
}

TEST(Inference, MisShapedInputIsAShapeError) {
  BnModel model;
  VariableStore store(model.vars, cpu(), false);
  store.initialize(1, cpu());
  Tensor two_channels = Tensor::zeros({2, 2, 8, 8}, cpu());
  EXPECT_THROW(infer(model.net, store, two_channels, cpu()), ShapeError);
}

}  // namespace
}  // namespace towerlab::testing
