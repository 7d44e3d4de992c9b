// The models of models/ (the MLP, the ResNet and the ViT) and the layers they compose
// (Residual; LayerNorm, TokenLinear, MultiHeadSelfAttention, MeanTokens): forward
// shapes and variable names; a residual block's and a small ViT's gradients against
// central differences in float64; on CPU towers, 3 towers and uneven splits take one
// device's steps (the MLP's and the ViT's dropout keyed by the sample, the ResNet's
// batch norm synchronized), each with a control that must differ; a checkpoint restores on
// another layout with the same predictions; and the same on two GPUs (the emulated
// ones in CI) against one CPU device. ModelsVsTorch.WritesSteps writes the steps
// tests/models_vs_torch_test.py replays in PyTorch.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "gradcheck.h"
#include "models/mlp.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

std::vector<std::string> names_of(const VariableSet& vars) {
  std::vector<std::string> names;
  for (const VariableSpec& spec : vars.specs()) names.push_back(spec.name);
  return names;
}

Shape shape_of(const VariableSet& vars, const std::string& name) {
  return vars.at(name).shape;
}

TEST(Models, MlpShapesAndNames) {
  VariableSet vars;
  const Sequential net = models::mlp(vars);
  EXPECT_EQ(names_of(vars), (std::vector<std::string>{"fc1/weight", "fc1/bias", "fc2/weight",
                                                      "fc2/bias", "fc3/weight", "fc3/bias"}));
  EXPECT_EQ(shape_of(vars, "fc1/weight"), (Shape{512, 784}));
  EXPECT_EQ(shape_of(vars, "fc3/weight"), (Shape{10, 256}));
  EXPECT_EQ(vars.trainable_numel(), 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  EXPECT_EQ(net.describe(),
            "Flatten\nfc1: Linear 784->512 + ReLU\nfc1/dropout: Dropout p 0.2\n"
            "fc2: Linear 512->256 + ReLU\nfc2/dropout: Dropout p 0.2\nfc3: Linear 256->10");
  VariableStore store(vars, cpu());
  store.initialize(1, cpu());
  EXPECT_EQ(infer(net, store, Tensor::zeros({3, 1, 28, 28}, cpu()), cpu()).shape(), (Shape{3, 10}));
  VariableSet no_dropout;
  EXPECT_EQ(models::mlp(no_dropout, {.hidden = {8}, .dropout = 0.0}).size(), 3u);
}

TEST(Models, ResNetShapesAndNames) {
  VariableSet vars;
  const Sequential net = models::resnet(vars);
  // ResNet-20: the stem, 18 convolutions in 9 blocks and 2 projections, each
  // followed by batch norm, and the linear layer.
  std::size_t convs = 0, batch_norms = 0;
  for (const std::string& name : names_of(vars)) {
    convs += name.ends_with("conv/weight") || name.ends_with("conv1/weight") ||
             name.ends_with("conv2/weight");
    batch_norms += name.ends_with("/moving_variance");
  }
  EXPECT_EQ(convs, 21u);
  EXPECT_EQ(batch_norms, 21u);
  EXPECT_EQ(vars.trainable_numel(), 272186);
  EXPECT_EQ(shape_of(vars, "stem/conv/weight"), (Shape{16, 1, 3, 3}));
  EXPECT_EQ(shape_of(vars, "stage1/block3/conv2/weight"), (Shape{16, 16, 3, 3}));
  EXPECT_EQ(shape_of(vars, "stage2/block1/conv1/weight"), (Shape{32, 16, 3, 3}));
  EXPECT_EQ(shape_of(vars, "stage2/block1/shortcut/conv/weight"), (Shape{32, 16, 1, 1}));
  EXPECT_EQ(shape_of(vars, "stage3/block1/shortcut/bn/gamma"), (Shape{64}));
  EXPECT_EQ(shape_of(vars, "fc/weight"), (Shape{10, 64}));
  EXPECT_EQ(vars.find("stage1/block1/shortcut/conv/weight"), nullptr) << "identity shortcut";
  EXPECT_EQ(vars.find("stage2/block2/shortcut/conv/weight"), nullptr) << "identity shortcut";
  EXPECT_EQ(vars.find("stem/conv/bias"), nullptr) << "batch norm follows every convolution";
  EXPECT_EQ(net.size(), 2u + 9u + 2u);
  EXPECT_EQ(net.layer(5).describe(),
            "stage2/block1: Residual + ReLU\n"
            "  body:\n"
            "    stage2/block1/conv1: Conv2d 16->32 3x3 stride 2 pad 1 no bias\n"
            "    stage2/block1/bn1: BatchNorm 32 momentum 0.99 eps 0.001 + ReLU\n"
            "    stage2/block1/conv2: Conv2d 32->32 3x3 stride 1 pad 1 no bias\n"
            "    stage2/block1/bn2: BatchNorm 32 momentum 0.99 eps 0.001\n"
            "  shortcut:\n"
            "    stage2/block1/shortcut/conv: Conv2d 16->32 1x1 stride 2 pad 0 no bias\n"
            "    stage2/block1/shortcut/bn: BatchNorm 32 momentum 0.99 eps 0.001");
  EXPECT_NE(net.layer(3).describe().find("shortcut: identity"), std::string::npos);
  VariableStore store(vars, cpu());
  store.initialize(1, cpu());
  EXPECT_EQ(infer(net, store, Tensor::zeros({2, 1, 28, 28}, cpu()), cpu()).shape(), (Shape{2, 10}));
}

TEST(Models, ResidualErrorsNameTheBlock) {
  VariableSet vars;
  EXPECT_THROW_WITH(Residual("stage1/block1", Sequential()), InvalidArgument,
                    "Residual stage1/block1: the body has no layers");
  EXPECT_THROW_WITH(models::resnet(vars, {.blocks_per_stage = 0}), InvalidArgument,
                    "resnet: channels, width, blocks per stage and classes must be positive");
  // A body that changes the shape needs a projection: ag::add's error says so.
  Sequential body;
  body.add<Conv2d>(vars, "b/conv", 2, 3, 3, Conv2dParams{.pad_h = 1, .pad_w = 1});
  const Residual block("b", std::move(body));
  VariableStore store(vars, cpu());
  store.initialize(1, cpu());
  EXPECT_THROW(infer(block, store, Tensor::zeros({1, 2, 4, 4}, cpu()), cpu()), ShapeError);
}

// A stem, a block with an identity shortcut and one with a projection, global
// pooling and a linear layer, in float64: every variable's gradient, the two paths
// into each block's input summed, against central differences.
TEST(Models, ResidualBlocksGradientsMatchCentralDifferences) {
  VariableSet vars;
  Sequential net;
  net.add<Conv2d>(vars, "stem/conv", 2, 3, 3, Conv2dParams{.pad_h = 1, .pad_w = 1});
  net.add<Residual>(models::basic_block(vars, "block1", 3, 3, 1));
  net.add<Residual>(models::basic_block(vars, "block2", 3, 4, 2));
  net.add<GlobalAvgPool2d>();
  net.add<Linear>(vars, "fc", 4, 3);
  ASSERT_NE(vars.find("block2/shortcut/conv/weight"), nullptr);
  ASSERT_EQ(vars.find("block1/shortcut/conv/weight"), nullptr);
  VariableStore store(vars, cpu(), true, DType::Float64);
  store.initialize(3, cpu());
  const Tensor x = random_double_tensor({4, 2, 5, 5}, 9);
  const Tensor labels = Tensor::from_host<double>({0, 2, 1, 2}, {4}, cpu());
  EXPECT_TRUE(variable_gradients_match(net, store, x, labels));
}

TEST(Models, VitShapesAndNames) {
  VariableSet vars;
  const Sequential net = models::vit(vars);
  const std::vector<std::string> names = names_of(vars);
  ASSERT_EQ(names.size(), 3u + 4u * 16u + 4u);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 19),
            (std::vector<std::string>{
                "patch/weight", "patch/bias", "patch/position", "block1/ln1/gamma",
                "block1/ln1/beta", "block1/attn/q/weight", "block1/attn/q/bias",
                "block1/attn/k/weight", "block1/attn/k/bias", "block1/attn/v/weight",
                "block1/attn/v/bias", "block1/attn/out/weight", "block1/attn/out/bias",
                "block1/ln2/gamma", "block1/ln2/beta", "block1/mlp/fc1/weight",
                "block1/mlp/fc1/bias", "block1/mlp/fc2/weight", "block1/mlp/fc2/bias"}));
  EXPECT_EQ(std::vector<std::string>(names.end() - 4, names.end()),
            (std::vector<std::string>{"ln/gamma", "ln/beta", "head/weight", "head/bias"}));
  EXPECT_EQ(shape_of(vars, "patch/weight"), (Shape{64, 1, 4, 4}));
  EXPECT_EQ(shape_of(vars, "patch/position"), (Shape{49, 64}));
  EXPECT_EQ(shape_of(vars, "block4/mlp/fc1/weight"), (Shape{128, 64}));
  EXPECT_EQ(shape_of(vars, "head/weight"), (Shape{10, 64}));
  const std::int64_t block = 4 * (64 * 64 + 64) + 2 * (64 * 128) + 128 + 64 + 4 * 64;
  EXPECT_EQ(vars.trainable_numel(), 64 * 16 + 64 + 49 * 64 + 4 * block + 2 * 64 + 64 * 10 + 10);
  EXPECT_EQ(vars.state_numel(), 0);
  // The patch embedding and its dropout, two residual branches a block, the head.
  EXPECT_EQ(net.size(), 2u + 2u * 4u + 3u);
  EXPECT_EQ(net.layer(2).describe(),
            "block1/attention: Residual\n"
            "  body:\n"
            "    block1/ln1: LayerNorm 64 eps 1e-05\n"
            "    block1/attn: MultiHeadSelfAttention 64, 4 heads\n"
            "    block1/dropout1: Dropout p 0.1\n"
            "  shortcut: identity");
  EXPECT_EQ(net.layer(3).describe(),
            "block1/mlp: Residual\n"
            "  body:\n"
            "    block1/ln2: LayerNorm 64 eps 1e-05\n"
            "    block1/mlp/fc1: TokenLinear 64->128\n"
            "    GELU\n"
            "    block1/mlp/dropout: Dropout p 0.1\n"
            "    block1/mlp/fc2: TokenLinear 128->64\n"
            "    block1/dropout2: Dropout p 0.1\n"
            "  shortcut: identity");
  VariableStore store(vars, cpu());
  store.initialize(1, cpu());
  EXPECT_EQ(infer(net, store, Tensor::zeros({3, 1, 28, 28}, cpu()), cpu()).shape(), (Shape{3, 10}));
  VariableSet no_dropout;
  EXPECT_EQ(models::vit(no_dropout, {.blocks = 1, .dropout = 0.0}).size(), 1u + 2u + 3u);
}

TEST(Models, VitErrorsNameTheProblem) {
  VariableSet vars;
  EXPECT_THROW_WITH(models::vit(vars, {.patch = 5}), InvalidArgument,
                    "vit: sizes must be positive, the patch must divide the image and the heads "
                    "the width, got image 28, channels 1, patch 5, width 64, heads 4");
  EXPECT_THROW_WITH(MultiHeadSelfAttention(vars, "attn", 10, 4), InvalidArgument,
                    "MultiHeadSelfAttention attn: the width 10 must be a positive multiple of "
                    "the heads 4");
  const MultiHeadSelfAttention attention(vars, "a", 8, 2, 0.1);
  EXPECT_EQ(attention.describe(), "a: MultiHeadSelfAttention 8, 2 heads, attention dropout 0.1");
  const TokenLinear token_linear(vars, "t", 8, 3);
  const Sequential net = models::vit(vars, {.image = 8, .dim = 8, .heads = 2, .blocks = 1});
  VariableStore store(vars, cpu());
  store.initialize(1, cpu());
  EXPECT_THROW_WITH(infer(attention, store, Tensor::zeros({2, 3, 6}, cpu()), cpu()), ShapeError,
                    "MultiHeadSelfAttention a: x");
  EXPECT_THROW_WITH(infer(token_linear, store, Tensor::zeros({2, 5}, cpu()), cpu()), ShapeError,
                    "TokenLinear t: x");
  EXPECT_EQ(infer(token_linear, store, Tensor::zeros({2, 5, 8}, cpu()), cpu()).shape(),
            (Shape{2, 5, 3}));
  EXPECT_THROW_WITH(infer(net, store, Tensor::zeros({2, 1, 12, 12}, cpu()), cpu()), ShapeError,
                    "PatchEmbedding patch: x");
}

// A two-block ViT on 4 tokens in float64, every dropout on: each variable's gradient
// (through attention's heads, both residual branches and the mean over the tokens)
// against central differences, which see the same masks (they are keyed, not drawn).
TEST(Models, VitGradientsMatchCentralDifferences) {
  VariableSet vars;
  const Sequential net = models::vit(vars, {.image = 4,
                                            .in_channels = 2,
                                            .patch = 2,
                                            .dim = 4,
                                            .heads = 2,
                                            .blocks = 2,
                                            .classes = 3,
                                            .dropout = 0.2,
                                            .attention_dropout = 0.3});
  VariableStore store(vars, cpu(), true, DType::Float64);
  store.initialize(3, cpu());
  const Tensor x = random_double_tensor({3, 2, 4, 4}, 9);
  const Tensor labels = Tensor::from_host<double>({0, 2, 1}, {3}, cpu());
  EXPECT_TRUE(variable_gradients_match(net, store, x, labels));
}

// ---- training on towers ----

// Runs a model with the Context of a tower whose slice starts at the batch's first
// sample, whatever its slice: what a tower-local random stream would draw. The
// control of the dropout equivalence.
class AsIfFirstSlice : public Layer {
 public:
  explicit AsIfFirstSlice(const Layer& model) : model_(model) {}
  Var forward(const Context& ctx, const Var& x) const override {
    Context local = ctx;
    local.first_sample = 0;
    return model_(local, x);
  }
  std::string describe() const override { return "AsIfFirstSlice"; }

 private:
  const Layer& model_;
};

// A model of models/ with the cross-entropy loss; the images are
// small_image_batch's [N,1,8,8] with 3 classes.
struct ModelCase {
  std::string name;
  VariableSet vars;
  Sequential net;
  std::unique_ptr<Layer> control;  // set by slice_local_dropout()

  const Layer& model() const {
    if (control) return *control;
    return net;
  }
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Var logits = model()(tower.context(), tower.input(batch[0], "images"));
      return TowerResult{ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels")),
                         {logits}};
    };
  }
  void slice_local_dropout() { control = std::make_unique<AsIfFirstSlice>(net); }
};

std::unique_ptr<ModelCase> small_mlp() {
  auto c = std::make_unique<ModelCase>();
  c->name = "mlp";
  c->net = models::mlp(c->vars, {.inputs = 64, .hidden = {16, 12}, .classes = 3, .dropout = 0.5});
  return c;
}

std::unique_ptr<ModelCase> small_resnet() {
  auto c = std::make_unique<ModelCase>();
  c->name = "resnet";
  c->net = models::resnet(c->vars, {.width = 4, .blocks_per_stage = 1, .classes = 3});
  return c;
}

// 4 tokens of width 8, two heads, two blocks; dropout and attention dropout as given.
std::unique_ptr<ModelCase> small_vit(double dropout = 0.3, double attention_dropout = 0.3) {
  auto c = std::make_unique<ModelCase>();
  c->name = "vit";
  c->net = models::vit(c->vars, {.image = 8,
                                 .patch = 4,
                                 .dim = 8,
                                 .heads = 2,
                                 .blocks = 2,
                                 .classes = 3,
                                 .dropout = dropout,
                                 .attention_dropout = attention_dropout});
  return c;
}

TrainerOptions layout(std::vector<Device> devices, BatchNormMode batchnorm = BatchNormMode::Sync) {
  TrainerOptions o;
  o.devices = std::move(devices);
  o.master = Device::cpu();
  o.batchnorm = batchnorm;
  o.seed = 21;
  return o;
}

std::vector<Device> cpu_towers(int n) {
  return std::vector<Device>(std::size_t(n), Device::cpu());
}

// The losses of `steps` steps and the master's final values.
struct TrainingRun {
  std::vector<double> losses;
  std::vector<float> values;
};

TrainingRun train(Trainer& trainer, std::int64_t batch, int steps) {
  TrainingRun run;
  for (int s = 0; s < steps; ++s) {
    run.losses.push_back(trainer.step(small_image_batch(batch, 30 + unsigned(s), 5)).loss);
  }
  run.values = trainer.master().flat_values().to_host<float>();
  return run;
}

TrainingRun train(const ModelCase& model, const TrainerOptions& options, std::int64_t batch,
                  int steps = 3) {
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("momentum", 0.05), options);
  return train(trainer, batch, steps);
}

::testing::AssertionResult same_steps(const TrainingRun& a, const TrainingRun& b) {
  for (std::size_t s = 0; s < a.losses.size(); ++s) {
    if (std::abs(a.losses[s] - b.losses[s]) > 1e-5 * std::abs(b.losses[s])) {
      return ::testing::AssertionFailure()
             << "step " << s << ": loss " << a.losses[s] << " against " << b.losses[s];
    }
  }
  return all_close(a.values, b.values, 2e-6, 1e-4);
}

// 3 towers on an even (9) and an uneven (8: 3, 3, 2) batch, and 2 towers on 7.
TEST(ModelsOnTowers, MlpWithDropoutTakesOneDevicesSteps) {
  const auto model = small_mlp();
  for (auto [towers, batch] : {std::pair{3, 9}, std::pair{3, 8}, std::pair{2, 7}}) {
    EXPECT_TRUE(same_steps(train(*model, layout(cpu_towers(towers)), batch),
                           train(*model, layout(cpu_towers(1)), batch)))
        << towers << " towers, batch " << batch;
  }
}

TEST(ModelsOnTowers, ControlMlpWithSliceLocalDropoutDiffers) {
  auto model = small_mlp();
  model->slice_local_dropout();
  EXPECT_TRUE(same_steps(train(*model, layout(cpu_towers(1)), 8),
                         train(*model, layout(cpu_towers(1)), 8)));  // deterministic
  EXPECT_FALSE(
      same_steps(train(*model, layout(cpu_towers(3)), 8), train(*model, layout(cpu_towers(1)), 8)));
}

// Both dropouts, and attention dropout alone (its mask is drawn on [N,H,T,T]).
TEST(ModelsOnTowers, VitWithDropoutTakesOneDevicesSteps) {
  for (const auto& model : {small_vit(), small_vit(0.0, 0.5)}) {
    for (auto [towers, batch] : {std::pair{3, 9}, std::pair{3, 8}, std::pair{2, 7}}) {
      EXPECT_TRUE(same_steps(train(*model, layout(cpu_towers(towers)), batch),
                             train(*model, layout(cpu_towers(1)), batch)))
          << towers << " towers, batch " << batch;
    }
  }
}

TEST(ModelsOnTowers, ControlVitWithSliceLocalDropoutDiffers) {
  for (auto [dropout, attention_dropout] : {std::pair{0.3, 0.3}, std::pair{0.0, 0.5}}) {
    const auto model = small_vit(dropout, attention_dropout);
    model->slice_local_dropout();
    EXPECT_TRUE(same_steps(train(*model, layout(cpu_towers(1)), 8),
                           train(*model, layout(cpu_towers(1)), 8)));  // deterministic
    EXPECT_FALSE(same_steps(train(*model, layout(cpu_towers(3)), 8),
                            train(*model, layout(cpu_towers(1)), 8)));
  }
}

// Two processes (threads, tests/thread_process_group.h) of two towers each: 9 samples
// split 3, 2, 2, 2 over the job's four towers, every rank's steps those of one device,
// dropout included; the slice-local control differs there too.
std::vector<TrainingRun> train_on_two_processes(const ModelCase& model, std::int64_t batch) {
  std::vector<TrainingRun> runs(2);
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
    TrainerOptions o = layout(cpu_towers(2));
    o.process_group = &group;
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("momentum", 0.05), o);
    runs[std::size_t(rank)] = train(trainer, batch, 3);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  return runs;
}

TEST(ModelsOnTowers, VitOnTwoProcessesTakesOneDevicesSteps) {
  auto model = small_vit();
  const TrainingRun one = train(*model, layout(cpu_towers(1)), 9);
  for (const TrainingRun& run : train_on_two_processes(*model, 9)) {
    EXPECT_TRUE(same_steps(run, one));
  }
  model->slice_local_dropout();
  EXPECT_FALSE(
      same_steps(train_on_two_processes(*model, 9)[0], train(*model, layout(cpu_towers(1)), 9)));
}

TEST(ModelsOnTowers, ResNetWithSynchronizedBatchNormTakesOneDevicesSteps) {
  const auto model = small_resnet();
  for (auto [towers, batch] : {std::pair{3, 9}, std::pair{3, 8}, std::pair{2, 7}}) {
    EXPECT_TRUE(same_steps(train(*model, layout(cpu_towers(towers)), batch),
                           train(*model, layout(cpu_towers(1)), batch)))
        << towers << " towers, batch " << batch;
  }
}

// The control: each tower normalizing its own slice is not one device's batch norm.
TEST(ModelsOnTowers, ControlResNetWithLocalBatchNormDiffers) {
  const auto model = small_resnet();
  EXPECT_FALSE(same_steps(train(*model, layout(cpu_towers(3), BatchNormMode::Local), 8),
                          train(*model, layout(cpu_towers(1)), 8)));
}

// Trained on `trained_on`, saved, restored into a trainer on `restored_on`: the
// restored master holds the saved bits and predicts what the trained one does.
void expect_restores_on_another_layout(const ModelCase& model, const TrainerOptions& trained_on,
                                       const TrainerOptions& restored_on) {
  Trainer trained(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), trained_on);
  train(trained, 8, 2);
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("towerlab-models-" + model.name + "-" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  save_checkpoint(path, trained.master(), &trained.optimizer());
  Trainer restored(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), restored_on);
  load_checkpoint(path, restored.master(), &restored.optimizer(), cpu());
  restored.broadcast();
  std::filesystem::remove(path);
  EXPECT_EQ(restored.master().flat_values().to_host<float>(),
            trained.master().flat_values().to_host<float>());
  EXPECT_EQ(restored.master().flat_state().to_host<float>(),
            trained.master().flat_state().to_host<float>())
      << "moving statistics";
  const auto test = small_image_batch(7, 99, 5);
  EXPECT_TRUE(all_close(restored.evaluate(test).outputs[0].to_host<float>(),
                        trained.evaluate(test).outputs[0].to_host<float>(), 1e-6, 1e-5))
      << model.name;
}

TEST(ModelsOnTowers, CheckpointFromThreeTowersPredictsTheSameOnTwo) {
  for (const auto& model : {small_mlp(), small_resnet(), small_vit()}) {
    expect_restores_on_another_layout(*model, layout(cpu_towers(3)), layout(cpu_towers(2)));
  }
}

// Two GPUs (TOWERLAB_EMULATED_GPUS=2 on the emulated ones): towers on cuda:0 and
// cuda:1 take one CPU device's steps, dropout and synchronized batch norm
// included, and their checkpoint restores on one CPU tower.
TEST(ModelsOnTowers, TwoGpusTakeOneCpuDevicesStepsAndRestoreOnTheCpu) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const std::vector<Device> gpus = {Device::cuda(0), Device::cuda(1)};
  for (const auto& model : {small_mlp(), small_resnet(), small_vit()}) {
    EXPECT_TRUE(
        same_steps(train(*model, layout(gpus), 7, 2), train(*model, layout(cpu_towers(1)), 7, 2)))
        << model->name;
    expect_restores_on_another_layout(*model, layout(gpus), layout(cpu_towers(1)));
  }
}

// ---- against PyTorch ----

// Writes what tests/models_vs_torch_test.py replays in PyTorch (ctest models_vs_torch):
// for the MLP and the ViT (dropout 0: PyTorch draws other masks) and ResNet-20, the initial
// variables ("initial/<name>"), 20 batches of [B,1,28,28] images and their labels
// ("batch<s>/images", "batch<s>/labels"), the 20 losses of towerlab's steps on two
// CPU towers (synchronized batch norm, SGD lr 0.01 with momentum 0.9) and the final
// variables ("final/<name>"), into $TOWERLAB_MODELS_VS_TORCH_DIR/<model>.safetensors.
// Skipped without that variable: the script is what compares.
TEST(ModelsVsTorch, WritesSteps) {
  const char* dir = std::getenv("TOWERLAB_MODELS_VS_TORCH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "run by tests/models_vs_torch_test.py";
  constexpr int kSteps = 20;
  for (const std::string name : {"mlp", "resnet", "vit"}) {
    VariableSet vars;
    const Sequential net = name == "mlp"      ? models::mlp(vars, {.dropout = 0.0})
                           : name == "resnet" ? models::resnet(vars)
                                              : models::vit(vars, {.dropout = 0.0});
    const std::int64_t batch = name == "mlp" ? 32 : 16;
    TowerFn fn = [&net](const Tower& tower, const std::vector<Tensor>& b) {
      Var logits = net(tower.context(), tower.input(b[0], "images"));
      return TowerResult{ag::softmax_cross_entropy(logits, tower.input(b[1], "labels")), {logits}};
    };
    Trainer trainer(vars, fn, Optimizer::sgd({.lr = 0.01, .momentum = 0.9}), layout(cpu_towers(2)));
    std::vector<std::pair<std::string, Tensor>> out;
    const auto variables = [&](const std::string& prefix) {
      for (const VariableSpec& spec : vars.specs()) {
        const Tensor value = trainer.master().value(spec.name);
        out.emplace_back(prefix + spec.name,
                         Tensor::from_host<float>(value.to_host<float>(), value.shape(), cpu()));
      }
    };
    variables("initial/");
    std::vector<double> losses;
    // Each class a fixed random picture, each image its class's picture plus as much
    // noise: a task the steps make progress on, where random labels would make the
    // run chaotic (float rounding then grows step by step in any framework).
    Tensor pictures = Tensor::empty({10, 28 * 28}, cpu());
    random_normal(pictures, 499, 0, 0.0f, 1.0f, cpu());
    const std::vector<float> picture = pictures.to_host<float>();
    for (int s = 0; s < kSteps; ++s) {
      Tensor noise = Tensor::empty({batch, 28 * 28}, cpu());
      random_normal(noise, 500 + unsigned(s), 0, 0.0f, 1.0f, cpu());
      std::vector<float> pixels = noise.to_host<float>(), labels;
      for (std::int64_t i = 0; i < batch; ++i) {
        const std::int64_t label = (i * 7 + s) % 10;
        labels.push_back(float(label));
        for (std::int64_t p = 0; p < 28 * 28; ++p) {
          pixels[std::size_t(i * 28 * 28 + p)] += picture[std::size_t(label * 28 * 28 + p)];
        }
      }
      const Tensor images = Tensor::from_host<float>(pixels, {batch, 1, 28, 28}, cpu());
      const Tensor label_tensor = Tensor::from_host<float>(labels, {batch}, cpu());
      losses.push_back(trainer.step({images, label_tensor}).loss);
      const std::string prefix = "batch" + std::to_string(s) + "/";
      out.emplace_back(prefix + "images", images);
      out.emplace_back(prefix + "labels", label_tensor);
    }
    out.emplace_back("losses", Tensor::from_host<double>(losses, {kSteps}, cpu()));
    variables("final/");
    for (double loss : losses) EXPECT_TRUE(std::isfinite(loss)) << name;
    save_safetensors(std::string(dir) + "/" + name + ".safetensors", out);
  }
}

}  // namespace
}  // namespace towerlab::testing
