// Layers on the tape: a small CNN's gradients match central differences, a few
// steps of training on a fixed batch reduce the loss, batch norm switches between
// batch and moving statistics, and shape errors name the layer's variables.
#include <cmath>

#include "gradcheck.h"
#include "models/fashion_net.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

Tensor labels_tensor(const std::vector<double>& ids, DType dtype) {
  if (dtype == DType::Float64)
    return Tensor::from_host<double>(ids, {std::int64_t(ids.size())}, cpu());
  std::vector<float> f(ids.begin(), ids.end());
  return Tensor::from_host<float>(f, {std::int64_t(ids.size())}, cpu());
}

TEST(Layers, SmallCnnGradientsMatchCentralDifferences) {
  VariableSet vars;
  Sequential net;
  net.add<Conv2d>(vars, "conv", 2, 3, 3, Conv2dParams{.pad_h = 1, .pad_w = 1});
  net.add<BatchNorm>(vars, "bn", 3);
  net.add<ReLU>();
  net.add<MaxPool2d>(Pool2dParams::square(2, 2));
  net.add<Flatten>();
  net.add<Linear>(vars, "fc", 3 * 3 * 3, 4);
  VariableStore store(vars, cpu(), true, DType::Float64);
  store.initialize(5, cpu());
  Tensor x = random_double_tensor({5, 2, 6, 6}, 6);
  Tensor labels = labels_tensor({0, 3, 1, 2, 3}, DType::Float64);

  EXPECT_TRUE(variable_gradients_match(net, store, x, labels, /*l2=*/0.01));
  // The conv bias sits before batch norm, which cancels it: its gradient is ~0.
  for (double g : store.grad("conv/bias").to_host<double>()) EXPECT_NEAR(g, 0.0, 1e-9);
}

TEST(Layers, TrainingOnAFixedBatchReducesTheLoss) {
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  VariableStore store(vars, cpu());
  store.initialize(1, cpu());
  Optimizer adam = Optimizer::adam({}, LearningRate::constant(1e-3));
  Tensor images = Tensor::empty({16, 1, 28, 28}, cpu());
  random_normal(images, 2, 0, 0.0f, 1.0f, cpu());
  std::vector<double> ids;
  for (int i = 0; i < 16; ++i) ids.push_back(i % 10);
  Tensor labels = labels_tensor(ids, DType::Float32);

  std::vector<float> losses;
  for (int step = 0; step < 15; ++step) {
    Tape tape(cpu());
    Context ctx{tape, store, true};
    Var loss = ag::softmax_cross_entropy(net(ctx, tape.constant(images)), tape.constant(labels));
    losses.push_back(loss.value().to_host<float>()[0]);
    store.zero_grad(cpu());
    tape.backward(loss);
    adam.step(store, store.flat_grads(), cpu());
  }
  EXPECT_GT(losses.front(), 1.5f);  // about ln(10) at the start
  EXPECT_LT(losses.back(), 0.3f * losses.front())
      << "first " << losses.front() << ", last " << losses.back();
  EXPECT_EQ(adam.steps(), 15);
}

TEST(Layers, BatchNormUsesBatchStatisticsOnlyWhenTraining) {
  VariableSet vars;
  BatchNorm bn(vars, "bn", 2, 0.5);
  VariableStore store(vars, cpu());
  store.initialize(0, cpu());
  // Channel 0 holds 1, 3; channel 1 holds 10, 30 (N = 2, C = 2).
  Tensor x = Tensor::from_host<float>({1, 10, 3, 30}, {2, 2}, cpu());
  Tape tape(cpu());
  Var y = bn(Context{tape, store, true}, tape.constant(x));
  EXPECT_TRUE(all_close(y.value().to_host<float>(), {-1, -1, 1, 1}, 1e-3, 1e-3));
  // Moving statistics: 0.5 * old + 0.5 * batch (unbiased variance: 2 and 200).
  EXPECT_TRUE(all_close(store.value("bn/moving_mean").to_host<float>(), {1.0f, 10.0f}));
  EXPECT_TRUE(all_close(store.value("bn/moving_variance").to_host<float>(), {1.5f, 100.5f}));
  Var z = bn(Context{tape, store, false}, tape.constant(x));
  const auto inf = z.value().to_host<float>();
  EXPECT_NEAR(inf[0], (1 - 1.0) / std::sqrt(1.5 + 1e-3), 1e-4);
  EXPECT_NEAR(inf[3], (30 - 10.0) / std::sqrt(100.5 + 1e-3), 1e-4);
}

TEST(Layers, ShapeErrorsNameTheVariables) {
  VariableSet vars;
  Linear fc(vars, "fc1", 784, 128);
  Conv2d conv(vars, "conv1", 1, 32, 3);
  VariableStore store(vars, cpu());
  store.initialize(0, cpu());
  Tape tape(cpu());
  Context ctx{tape, store, true};
  EXPECT_THROW_WITH(fc(ctx, tape.constant(Tensor::zeros({8, 3136}, cpu()), "flatten")), ShapeError,
                    "linear: x flatten float32[8,3136] has 3136 features but fc1/weight "
                    "float32[128,784] expects 784");
  EXPECT_THROW_WITH(
      conv(ctx, tape.constant(Tensor::zeros({8, 3, 28, 28}, cpu()), "images")), ShapeError,
      "conv2d: input has 3 channels but weight expects 1 (weight conv1/weight float32[32,1,3,3]");
  EXPECT_THROW_WITH(
      Linear(vars, "fc1", 100, 128), ShapeError,
      "variable fc1/weight exists with shape [128,784] but is asked for with shape [128,100]");
}

TEST(Layers, FashionNetShapesAndSummary) {
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  EXPECT_EQ(vars.trainable_numel(),
            32 * 9 + 2 * 32 + 64 * 32 * 9 + 2 * 64 + 3136 * 128 + 128 + 1280 + 10);
  EXPECT_EQ(vars.state_numel(), 2 * 32 + 2 * 64);
  VariableStore store(vars, cpu());
  store.initialize(3, cpu());
  Tape tape(cpu());
  NoGradGuard no_grad(tape);
  Var logits =
      net(Context{tape, store, false}, tape.constant(Tensor::zeros({3, 1, 28, 28}, cpu())));
  EXPECT_EQ(logits.shape(), (Shape{3, 10}));
  EXPECT_NE(net.describe().find("fc1: Linear 3136->128"), std::string::npos);
}

// A residual-free ResNet head: conv, an activation layer of each kind, a global
// average pool and a linear layer; gradients against central differences in float64.
TEST(Layers, ActivationLayersAndGlobalPoolGradients) {
  const std::vector<ActivationOp> acts = {
      ActivationOp::sigmoid(), ActivationOp::tanh(),
      ActivationOp::gelu(),    ActivationOp::gelu(GeluApproximate::Tanh),
      ActivationOp::silu(),    ActivationOp::leaky_relu(0.2)};
  for (const ActivationOp& act : acts) {
    VariableSet vars;
    Sequential net;
    net.add<Conv2d>(vars, "conv", 2, 3, 3, Conv2dParams{.pad_h = 1, .pad_w = 1});
    net.add<ActivationLayer>(act);
    net.add<GlobalAvgPool2d>();
    net.add<Linear>(vars, "fc", 3, 4);
    VariableStore store(vars, cpu(), true, DType::Float64);
    store.initialize(7, cpu());
    Tensor x = random_double_tensor({3, 2, 5, 4}, 8);
    Tensor labels = labels_tensor({0, 3, 1}, DType::Float64);
    EXPECT_TRUE(variable_gradients_match(net, store, x, labels)) << net.layer(1).describe();
    Tape tape(cpu());
    EXPECT_EQ(net(Context{tape, store, false}, tape.constant(x)).shape(), (Shape{3, 4}));
  }
}

TEST(Layers, GlobalAvgPoolIsEachPlanesMean) {
  Tape tape(cpu());
  // [1,2,2,3]: planes {1..6} and {-6..-1}.
  Var x = tape.constant(
      Tensor::from_host<float>({1, 2, 3, 4, 5, 6, -6, -5, -4, -3, -2, -1}, {1, 2, 2, 3}, cpu()));
  Var y = ag::global_avg_pool2d(x);
  EXPECT_EQ(y.shape(), (Shape{1, 2}));
  EXPECT_EQ(y.value().to_host<float>(), (std::vector<float>{3.5f, -3.5f}));
  EXPECT_THROW_WITH(ag::global_avg_pool2d(tape.constant(Tensor::zeros({2, 3}, cpu()))), ShapeError,
                    "global_avg_pool2d: x");
}

TEST(Layers, ActivationLayersDescribeThemselves) {
  EXPECT_EQ(ActivationLayer(ActivationOp::gelu(GeluApproximate::Tanh)).describe(), "GELU (tanh)");
  EXPECT_EQ(ActivationLayer(ActivationOp::leaky_relu(0.1)).describe(), "LeakyReLU 0.1");
  EXPECT_EQ(ActivationLayer(ActivationOp::silu()).describe(), "SiLU");
  EXPECT_EQ(GlobalAvgPool2d().describe(), "GlobalAvgPool2d");
}

}  // namespace
}  // namespace towerlab::testing
