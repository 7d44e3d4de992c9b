// Where a FashionNet training step spends its time on the CPU: each layer's forward
// and backward and the loss, as shares of tower 0's pass; what the trainer's step
// adds beyond that pass (batch split, ring all-reduce, Adam update, copies to the
// replicas, waiting for the other towers); the process CPU time per step (which a
// loaded machine does not inflate the way it inflates wall time); and how far the
// step is from the GEMM-bound limit (the step's convolution and matrix-product FLOPs
// at the rate of one large GEMM on all threads).
//
//   step_profile_bench [--towers T] [--batch B] [--steps S] [--zero-fill 1]
//
// --zero-fill 1 makes every tape zero-fill its gradients and accumulate into them
// (Tape::FirstWrite::Zeroed) instead of letting the first write assign: the
// measure of what the first writes save.
//
// Method. The model is the sample's own (autograd/layers.h's fashion_net, with its
// fused batch norm + ReLU and bias + ReLU), trained by a Trainer with T CPU towers
// and Adam, as samples/fashion_mnist trains it. Each tower's tape gets a profiler
// (TapeProfiler, the hook the trainer's traces use) that sums the time of each
// layer's forward scope and of each run of backward records a layer made; the
// records made outside every layer (the loss) form the row "loss". The shares are
// those of tower 0.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "towerlab.h"

using namespace towerlab;

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// User plus system time of every thread of the process, in milliseconds.
double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}

// "conv1: Conv2d 1->32 ..." is "conv1"; "MaxPool2d 2x2 stride 2" is "MaxPool2d".
std::string short_name(const std::string& description) {
  const std::size_t colon = description.find(':');
  return description.substr(0, colon != std::string::npos ? colon : description.find(' '));
}

// One row per layer of the model, in forward order, and its multiply-add FLOPs.
struct LayerRow {
  std::string name;
  double forward_flops_per_sample = 0;
  double backward_flops_per_sample = 0;  // the data product (unless the input needs no
                                         // gradient) and the weight product
  double forward_ms = 0, backward_ms = 0;
};

// The rows of `net`, with the FLOPs of its convolutions and matrix products: a layer
// with a variable <name>/weight [K,...] producing an output of shape [N,K,...] costs
// 2 * weight elements * (output elements per sample / K) per sample forward. One
// inference pass on a sample finds the shapes.
std::vector<LayerRow> layer_rows(const Sequential& net, const VariableSet& vars) {
  const Stream& s = default_stream(Device::cpu());
  VariableStore store(vars, s);
  store.initialize(1, s);
  Tape tape(s, "shapes");
  const NoGradGuard no_grad(tape);
  const Context ctx{tape, store, false};
  Tensor image = Tensor::empty({1, 1, 28, 28}, Device::cpu());
  random_normal(image, 1, 0, 0.0f, 1.0f, s);
  Var h = tape.constant(image);
  std::vector<LayerRow> rows;
  for (std::size_t i = 0; i < net.size(); ++i) {
    LayerRow row{short_name(net.layer(i).describe())};
    for (const LayerRow& r : rows) {
      if (r.name == row.name) row.name = row.name + " " + std::to_string(i);  // unique
    }
    h = net.layer(i)(ctx, h);
    if (const VariableSpec* w = vars.find(row.name + "/weight")) {
      const double per_output = double(w->numel()) / double(w->shape[0]);
      row.forward_flops_per_sample = 2.0 * per_output * double(h.value().numel());
      row.backward_flops_per_sample = (i == 0 ? 1.0 : 2.0) * row.forward_flops_per_sample;
    }
    rows.push_back(row);
  }
  return rows;
}

// Sums one tape's time per layer scope (forward) and per run of backward records
// made in a scope (backward). Scopes are numbered in forward order within a pass,
// so scope i of every pass is layer i; records outside every scope are the loss's.
class LayerTimer : public TapeProfiler {
 public:
  explicit LayerTimer(std::size_t layers) : forward_(layers, 0.0), backward_(layers, 0.0) {}

  int begin_scope(const std::string&) override {
    if (backward_seen_) {  // a new pass
      backward_seen_ = false;
      next_scope_ = 0;
    }
    scope_start_ = Clock::now();
    return next_scope_++;
  }
  void end_scope(int scope) noexcept override {
    if (timing) forward_[std::size_t(scope)] += ms_between(scope_start_, Clock::now());
  }
  void backward_record(int scope, const std::string&) override {
    close_run();
    run_scope_ = scope;
    run_start_ = Clock::now();
    in_run_ = true;
    backward_seen_ = true;
  }
  void backward_done() override { close_run(); }

  bool timing = false;
  const std::vector<double>& forward() const { return forward_; }
  const std::vector<double>& backward() const { return backward_; }
  double loss_backward() const { return loss_backward_; }

 private:
  void close_run() {
    if (!in_run_) return;
    in_run_ = false;
    if (!timing) return;
    const double ms = ms_between(run_start_, Clock::now());
    (run_scope_ >= 0 ? backward_[std::size_t(run_scope_)] : loss_backward_) += ms;
  }

  std::vector<double> forward_, backward_;
  double loss_backward_ = 0;
  int next_scope_ = 0;
  bool backward_seen_ = false;
  Clock::time_point scope_start_, run_start_;
  bool in_run_ = false;
  int run_scope_ = -1;
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

int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

// The sample's model in a Trainer: T towers, Adam, all on the CPU, each tower's
// tape timed by its LayerTimer (and its whole pass, loss forward included).
struct Training {
  VariableSet vars;
  Sequential net = fashion_net(vars);
  std::vector<LayerRow> rows = layer_rows(net, vars);
  Tape::FirstWrite first_write;
  std::vector<LayerTimer> timers;
  std::vector<double> loss_forward_ms;
  Trainer trainer;
  Tensor images, labels;

  Training(int towers, std::int64_t batch, Tape::FirstWrite first_write)
      : first_write(first_write),
        timers(std::size_t(towers), LayerTimer(rows.size())),
        loss_forward_ms(std::size_t(towers), 0.0),
        trainer(vars, tower_fn(), Optimizer::by_name("adam", 1e-3), options(towers)),
        images(random_images(batch, 1)),
        labels(labels_for(batch)) {}

  TowerFn tower_fn() {
    return [this](const Tower& tower, const std::vector<Tensor>& b) {
      LayerTimer& timer = timers[std::size_t(tower.index)];
      tower.tape.set_first_write(first_write);
      tower.tape.set_profiler(&timer);  // the trainer removes it after the backward pass
      Var logits = net(tower.context(), tower.input(b[0]));
      const auto start = Clock::now();
      Var loss = ag::softmax_cross_entropy(logits, tower.input(b[1]));
      if (timer.timing)
        loss_forward_ms[std::size_t(tower.index)] += ms_between(start, Clock::now());
      return TowerResult{loss, {}, {}};
    };
  }
  static TrainerOptions options(int towers) {
    TrainerOptions o;
    o.devices.assign(std::size_t(towers), Device::cpu());
    o.master = Device::cpu();
    return o;
  }
  void step(bool timed) {
    for (LayerTimer& t : timers) t.timing = timed;
    trainer.step({images, labels});
  }
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

double load_average() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1.0;
}

}  // namespace

int main(int argc, char** argv) {
  const int towers = std::max(1, arg(argc, argv, "--towers", 1));
  const std::int64_t batch = arg(argc, argv, "--batch", 128);
  const int steps = std::max(1, arg(argc, argv, "--steps", 20));
  const std::int64_t per_tower = (batch + towers - 1) / towers;  // tower 0's share
  const Tape::FirstWrite first_write =
      arg(argc, argv, "--zero-fill", 0) != 0 ? Tape::FirstWrite::Zeroed : Tape::FirstWrite::Assign;

  const double load_before = load_average();
  Training training(towers, batch, first_write);
  for (int w = 0; w < 3; ++w) training.step(false);  // warms caches and allocators
  const auto start = Clock::now();
  const double cpu_start = process_cpu_ms();
  for (int i = 0; i < steps; ++i) training.step(true);
  const double step_ms = ms_between(start, Clock::now()) / steps;
  const double step_cpu_ms = (process_cpu_ms() - cpu_start) / steps;

  const LayerTimer& timer = training.timers[0];
  std::vector<LayerRow> rows = training.rows;
  double pass_ms = (training.loss_forward_ms[0] + timer.loss_backward()) / steps;
  double flops = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    rows[i].forward_ms = timer.forward()[i] / steps;
    rows[i].backward_ms = timer.backward()[i] / steps;
    pass_ms += rows[i].forward_ms + rows[i].backward_ms;
    flops += (rows[i].forward_flops_per_sample + rows[i].backward_flops_per_sample) * double(batch);
  }
  const double gflops = gemm_gflops();
  const double limit_ms = flops / (gflops * 1e6);

  std::printf(
      "FashionNet step on the CPU (fused model, Adam): %d tower(s), batch %lld (%lld on tower "
      "0), %d threads, gradients %s; load average %.2f before, %.2f after\n",
      towers, static_cast<long long>(batch), static_cast<long long>(per_tower), num_threads(),
      first_write == Tape::FirstWrite::Zeroed ? "zero-filled" : "first write assigns", load_before,
      load_average());
  std::printf(
      "trainer step: %.2f ms wall (%.0f images/s), %.2f ms process CPU (%.0f images per "
      "CPU-second)\n\n",
      step_ms, double(batch) * 1000.0 / step_ms, step_cpu_ms, double(batch) * 1000.0 / step_cpu_ms);
  std::printf("%-10s %12s %8s %12s %8s %10s\n", "layer", "forward ms", "share", "backward ms",
              "share", "GFLOP/s");
  auto row = [&](const std::string& name, double f, double b, double row_flops) {
    std::printf("%-10s %12.3f %7.1f%% %12.3f %7.1f%%", name.c_str(), f, 100.0 * f / pass_ms, b,
                100.0 * b / pass_ms);
    if (row_flops > 0) std::printf(" %10.1f", row_flops / ((f + b) * 1e6));
    std::printf("\n");
  };
  for (const LayerRow& r : rows) {
    row(r.name, r.forward_ms, r.backward_ms,
        (r.forward_flops_per_sample + r.backward_flops_per_sample) * double(per_tower));
  }
  row("loss", training.loss_forward_ms[0] / steps, timer.loss_backward() / steps, 0);
  std::printf(
      "tower 0's pass: %.2f ms; the trainer step beyond it (split, ring, Adam, copies, "
      "waiting): %.2f ms\n",
      pass_ms, step_ms - pass_ms);
  std::printf(
      "\nGEMM rate (1024^3, all threads): %.1f GFLOP/s; step FLOPs %.2f G; GEMM-bound limit "
      "%.2f ms = %.1f%% of the step's wall time\n",
      gflops, flops / 1e9, limit_ms, 100.0 * limit_ms / step_ms);
  return 0;
}
