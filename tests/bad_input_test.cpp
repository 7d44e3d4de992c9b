// The bad-input matrix of the reliability issue: every kind of bad input gets a
// typed error whose message says what was wrong and where. The rows tested
// elsewhere, next to the code they exercise:
//   NaN/Inf in the inputs             numeric_guard_test.cpp (the trainer stops or skips)
//   a batch of zero samples           trainer_test.cpp      Trainer.ErrorsAreClear
//   more towers than samples          trainer_test.cpp      (batch 1 on 2-4 towers trains
//                                                            exactly as one tower: not an error)
//   unknown or malformed device names device_test.cpp       Device.RejectsMalformedStrings
//   a master device that is not there trainer_test.cpp      Trainer.ErrorsAreClear
//   a checkpoint of another model     checkpoint_test.cpp, safetensors_test.cpp
//   (CheckpointMismatch) truncated/oversized/garbage checkpoint headers, overflowing header lengths
//   safetensors_test.cpp  MalformedSafetensors.* a missing or truncated data dir dataset_test.cpp,
//   idx_test.cpp
// and, for every parser of outside bytes, the fuzz targets (fuzz/, fuzz_corpus_test.cpp).
// The sample's flags and YAML config values: fashion_mnist_options_test.cpp.
// Here: wrong shapes at every layer, and labels outside the classes through the
// trainer.
#include "models/fashion_net.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

TEST(BadInput, WrongShapesAtEveryLayerNameTheLayerAndBothShapes) {
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  BatchNorm bn(vars, "bn", 3);
  MaxPool2d pool(Pool2dParams::square(2, 2));
  BatchNorm bn_pool(vars, "bn_pool", 3, 0.99, 1e-3, Activation::ReLU, Pool2dParams::square(2, 2));
  Linear fc(vars, "fc", 16, 4);
  VariableStore store(vars, cpu());
  store.initialize(0, cpu());
  Tape tape(cpu());
  const Context ctx{tape, store, true};
  auto input = [&](const Shape& shape) { return tape.constant(Tensor::zeros(shape, cpu()), "x"); };

  EXPECT_THROW_WITH(net(ctx, input({2, 1, 32, 32})), ShapeError,
                    "linear: x batchnorm_relu_max_pool2d float32[2,4096] has 4096 features but "
                    "fc1/weight "
                    "float32[128,3136] expects 3136");
  EXPECT_THROW_WITH(net(ctx, input({2, 3, 28, 28})), ShapeError,
                    "conv2d: input has 3 channels but weight expects 1 (weight conv1/weight "
                    "float32[32,1,3,3], input x float32[2,3,28,28])");
  EXPECT_THROW_WITH(net(ctx, input({2, 28, 28})), ShapeError,
                    "conv2d: input x float32[2,28,28] and weight conv1/weight float32[32,1,3,3] "
                    "must be [N,C,H,W] and [K,C,R,S]");
  EXPECT_THROW_WITH(bn(ctx, input({2, 5, 4, 4})), ShapeError,
                    "batchnorm: bn/gamma float32[3] does not match the channels of x "
                    "float32[2,5,4,4] (expected [N,C] or [N,C,H,W] with C = 3)");
  EXPECT_THROW_WITH(bn(ctx, input({2, 3, 4})), ShapeError,
                    "does not match the channels of x float32[2,3,4]");
  EXPECT_THROW_WITH(pool(ctx, input({2, 4})), ShapeError, "pool2d: x must be [N,C,H,W], got [2,4]");
  EXPECT_THROW_WITH(bn_pool(ctx, input({2, 3, 1, 1})), ShapeError,
                    "batchnorm_max_pool2d: a 2x2 window with stride 2x2 and padding 0x0 does not "
                    "fit in the 1x1 plane of x [2,3,1,1]");
  EXPECT_THROW_WITH(bn_pool(ctx, input({2, 3, 4})), ShapeError,
                    "batchnorm_max_pool2d: bn_pool/gamma float32[3] does not match the channels of "
                    "x float32[2,3,4] (expected [N,C,H,W] with C = 3)");
  EXPECT_THROW_WITH(pool(ctx, input({2, 3, 1, 1})), ShapeError,
                    "pool2d: a 2x2 window with stride 2x2 and padding 0x0 does not fit in the 1x1 "
                    "plane of x [2,3,1,1]");
  EXPECT_THROW_WITH(fc(ctx, input({2, 1, 4, 4})), ShapeError,
                    "linear: input x float32[2,1,4,4] must be [N,features] (flatten it first)");
  EXPECT_THROW_WITH(ag::softmax_cross_entropy(input({4, 10}), input({5})), ShapeError,
                    "softmax_cross_entropy: labels x float32[5] must be [N] for logits x "
                    "float32[4,10]");
  EXPECT_THROW_WITH(ag::mse(input({4, 10}), input({4, 9})), ShapeError,
                    "mse: prediction x float32[4,10] and target x float32[4,9] differ in shape");
}

// Four classes; the label of sample `at` is `label`.
std::vector<Tensor> batch_with_label(float label, std::int64_t at) {
  Tensor images = Tensor::empty({6, 8}, cpu());
  random_normal(images, 3, 0, 0.0f, 1.0f, cpu());
  std::vector<float> labels{0, 1, 2, 3, 0, 1};
  labels[std::size_t(at)] = label;
  return {images, Tensor::from_host<float>(labels, {6}, cpu())};
}

TEST(BadInput, LabelsOutsideTheClassesNameTheTowerTheSamplesAndTheLabel) {
  VariableSet vars;
  Linear fc(vars, "fc", 8, 4);
  TowerFn tower_fn = [&fc](const Tower& tower, const std::vector<Tensor>& batch) {
    Var logits = fc(tower.context(), tower.input(batch[0], "features"));
    return TowerResult{ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels")), {}, {}};
  };
  TrainerOptions options;
  options.devices = {Device::cpu(), Device::cpu()};
  Trainer trainer(vars, tower_fn, Optimizer::by_name("sgd", 0.1), options);
  // Samples 3..5 are tower 1's; sample 4 is its row 1, named as the batch's row 4.
  EXPECT_THROW_WITH(trainer.step(batch_with_label(12, 4)), InvalidArgument,
                    "Trainer: tower 1 on cpu (samples 3 to 5 of the batch): "
                    "softmax_cross_entropy_forward: labels[4] = 12 is not a class id in [0, 4) "
                    "(row 4 of the batch)");
  EXPECT_THROW_WITH(trainer.step(batch_with_label(-1, 0)), InvalidArgument,
                    "Trainer: tower 0 on cpu (samples 0 to 2 of the batch): "
                    "softmax_cross_entropy_forward: labels[0] = -1 is not a class id");
  EXPECT_THROW_WITH(trainer.step(batch_with_label(2.5f, 2)), InvalidArgument,
                    "labels[2] = 2.5 is not a class id");
  EXPECT_EQ(trainer.optimizer().steps(), 0);
  EXPECT_NO_THROW(trainer.step(batch_with_label(3, 4)));  // usable after refused steps
  EXPECT_EQ(trainer.optimizer().steps(), 1);
}

}  // namespace
}  // namespace towerlab::testing
