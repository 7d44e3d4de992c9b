// Checkpoints of a model: bit-exact round trips with optimizer state, training
// resumed from a checkpoint continues exactly as if it had not stopped, and files
// for another model are rejected with everything that differs listed.
#include <filesystem>

#include "test_util.h"

namespace towerlab::testing {
namespace {

const Stream& cpu() {
  return default_stream(Device::cpu());
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("towerlab-ckpt-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A small model and a fixed batch; train() runs `steps` Adam steps.
  struct Model {
    VariableSet vars;
    Sequential net;
    Tensor images, labels;
    Model() {
      net.add<Conv2d>(vars, "conv1", 1, 4, 3, Conv2dParams{.pad_h = 1, .pad_w = 1}, false);
      net.add<BatchNorm>(vars, "bn1", 4);
      net.add<ReLU>();
      net.add<MaxPool2d>(Pool2dParams::square(2, 2));
      net.add<Flatten>();
      net.add<Linear>(vars, "fc", 4 * 4 * 4, 3);
      images = Tensor::empty({6, 1, 8, 8}, cpu());
      random_normal(images, 9, 0, 0.0f, 1.0f, cpu());
      labels = Tensor::from_host<float>({0, 1, 2, 0, 1, 2}, {6}, cpu());
    }
    void train(VariableStore& store, Optimizer& opt, int steps) {
      for (int i = 0; i < steps; ++i) {
        Tape tape(cpu());
        Context ctx{tape, store, true};
        Var loss =
            ag::softmax_cross_entropy(net(ctx, tape.constant(images)), tape.constant(labels));
        store.zero_grad(cpu());
        tape.backward(loss);
        opt.step(store, store.flat_grads(), cpu());
      }
    }
  };

  std::filesystem::path dir_;
};

TEST_F(CheckpointTest, ResumedTrainingContinuesExactly) {
  Model m;
  VariableStore a(m.vars, cpu());
  a.initialize(1, cpu());
  Optimizer opt_a = Optimizer::adam({}, LearningRate::cosine(1e-2, 10));
  m.train(a, opt_a, 3);
  save_checkpoint(path("step3.safetensors"), a, &opt_a, {{"epoch", "0"}});
  m.train(a, opt_a, 2);

  VariableStore b(m.vars, cpu());
  b.initialize(999, cpu());  // overwritten by the load
  Optimizer opt_b = Optimizer::adam({}, LearningRate::cosine(1e-2, 10));
  const CheckpointInfo info = load_checkpoint(path("step3.safetensors"), b, &opt_b, cpu());
  EXPECT_EQ(info.step, 3);
  EXPECT_EQ(info.optimizer, "adam");
  EXPECT_EQ(info.metadata.at("epoch"), "0");
  EXPECT_EQ(opt_b.steps(), 3);
  m.train(b, opt_b, 2);

  EXPECT_EQ(a.flat_values().to_host<float>(), b.flat_values().to_host<float>());
  EXPECT_EQ(a.flat_state().to_host<float>(), b.flat_state().to_host<float>());  // moving stats
  EXPECT_EQ(opt_a.slots().at("v").to_host<float>(), opt_b.slots().at("v").to_host<float>());
}

TEST_F(CheckpointTest, RoundTripIsBitExactAndWeightsOnlyLoadsAnywhere) {
  Model m;
  VariableStore a(m.vars, cpu());
  a.initialize(4, cpu());
  Optimizer sgd = Optimizer::sgd({.momentum = 0.9}, LearningRate::constant(0.1));
  m.train(a, sgd, 2);
  save_checkpoint(path("m.safetensors"), a, &sgd);
  VariableStore b(m.vars, cpu());
  const CheckpointInfo info = load_checkpoint(path("m.safetensors"), b, nullptr, cpu());
  EXPECT_EQ(info.step, 2);
  EXPECT_EQ(a.flat_values().to_host<float>(), b.flat_values().to_host<float>());
  for (int i = 0; i < cuda_device_count(); ++i) {
    Stream gpu(Device::cuda(i));
    VariableStore g(m.vars, gpu);
    load_checkpoint(path("m.safetensors"), g, nullptr, gpu);
    EXPECT_EQ(g.flat_values().to_host<float>(gpu), a.flat_values().to_host<float>());
  }
}

TEST_F(CheckpointTest, AnotherModelIsRejectedWithEverythingThatDiffers) {
  Model m;
  VariableStore a(m.vars, cpu());
  a.initialize(2, cpu());
  save_checkpoint(path("m.safetensors"), a);

  VariableSet other;
  other.get("conv1/weight", {8, 1, 3, 3}, Initializer::zeros());
  other.get("fc/weight", {3, 64}, Initializer::zeros());
  other.get("fc2/bias", {3}, Initializer::zeros());
  VariableStore b(other, cpu());
  fill(b.flat_values(), 7.0, cpu());
  try {
    load_checkpoint(path("m.safetensors"), b, nullptr, cpu());
    ADD_FAILURE() << "expected CheckpointMismatch";
  } catch (const CheckpointMismatch& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("missing fc2/bias [3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected bn1/gamma"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mis-shaped conv1/weight: file [4,1,3,3], model [8,1,3,3]"),
              std::string::npos)
        << msg;
  }
  // Nothing was changed by the refused load.
  for (float v : b.flat_values().to_host<float>()) ASSERT_EQ(v, 7.0f);
}

TEST_F(CheckpointTest, OptimizerKindMustMatch) {
  Model m;
  VariableStore a(m.vars, cpu());
  a.initialize(2, cpu());
  Optimizer adam = Optimizer::adam({}, LearningRate::constant(1e-3));
  m.train(a, adam, 1);
  save_checkpoint(path("adam.safetensors"), a, &adam);
  Optimizer sgd = Optimizer::sgd({}, LearningRate::constant(0.1));
  EXPECT_THROW_WITH(load_checkpoint(path("adam.safetensors"), a, &sgd, cpu()), InvalidArgument,
                    "holds the state of a adam optimizer, not of sgd");
}

TEST_F(CheckpointTest, MissingAndForeignFilesAreIoErrors) {
  Model m;
  VariableStore a(m.vars, cpu());
  EXPECT_THROW(load_checkpoint(path("absent.safetensors"), a, nullptr, cpu()), IoError);
  save_safetensors(path("foreign.safetensors"), {{"x", Tensor::zeros({2}, cpu())}});
  EXPECT_THROW_WITH(load_checkpoint(path("foreign.safetensors"), a, nullptr, cpu()), IoError,
                    "is not a towerlab checkpoint");
}

}  // namespace
}  // namespace towerlab::testing
