// Checkpoints of a model: bit-exact round trips with optimizer state, training
// resumed from a checkpoint continues exactly as if it had not stopped, and files
// for another model are rejected with everything that differs listed.
#include <algorithm>
#include <filesystem>

#include "test_util.h"

namespace towerlab::testing {
namespace {

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

TEST_F(CheckpointTest, MissingFilesAndUnknownVersionsAreIoErrors) {
  Model m;
  VariableStore a(m.vars, cpu());
  EXPECT_THROW(load_checkpoint(path("absent.safetensors"), a, nullptr, cpu()), IoError);
  save_safetensors(path("v2.safetensors"), {{"x", Tensor::zeros({2}, cpu())}},
                   {{"format", "towerlab-checkpoint-2"}, {"step", "1"}});
  EXPECT_THROW_WITH(load_checkpoint(path("v2.safetensors"), a, nullptr, cpu()), IoError,
                    "has format 'towerlab-checkpoint-2', which this towerlab does not read");
}

// The model's variables by name, as a plain safetensors file (no metadata).
void save_plain(const std::string& file, const VariableStore& store,
                const std::vector<std::string>& skip = {},
                std::vector<std::pair<std::string, Tensor>> extra = {},
                const std::map<std::string, std::string>& metadata = {}) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const VariableSpec& v : store.set().specs()) {
    if (std::find(skip.begin(), skip.end(), v.name) == skip.end())
      tensors.emplace_back(v.name, store.value(v.name));
  }
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  save_safetensors(file, tensors, metadata);
}

TEST_F(CheckpointTest, PlainWeightsLoadAndTheOptimizerStartsFresh) {
  Model m;
  VariableStore a(m.vars, cpu());
  a.initialize(3, cpu());
  Optimizer adam_a = Optimizer::adam({}, LearningRate::constant(1e-2));
  m.train(a, adam_a, 2);
  // PyTorch's safetensors writer marks its files {"format": "pt"}: still plain weights.
  save_plain(path("plain.safetensors"), a, {}, {}, {{"format", "pt"}});

  VariableStore b(m.vars, cpu());
  b.initialize(999, cpu());
  Optimizer adam_b = Optimizer::adam({}, LearningRate::constant(1e-2));
  m.train(b, adam_b, 1);  // some state that the load must clear
  const CheckpointInfo info = load_checkpoint(path("plain.safetensors"), b, &adam_b, cpu());
  EXPECT_TRUE(info.plain_weights);
  EXPECT_EQ(info.step, 0);
  EXPECT_EQ(info.optimizer_state, CheckpointInfo::OptimizerState::Fresh);
  EXPECT_EQ(adam_b.steps(), 0);
  EXPECT_TRUE(adam_b.slots().empty());
  EXPECT_EQ(a.flat_values().to_host<float>(), b.flat_values().to_host<float>());
  EXPECT_EQ(a.flat_state().to_host<float>(), b.flat_state().to_host<float>());
  EXPECT_EQ(info.summary("plain.safetensors"),
            "plain weights plain.safetensors (no step, no optimizer state); the optimizer "
            "starts fresh");

  // A checkpoint's optimizer state, by contrast, is restored.
  save_checkpoint(path("full.safetensors"), a, &adam_a);
  const CheckpointInfo full = load_checkpoint(path("full.safetensors"), b, &adam_b, cpu());
  EXPECT_FALSE(full.plain_weights);
  EXPECT_EQ(full.optimizer_state, CheckpointInfo::OptimizerState::Restored);
  EXPECT_EQ(adam_b.steps(), 2);
  EXPECT_EQ(full.summary("full.safetensors"), "checkpoint full.safetensors (adam, step 2)");
}

TEST_F(CheckpointTest, PartialLoadKeepsWhatIsMissingAndNamesWhatIsUnused) {
  Model m;
  VariableStore a(m.vars, cpu());
  a.initialize(5, cpu());
  const Tensor extra = Tensor::zeros({3}, cpu());
  save_plain(path("part.safetensors"), a, {"fc/bias"}, {{"head/weight", extra}});

  VariableStore b(m.vars, cpu());
  fill(b.flat_values(), 7.0, cpu());
  fill(b.flat_state(), 7.0, cpu());
  // Exact refuses it, naming both problems and saying how the file was read.
  try {
    load_checkpoint(path("part.safetensors"), b, nullptr, cpu());
    ADD_FAILURE() << "expected CheckpointMismatch";
  } catch (const CheckpointMismatch& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("missing fc/bias [3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected head/weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("read as plain weights"), std::string::npos) << msg;
  }
  for (float v : b.flat_values().to_host<float>()) ASSERT_EQ(v, 7.0f);

  Optimizer sgd = Optimizer::sgd({.momentum = 0.9}, LearningRate::constant(0.1));
  const CheckpointInfo info =
      load_checkpoint(path("part.safetensors"), b, &sgd, cpu(), CheckpointMatch::Partial);
  EXPECT_EQ(info.missing, std::vector<std::string>{"fc/bias"});
  EXPECT_EQ(info.unused, std::vector<std::string>{"head/weight"});
  EXPECT_EQ(info.optimizer_state, CheckpointInfo::OptimizerState::Fresh);
  for (const VariableSpec& v : m.vars.specs()) {
    const auto got = b.value(v.name).to_host<float>();
    if (v.name == "fc/bias") {
      EXPECT_EQ(got, std::vector<float>(3, 7.0f)) << "a missing variable keeps its value";
    } else {
      EXPECT_EQ(got, a.value(v.name).to_host<float>()) << v.name;
    }
  }
  EXPECT_EQ(info.summary("part.safetensors"),
            "plain weights part.safetensors (no step, no optimizer state); the optimizer starts "
            "fresh; not in the file, kept: fc/bias; unused in the file: head/weight");
}

TEST_F(CheckpointTest, PartialLoadStillRefusesAWrongShapeNamingBoth) {
  Model m;
  VariableStore a(m.vars, cpu());
  a.initialize(5, cpu());
  save_plain(path("bad.safetensors"), a, {"fc/weight"},
             {{"fc/weight", Tensor::zeros({3, 65}, cpu())}});
  VariableStore b(m.vars, cpu());
  fill(b.flat_values(), 7.0, cpu());
  EXPECT_THROW_WITH(
      load_checkpoint(path("bad.safetensors"), b, nullptr, cpu(), CheckpointMatch::Partial),
      CheckpointMismatch, "mis-shaped fc/weight: file [3,65], model [3,64]");
  for (float v : b.flat_values().to_host<float>()) ASSERT_EQ(v, 7.0f);
}

TEST_F(CheckpointTest, PartialLoadWithoutEveryOptimizerSlotStartsTheOptimizerFresh) {
  Model m;
  VariableStore a(m.vars, cpu());
  a.initialize(2, cpu());
  Optimizer adam = Optimizer::adam({}, LearningRate::constant(1e-3));
  m.train(a, adam, 2);
  save_checkpoint(path("full.safetensors"), a, &adam);
  // The same checkpoint without one slot entry.
  SafetensorsFile file = load_safetensors(path("full.safetensors"), Device::cpu());
  std::vector<std::pair<std::string, Tensor>> kept;
  for (const auto& [name, t] : file.tensors) {
    if (name != "optimizer/v/fc/bias") kept.emplace_back(name, t);
  }
  save_safetensors(path("gap.safetensors"), kept, file.metadata);

  Optimizer fresh = Optimizer::adam({}, LearningRate::constant(1e-3));
  EXPECT_THROW_WITH(load_checkpoint(path("gap.safetensors"), a, &fresh, cpu()), CheckpointMismatch,
                    "missing optimizer/v/fc/bias [3]");
  const CheckpointInfo info =
      load_checkpoint(path("gap.safetensors"), a, &fresh, cpu(), CheckpointMatch::Partial);
  EXPECT_EQ(info.optimizer_state, CheckpointInfo::OptimizerState::Fresh);
  EXPECT_TRUE(info.missing.empty());
  EXPECT_EQ(fresh.steps(), 0);
}

// Plain SGD keeps no slots, so its checkpoints have none; the step count (which
// drives the learning-rate schedule) still comes back.
TEST_F(CheckpointTest, AnOptimizerWithoutSlotsGetsItsStepBack) {
  Model m;
  VariableStore a(m.vars, cpu());
  a.initialize(2, cpu());
  Optimizer sgd = Optimizer::sgd({}, LearningRate::cosine(0.1, 10));
  m.train(a, sgd, 3);
  save_checkpoint(path("sgd.safetensors"), a, &sgd);
  Optimizer resumed = Optimizer::sgd({}, LearningRate::cosine(0.1, 10));
  const CheckpointInfo info = load_checkpoint(path("sgd.safetensors"), a, &resumed, cpu());
  EXPECT_EQ(info.optimizer_state, CheckpointInfo::OptimizerState::Restored);
  EXPECT_EQ(resumed.steps(), 3);
  EXPECT_EQ(resumed.current_lr(), sgd.current_lr());
}

}  // namespace
}  // namespace towerlab::testing
