// regression: seed 001's tower example, a convolutional regression trained with
// the mean squared error on synthetic data. The target of each image is a fixed
// smooth function of it (a blurred copy), so a few convolutions can learn it.
//
//   regression --devices cpu,cpu --depth 3 --filters 16 --steps 200
//
// Exits non-zero unless the loss falls to a tenth of its first value.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>

#include "towerlab.h"

using namespace towerlab;

int main(int argc, char** argv) {
  CLI::App app{"Convolutional regression with MSE on synthetic data (seed 001)"};
  std::string devices = "cpu,cpu";
  int depth = 3, filters = 16, steps = 200;
  std::int64_t batch = 32, size = 16;
  double lr = 3e-3;
  app.add_option("--devices", devices, "Towers, comma-separated")->capture_default_str();
  app.add_option("--depth", depth, "Convolution layers")
      ->capture_default_str()
      ->check(CLI::Range(1, 32));
  app.add_option("--filters", filters, "Filters per hidden layer")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--steps", steps)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch", batch)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--size", size, "Image height and width")
      ->capture_default_str()
      ->check(CLI::Range(4, 256));
  app.add_option("--lr", lr)->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    // depth conv layers of 3x3 "same" convolutions: 1 -> filters -> ... -> 1.
    VariableSet vars;
    Sequential net;
    const Conv2dParams same{.pad_h = 1, .pad_w = 1};
    for (int l = 0; l < depth; ++l) {
      const std::int64_t in = l == 0 ? 1 : filters, out = l == depth - 1 ? 1 : filters;
      net.add<Conv2d>(vars, "conv" + std::to_string(l + 1), in, out, 3, same);
      if (l != depth - 1) net.add<ReLU>();
    }
    TowerFn tower_fn = [&net](const Tower& tower, const std::vector<Tensor>& b) {
      Var prediction = net(tower.context(), tower.input(b[0], "images"));
      return TowerResult{ag::mse(prediction, tower.input(b[1], "targets")), {prediction}, {}};
    };
    TrainerOptions options;
    options.devices = parse_device_list(devices);
    Trainer trainer(vars, tower_fn, Optimizer::adam({}, LearningRate::constant(lr)), options);

    // Targets: a 3x3 box blur of the image, a function a convolution can represent.
    VariableSet blur_vars;
    Conv2d blur(blur_vars, "blur", 1, 1, 3, same, false);
    VariableStore blur_store(blur_vars, default_stream(Device::cpu()));
    fill(blur_store.value("blur/weight"), 1.0 / 9.0, default_stream(Device::cpu()));
    Tape tape(default_stream(Device::cpu()));
    NoGradGuard no_grad(tape);

    double first = 0.0, last = 0.0;
    for (int step = 0; step < steps; ++step) {
      Tensor images = Tensor::empty({batch, 1, size, size}, Device::cpu());
      random_uniform(images, 7, std::uint64_t(step), -1.0f, 1.0f, default_stream(Device::cpu()));
      Tensor targets = blur(Context{tape, blur_store, false}, tape.constant(images)).value();
      last = trainer.step({images, targets}).loss;
      if (step == 0) first = last;
      if (step % 50 == 0 || step == steps - 1) std::printf("step %4d  mse %.6f\n", step, last);
    }
    const bool learned = std::isfinite(last) && last < 0.1 * first;
    std::printf("%s: mse %.6f -> %.6f over %d steps on %zu tower(s)\n", learned ? "ok" : "FAILED",
                first, last, steps, trainer.num_towers());
    return learned ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "regression: %s\n", e.what());
    return 2;
  }
}
