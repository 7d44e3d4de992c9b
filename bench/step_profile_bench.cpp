// Where a FashionNet training step spends its time on the CPU: each layer's forward
// and backward and the loss, as shares of one tower's pass; what the trainer's step
// adds beyond that pass (batch split, ring all-reduce, Adam update, copies to the
// replicas); and how far the step is from the GEMM-bound limit (the step's
// convolution and matrix-product FLOPs at the rate of one large GEMM on all threads).
//
//   step_profile_bench [--towers T] [--batch B] [--steps S] [--zero-fill 1]
//
// --zero-fill 1 makes every tape zero-fill its gradients and accumulate into them
// (Tape::FirstWrite::Zeroed) instead of letting the first write assign: the
// measure of what the first writes save.
//
// Method. S rounds, each one Trainer step of the whole model (the step time) and
// then one forward and backward pass on each of T threads (one per tower, as the
// trainer runs CPU towers) of its B/T samples through the same layers on its own
// tape, timing each layer; the shares are those of tower 0. Backward times are
// taken between marker ops recorded between the layers: a marker passes its
// gradient through (a zero-fill and an add, timed inside its backward and left
// out), so a layer's backward is the time from the marker after it to the marker
// before it, including the zero-fill of its input's gradient, as in a real step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "towerlab.h"

using namespace towerlab;

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// FashionNet layer by layer (autograd/layers.cpp's fashion_net, which hides its
// layers in a Sequential), each with its name and its multiply-add count per sample.
struct NamedLayer {
  std::string name;
  std::unique_ptr<Layer> layer;
  double flops_per_sample;  // forward; backward is twice that (data and weight)
};

std::vector<NamedLayer> fashion_net_layers(VariableSet& vars) {
  const Conv2dParams same{.pad_h = 1, .pad_w = 1};
  const Pool2dParams pool = Pool2dParams::square(2, 2);
  std::vector<NamedLayer> l;
  l.push_back({"conv1", std::make_unique<Conv2d>(vars, "conv1", 1, 32, 3, same, false),
               2.0 * 32 * 28 * 28 * 1 * 9});
  l.push_back({"bn1", std::make_unique<BatchNorm>(vars, "bn1", 32), 0});
  l.push_back({"relu1", std::make_unique<ReLU>(), 0});
  l.push_back({"pool1", std::make_unique<MaxPool2d>(pool), 0});
  l.push_back({"conv2", std::make_unique<Conv2d>(vars, "conv2", 32, 64, 3, same, false),
               2.0 * 64 * 14 * 14 * 32 * 9});
  l.push_back({"bn2", std::make_unique<BatchNorm>(vars, "bn2", 64), 0});
  l.push_back({"relu2", std::make_unique<ReLU>(), 0});
  l.push_back({"pool2", std::make_unique<MaxPool2d>(pool), 0});
  l.push_back({"flatten", std::make_unique<Flatten>(), 0});
  l.push_back({"fc1", std::make_unique<Linear>(vars, "fc1", 3136, 128), 2.0 * 3136 * 128});
  l.push_back({"relu3", std::make_unique<ReLU>(), 0});
  l.push_back({"fc2", std::make_unique<Linear>(vars, "fc2", 128, 10), 2.0 * 128 * 10});
  return l;
}

// The FLOPs of one training step of `samples` samples. conv1's input needs no
// gradient, so its backward is the weight product alone.
double step_flops(const std::vector<NamedLayer>& layers, std::int64_t samples) {
  double f = 0;
  for (const NamedLayer& l : layers) f += (l.name == "conv1" ? 2.0 : 3.0) * l.flops_per_sample;
  return f * double(samples);
}

// Identity in the forward pass; in the backward pass adds its gradient into its
// input's and notes when it started and finished.
struct Marker {
  Clock::time_point begin, end;
};
Var mark(const Var& x, Marker& m) {
  return x.tape().record(x.value(), "marker", {x}, [x, &m](const Var& out) {
    m.begin = Clock::now();
    out.tape().add_to_grad(x, out.grad());
    m.end = Clock::now();
  });
}

// Per layer: forward and backward milliseconds summed over the passes.
struct Profile {
  std::vector<double> forward, backward;
  double loss_forward = 0, loss_backward = 0;
};

Tensor random_images(std::int64_t n, std::uint64_t seed) {
  Tensor images = Tensor::empty({n, 1, 28, 28}, Device::cpu());
  random_normal(images, seed, 0, 0.0f, 1.0f, default_stream(Device::cpu()));
  return images;
}

Tensor labels_for(std::int64_t n) {
  std::vector<float> ids(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % 10);
  return Tensor::from_host<float>(ids, {n}, default_stream(Device::cpu()));
}

// One tower's own copy of the variables, tape and batch, and its timings.
class TowerProfile {
 public:
  TowerProfile(const VariableSet& vars, const std::vector<NamedLayer>& layers, std::int64_t samples,
               Tape::FirstWrite first_write)
      : layers_(layers),
        stream_(Device::cpu()),
        store_(vars, stream_),
        tape_(stream_, "profile"),
        images_(random_images(samples, 7)),
        labels_(labels_for(samples)),
        markers_(layers.size()) {
    store_.initialize(1, stream_);
    tape_.set_first_write(first_write);
    times.forward.assign(layers.size(), 0.0);
    times.backward.assign(layers.size(), 0.0);
  }

  // One forward and backward pass, layer by layer; added to `times` when `timed`.
  void pass(bool timed) {
    tape_.reset();
    store_.zero_grad(stream_);
    Context ctx{tape_, store_, true};
    Var h = tape_.constant(images_);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const auto start = Clock::now();
      h = (*layers_[i].layer)(ctx, h);
      if (timed) times.forward[i] += ms_between(start, Clock::now());
      h = mark(h, markers_[i]);
    }
    auto start = Clock::now();
    Var loss = ag::softmax_cross_entropy(h, tape_.constant(labels_));
    if (timed) times.loss_forward += ms_between(start, Clock::now());
    start = Clock::now();
    tape_.backward(loss);
    const auto end = Clock::now();
    if (!timed) return;
    // Backward runs the layers last to first; markers_[i] sits after layer i.
    times.loss_backward += ms_between(start, markers_.back().begin);
    for (std::size_t i = layers_.size(); i-- > 0;) {
      const Clock::time_point to = i == 0 ? end : markers_[i - 1].begin;
      times.backward[i] += ms_between(markers_[i].end, to);
    }
  }

  Profile times;

 private:
  const std::vector<NamedLayer>& layers_;
  Stream stream_;
  VariableStore store_;
  Tape tape_;
  Tensor images_, labels_;
  std::vector<Marker> markers_;
};

int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

// The same model in a Trainer: T towers, Adam, all on the CPU.
struct Training {
  VariableSet vars;
  Sequential net = fashion_net(vars);
  Tape::FirstWrite first_write;
  Trainer trainer;
  Tensor images, labels;
  Training(int towers, std::int64_t batch, Tape::FirstWrite first_write)
      : first_write(first_write),
        trainer(vars, tower_fn(), Optimizer::by_name("adam", 1e-3), options(towers)),
        images(random_images(batch, 1)),
        labels(labels_for(batch)) {}
  TowerFn tower_fn() {
    return [this](const Tower& tower, const std::vector<Tensor>& b) {
      tower.tape.set_first_write(first_write);
      Var logits = net(tower.context(), tower.input(b[0]));
      return TowerResult{ag::softmax_cross_entropy(logits, tower.input(b[1])), {}, {}};
    };
  }
  static TrainerOptions options(int towers) {
    TrainerOptions o;
    o.devices.assign(std::size_t(towers), Device::cpu());
    o.master = Device::cpu();
    return o;
  }
  void step() { trainer.step({images, labels}); }
};

// GFLOP/s of one 1024^3 float32 GEMM on all threads: the rate the limit assumes.
double gemm_gflops() {
  const std::int64_t n = 1024;
  const Stream& s = default_stream(Device::cpu());
  Tensor a = Tensor::empty({n, n}, Device::cpu()), b = Tensor::empty({n, n}, Device::cpu());
  Tensor c = Tensor::empty({n, n}, Device::cpu());
  random_normal(a, 1, 0, 0.0f, 1.0f, s);
  random_normal(b, 2, 0, 0.0f, 1.0f, s);
  matmul(c, a, b, false, false, 1.0f, 0.0f, s);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto start = Clock::now();
    matmul(c, a, b, false, false, 1.0f, 0.0f, s);
    best = std::min(best, ms_between(start, Clock::now()));
  }
  return 2.0 * double(n * n * n) / (best * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  const int towers = std::max(1, arg(argc, argv, "--towers", 1));
  const std::int64_t batch = arg(argc, argv, "--batch", 128);
  const int steps = std::max(1, arg(argc, argv, "--steps", 20));
  const std::int64_t per_tower = batch / towers;  // tower 0's share (the larger when uneven)
  const Tape::FirstWrite first_write =
      arg(argc, argv, "--zero-fill", 0) != 0 ? Tape::FirstWrite::Zeroed : Tape::FirstWrite::Assign;

  // Trainer steps and profiled passes alternate, so that both see the same load.
  Training training(towers, batch, first_write);
  VariableSet vars;
  const std::vector<NamedLayer> layers = fashion_net_layers(vars);
  std::vector<std::unique_ptr<TowerProfile>> profiles;
  for (int t = 0; t < towers; ++t) {
    const std::int64_t samples = batch * (t + 1) / towers - batch * t / towers;
    profiles.push_back(std::make_unique<TowerProfile>(vars, layers, samples, first_write));
  }
  double step_ms = 0;
  for (int round = 0; round <= steps; ++round) {  // round 0 warms caches and allocators
    const auto start = Clock::now();
    training.step();
    if (round > 0) step_ms += ms_between(start, Clock::now()) / steps;
    std::vector<std::thread> threads;
    for (int t = 0; t < towers; ++t) {
      threads.emplace_back([&, t] {
        const ThreadShare share(t, towers);  // as the trainer gives each tower
        profiles[std::size_t(t)]->pass(round > 0);
      });
    }
    for (std::thread& t : threads) t.join();
  }

  const Profile& p = profiles[0]->times;
  const double gflops = gemm_gflops();
  const double limit_ms = step_flops(layers, batch) / (gflops * 1e6);
  std::printf(
      "FashionNet step on the CPU: %d tower(s), batch %lld (%lld on tower 0), %d threads, "
      "gradients %s\n",
      towers, static_cast<long long>(batch), static_cast<long long>(per_tower), num_threads(),
      first_write == Tape::FirstWrite::Zeroed ? "zero-filled" : "first write assigns");
  std::printf("trainer step: %.2f ms (%.0f images/s)\n\n", step_ms, batch * 1000.0 / step_ms);
  // Shares are of tower 0's whole pass (its layers and loss), which the marker ops
  // leave out; the trainer step adds the split, ring, Adam update and copies.
  double pass_ms = p.loss_forward + p.loss_backward;
  for (std::size_t i = 0; i < layers.size(); ++i) pass_ms += p.forward[i] + p.backward[i];
  pass_ms /= steps;
  std::printf("%-10s %12s %8s %12s %8s\n", "layer", "forward ms", "share", "backward ms", "share");
  auto row = [&](const std::string& name, double f, double b) {
    std::printf("%-10s %12.3f %7.1f%% %12.3f %7.1f%%\n", name.c_str(), f / steps,
                100.0 * f / steps / pass_ms, b / steps, 100.0 * b / steps / pass_ms);
  };
  for (std::size_t i = 0; i < layers.size(); ++i) row(layers[i].name, p.forward[i], p.backward[i]);
  row("loss", p.loss_forward, p.loss_backward);
  std::printf(
      "tower 0's pass: %.2f ms; the trainer step beyond it (split, ring, Adam, copies, "
      "waiting): %.2f ms\n",
      pass_ms, step_ms - pass_ms);
  std::printf(
      "\nGEMM rate (1024^3, all threads): %.1f GFLOP/s; step FLOPs %.2f G; GEMM-bound "
      "limit %.2f ms = %.1f%% of the step\n",
      gflops, step_flops(layers, batch) / 1e9, limit_ms, 100.0 * limit_ms / step_ms);
  return 0;
}
