// What each fusion of FashionNet's layers is worth in a whole training step: the
// Trainer's step on one CPU tower (the fashion_mnist sample's `--devices cpu`),
// images/s, for FashionNet with no fusion, with each fusion alone, and with all of
// them (models/fashion_net.cpp's fashion_net):
//   bn_relu      batch norm + ReLU in one op (kernels/batchnorm.h)
//   bias_relu    fc1's bias add + ReLU in one op (kernels/bias.h)
//   pool_argmax  max pooling through a recorded argmax (kernels/pool2d.h)
//   bn_pool      the max pool inside batch norm's kernels (kernels/batchnorm.h),
//                its gradient rebuilt plane by plane, never stored
//   loss_probs   the cross-entropy backward from the forward's probabilities
//                (kernels/loss.h)
//
//   fusion_step_bench [--rounds R] [--steps S] [--batch B]
//
// Method: R rounds; in each, every variant runs S steps (after one warm-up step)
// in turn, so that the machine's drift over time falls on all variants alike.
// Reported: each variant's median over the rounds, and its ratio to the unfused
// model's median, in images per second of wall time and in images per second of
// this process's CPU time (all its threads): the work a step costs, which other
// processes on a shared machine disturb much less than the wall time. All
// variants train the same variables from the same seed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "models/fashion_net.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

struct Fusions {
  bool bn_relu = false, bias_relu = false, pool_argmax = false, loss_probs = false, bn_pool = false;
};

// Max pooling whose backward recomputes each window's argmax from x: the
// unfused form of ag::max_pool2d.
class RecomputingMaxPool2d : public Layer {
 public:
  Var forward(const Context& ctx, const Var& x) const override {
    Tape& tape = ctx.tape;
    const Pool2dParams p = Pool2dParams::square(2, 2);
    Tensor y = Tensor::empty(pool2d_output_shape(x.shape(), p), tape.stream(), x.value().dtype());
    max_pool2d_forward(y, x.value(), p, tape.stream());
    return tape.record(y, "max_pool2d_recompute", {x}, [x, p](const Var& out) {
      Tape& t = out.tape();
      max_pool2d_backward(t.grad_for(x), out.grad(), x.value(), p, t.stream());
    });
  }
  std::string describe() const override { return "MaxPool2d (recomputing)"; }
};

// Softmax cross-entropy whose backward recomputes the softmax: the unfused form of
// ag::softmax_cross_entropy.
Var recomputing_cross_entropy(const Var& logits, const Var& labels) {
  Tape& tape = logits.tape();
  Tensor loss = Tensor::empty({1}, tape.stream(), logits.value().dtype());
  softmax_cross_entropy_forward(loss, Tensor(), Tensor(), logits.value(), labels.value(),
                                Reduction::Mean, tape.stream());
  return tape.record(
      loss, "softmax_cross_entropy_recompute", {logits, labels}, [logits, labels](const Var& out) {
        Tape& t = out.tape();
        softmax_cross_entropy_backward(t.grad_for(logits), out.grad(), logits.value(),
                                       labels.value(), Reduction::Mean, t.stream());
      });
}

// FashionNet (autograd/layers.cpp) with the chosen fusions.
Sequential fashion_net_with(VariableSet& vars, const Fusions& f) {
  Sequential net;
  const Conv2dParams same{.pad_h = 1, .pad_w = 1};
  const Activation bn_act = f.bn_relu ? Activation::ReLU : Activation::None;
  const Pool2dParams window = Pool2dParams::square(2, 2);
  auto bn_pool = [&](const char* name, std::int64_t channels) {
    if (f.bn_pool) {  // the ReLU, if not fused, would come after the pool
      net.add<BatchNorm>(vars, name, channels, 0.99, 1e-3, bn_act, window);
      if (!f.bn_relu) net.add<ReLU>();
      return;
    }
    net.add<BatchNorm>(vars, name, channels, 0.99, 1e-3, bn_act);
    if (!f.bn_relu) net.add<ReLU>();
    if (f.pool_argmax) {
      net.add<MaxPool2d>(window);
    } else {
      net.add<RecomputingMaxPool2d>();
    }
  };
  net.add<Conv2d>(vars, "conv1", 1, 32, 3, same, false);
  bn_pool("bn1", 32);
  net.add<Conv2d>(vars, "conv2", 32, 64, 3, same, false);
  bn_pool("bn2", 64);
  net.add<Flatten>();
  net.add<Linear>(vars, "fc1", 3136, 128, true, f.bias_relu ? Activation::ReLU : Activation::None);
  if (!f.bias_relu) net.add<ReLU>();
  net.add<Linear>(vars, "fc2", 128, 10);
  return net;
}

struct Variant {
  const char* name;
  Fusions fusions;
};

int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = std::max(1, arg(argc, argv, "--rounds", 4));
  const int steps = std::max(1, arg(argc, argv, "--steps", 30));
  const std::int64_t batch = std::max(1, arg(argc, argv, "--batch", 128));
  const std::vector<Variant> variants = {
      {"unfused", {}},
      {"bn_relu", {.bn_relu = true}},
      {"bias_relu", {.bias_relu = true}},
      {"pool_argmax", {.pool_argmax = true}},
      {"loss_probs", {.loss_probs = true}},
      {"bn_pool", {.bn_pool = true}},
      {"all but bn_pool", {true, true, true, true, false}},
      {"all (fashion_net)", {true, true, true, true, true}},
  };
  const Stream& host = default_stream(Device::cpu());
  Tensor images = Tensor::empty({batch, 1, 28, 28}, Device::cpu());
  random_normal(images, 1, 0, 0.0f, 1.0f, host);
  std::vector<float> ids(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % 10);
  Tensor labels = Tensor::from_host<float>(ids, {batch}, host);

  std::vector<std::vector<double>> rates(variants.size()), cpu_rates(variants.size());
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t v = 0; v < variants.size(); ++v) {
      VariableSet vars;
      const Fusions f = variants[v].fusions;
      Sequential net = variants[v].name == std::string("all (fashion_net)")
                           ? models::fashion_net(vars)
                           : fashion_net_with(vars, f);
      TowerFn fn = [&net, f](const Tower& tower, const std::vector<Tensor>& b) {
        Var logits = net(tower.context(), tower.input(b[0]));
        Var labels = tower.input(b[1]);
        Var loss = f.loss_probs ? ag::softmax_cross_entropy(logits, labels)
                                : recomputing_cross_entropy(logits, labels);
        return TowerResult{loss, {}, {}};
      };
      TrainerOptions options;
      options.devices = {Device::cpu()};
      options.master = Device::cpu();
      Trainer trainer(vars, fn, Optimizer::by_name("adam", 1e-3), options);
      trainer.step({images, labels});  // warm-up: caches, allocator
      const auto start = std::chrono::steady_clock::now();
      const std::clock_t cpu_start = std::clock();
      for (int s = 0; s < steps; ++s) trainer.step({images, labels});
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
      rates[v].push_back(static_cast<double>(batch) * steps / seconds);
      cpu_rates[v].push_back(static_cast<double>(batch) * steps / cpu_seconds);
    }
  }
  const double base = median(rates[0]), cpu_base = median(cpu_rates[0]);
  std::printf("FashionNet training step, one CPU tower, batch %lld, %d rounds of %d steps\n",
              static_cast<long long>(batch), rounds, steps);
  std::printf("%-20s %10s %7s %12s %7s   rounds (images/s)\n", "variant", "images/s", "ratio",
              "images/cpu-s", "ratio");
  for (std::size_t v = 0; v < variants.size(); ++v) {
    std::printf("%-20s %10.1f %7.3f %12.1f %7.3f  ", variants[v].name, median(rates[v]),
                median(rates[v]) / base, median(cpu_rates[v]), median(cpu_rates[v]) / cpu_base);
    for (double x : rates[v]) std::printf(" %.1f", x);
    std::printf("\n");
  }
  return 0;
}
