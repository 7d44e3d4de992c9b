// towerlab embedded in a program of its own: define a small CNN, train it on two
// CPU towers on synthetic images, save it, load it into an inference store (no
// gradients), predict, and catch a typed error. It checks itself: the exit code is
// non-zero unless accuracy is well above chance and the reloaded model predicts
// exactly what the trainer does.
#include <towerlab/towerlab.h>

#include <algorithm>
#include <cstdio>
#include <random>

using namespace towerlab;

constexpr std::int64_t kClasses = 4;

// n images [n,1,8,8]: noise plus a bright quadrant, whose index is the label [n].
std::vector<Tensor> synthetic_batch(std::int64_t n, std::mt19937& rng, const Stream& cpu) {
  std::normal_distribution<float> noise(0.0f, 0.5f);
  std::vector<float> images(std::size_t(n * 64)), labels;
  for (std::int64_t i = 0; i < n; ++i) {
    const int label = int(rng() % kClasses);
    labels.push_back(float(label));
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 8; ++x)
        images[std::size_t(i * 64 + y * 8 + x)] =
            noise(rng) + ((y / 4) * 2 + x / 4 == label ? 1.0f : 0.0f);
  }
  return {Tensor::from_host<float>(images, {n, 1, 8, 8}, cpu),
          Tensor::from_host<float>(labels, {n}, cpu)};
}

int main() {
  const Stream& cpu = default_stream(Device::cpu());
  VariableSet vars;  // the model: conv, batch norm + ReLU + max pool, a residual block, linear
  Sequential net;
  net.add<Conv2d>(vars, "conv1", 1, 8, 3, Conv2dParams{.pad_h = 1, .pad_w = 1}, false);
  net.add<BatchNorm>(vars, "bn1", 8, 0.9, 1e-3, Activation::ReLU, Pool2dParams::square(2, 2));
  Sequential body;  // a residual block: ReLU(x + conv2(ReLU(conv1(x))))
  body.add<Conv2d>(vars, "block/conv1", 8, 8, 3, Conv2dParams{.pad_h = 1, .pad_w = 1});
  body.add<ReLU>();
  body.add<Conv2d>(vars, "block/conv2", 8, 8, 3, Conv2dParams{.pad_h = 1, .pad_w = 1});
  net.add<Residual>("block", std::move(body));
  net.add<Flatten>();
  net.add<Linear>(vars, "fc", 8 * 4 * 4, kClasses);

  TrainerOptions options;
  options.devices = {Device::cpu(), Device::cpu()};  // two towers, half a batch each
  options.seed = 1;
  TowerFn tower_fn = [&net](const Tower& tower, const std::vector<Tensor>& batch) {
    Var logits = net(tower.context(), tower.input(batch[0], "images"));
    return TowerResult{ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels")),
                       {logits}};
  };
  Trainer trainer(vars, tower_fn, Optimizer::by_name("adam", 0.01), options);
  std::mt19937 rng(7);
  for (int step = 0; step < 100; ++step) trainer.step(synthetic_batch(32, rng, cpu));
  std::printf("embed: towerlab %s, trained 100 steps on 2 towers, loss %.3f\n", TOWERLAB_VERSION,
              trainer.loss());
  save_checkpoint("embed_model.safetensors", trainer.master());

  // Inference without the trainer: a store without gradients, filled from the file.
  VariableStore store(vars, cpu, /*with_grads=*/false);
  load_checkpoint("embed_model.safetensors", store, nullptr, cpu);
  const std::vector<Tensor> test = synthetic_batch(200, rng, cpu);
  const std::vector<float> logits = infer(net, store, test[0], cpu).to_host<float>(cpu);
  const std::vector<float> labels = test[1].to_host<float>(cpu);
  int correct = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const float* row = &logits[i * kClasses];
    correct += std::max_element(row, row + kClasses) - row == std::ptrdiff_t(labels[i]);
  }
  const double accuracy = double(correct) / double(labels.size());
  const bool same = trainer.evaluate(test).outputs.at(0).to_host<float>(cpu) == logits;
  std::printf("embed: accuracy %.3f on 200 synthetic images (chance %.2f); reloaded %s\n", accuracy,
              1.0 / kClasses, same ? "predicts the same" : "DIFFERS");

  try {  // a typed error: three channels where conv1 expects one
    infer(net, store, Tensor::zeros({1, 3, 8, 8}, cpu), cpu);
    std::printf("embed: a mis-shaped input was accepted\n");
    return 1;
  } catch (const ShapeError& e) {
    std::printf("embed: caught ShapeError: %s\n", e.what());
  }
  return accuracy > 0.8 && same ? 0 : 1;
}
