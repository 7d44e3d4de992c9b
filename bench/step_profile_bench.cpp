// Where a training step of one of models/ (FashionNet by default, the MLP, ResNet-20 or the ViT)
// spends its time on the CPU: each layer's forward and backward and the loss, as shares
// of tower 0's pass, then the same time summed by kind of layer (Conv2d, BatchNorm,
// Linear, ...) and the backward by op; what the trainer's step
// adds beyond that pass (batch split, ring all-reduce, Adam update, copies to the
// replicas, waiting for the other towers); the process CPU time per step (which a
// loaded machine does not inflate the way it inflates wall time); and how far the
// step is from the GEMM-bound limit (the step's convolution and matrix-product FLOPs
// at the rate of one large GEMM: in wall time on all threads, and per thread in CPU
// time).
//
//   step_profile_bench [--model fashion_net|mlp|resnet|vit] [--towers T] [--batch B]
//                      [--steps S] [--threads N] [--zero-fill 1] [--master host|sharded]
//                      [--precision fp32|bf16|fp16]
//
// --model resnet synchronizes batch norm across the towers (BatchNormMode::Sync), as
// the sample's recipe for it (`--batchnorm sync`); the MLP's and the ViT's dropout is
// on (training). --master sharded shards the master variables and Adam's slots
// across the towers (MasterPlacement::Sharded, the sample's `--master sharded`)
// instead of keeping them on the host. --precision sets TrainerOptions::precision
// (the sample's --precision; docs/precision.md): under bf16 or fp16 the layers' rows
// include the casts the policy records inside them (the float32 fallback's widen
// and round, a GEMM's rounding of its sums), and the GEMM-bound limit is taken at
// the rate of one large GEMM of that dtype's operands (float32 sums), the limit a
// 16-bit step can reach on this CPU.
// --threads N sets the pool's size (default: the machine's CPUs). --zero-fill 1
// makes every tape zero-fill its gradients and accumulate into them
// (Tape::FirstWrite::Zeroed) instead of letting the first write assign: the
// measure of what the first writes save.
//
// Method. The model is the sample's own (models/: fashion_net, mlp, resnet or vit, with their
// fused batch norm + ReLU and bias + ReLU), trained by a Trainer with T CPU towers
// and Adam, as samples/fashion_mnist trains it. Each tower's tape gets a profiler
// (TapeProfiler, the hook the trainer's traces use) that sums the time of each
// layer's forward scope and of each run of backward records a layer made; the
// records made outside every layer (the loss) form the row "loss". Layers inside
// layers (a Residual's body and shortcut) are scopes inside scopes: each scope's own
// time excludes its inner scopes', a top-level layer's row sums its whole subtree,
// and the table by kind sums each scope's own time under its kind, so that both
// tables add up to the pass. The shares are
// those of tower 0, in wall time and in the CPU time of tower 0's thread. A loaded
// machine stretches wall time but hardly the thread's CPU time, which is the whole
// of the tower's work when its share of the pool is one thread (2 towers on 2
// threads, or --threads 1): the shares to trust on a shared machine.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include <map>

#include "models/fashion_net.h"
#include "models/mlp.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// CPU time in milliseconds: of every thread of the process (CLOCK_PROCESS_CPUTIME_ID)
// or of the calling thread (CLOCK_THREAD_CPUTIME_ID).
double cpu_ms(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}
double process_cpu_ms() {
  return cpu_ms(CLOCK_PROCESS_CPUTIME_ID);
}
double thread_cpu_ms() {
  return cpu_ms(CLOCK_THREAD_CPUTIME_ID);
}

// A point in time on both clocks: wall and the calling thread's CPU.
struct Instant {
  Clock::time_point wall = Clock::now();
  double cpu = thread_cpu_ms();
};
// Wall and thread-CPU milliseconds.
struct Times {
  double wall = 0, cpu = 0;
  void add_since(const Instant& start) {
    const Instant now;
    wall += ms_between(start.wall, now.wall);
    cpu += now.cpu - start.cpu;
  }
  Times per(int steps) const { return {wall / steps, cpu / steps}; }
  Times operator+(const Times& o) const { return {wall + o.wall, cpu + o.cpu}; }
};

// "conv1: Conv2d 1->32 ..." is "conv1"; "MaxPool2d 2x2 stride 2" is "MaxPool2d".
std::string short_name(const std::string& description) {
  const std::string first = description.substr(0, description.find('\n'));
  const std::size_t colon = first.find(':');
  return first.substr(0, colon != std::string::npos ? colon : first.find(' '));
}

// The kind of layer: "conv1: Conv2d 1->32 ..." is "Conv2d"; "MaxPool2d 2x2 ..." is
// "MaxPool2d".
std::string kind_of(const std::string& description) {
  const std::string first = description.substr(0, description.find('\n'));
  const std::size_t colon = first.find(": ");
  const std::string rest = colon != std::string::npos ? first.substr(colon + 2) : first;
  return rest.substr(0, rest.find(' '));
}

// One row per layer of the model, in forward order, and its multiply-add FLOPs.
struct LayerRow {
  std::string name;
  double forward_flops_per_sample = 0;
  double backward_flops_per_sample = 0;  // the data product (unless the input needs no
                                         // gradient) and the weight product
  Times forward, backward;               // per step
};

// The multiply-add FLOPs of a sample's attention products in a layer (the ViT's
// blocks): per MultiHeadSelfAttention of width D on T tokens, q k^T and p v cost
// 2 T T D each (all heads together). `description` is the layer's describe().
double attention_flops_per_sample(const std::string& description, double tokens) {
  const std::string kind = "MultiHeadSelfAttention ";
  double flops = 0;
  for (std::size_t at = description.find(kind); at != std::string::npos;
       at = description.find(kind, at + kind.size())) {
    flops += 2 * 2.0 * tokens * tokens * std::atof(description.c_str() + at + kind.size());
  }
  return flops;
}

// The rows of `net`, with the FLOPs of its convolutions and matrix products: a layer
// whose output is [N,K,H,W] (or [N,T,K] or [N,K]: H W is T, or 1) costs, per sample
// forward, 2 * elements * H * W for each weight (a variable named .../weight of rank 2
// or more) its forward reads (a Residual's convolutions all produce its output's H
// and W; a ViT's layers work on every token), plus its attention products. One
// inference pass on a sample finds the shapes, and the variables each layer reads
// (those its forward put on the tape).
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
  bool input_needs_grad = false;  // the images need none: not until a layer reads a variable
  for (std::size_t i = 0; i < net.size(); ++i) {
    LayerRow row{short_name(net.layer(i).describe())};
    for (const LayerRow& r : rows) {
      if (r.name == row.name) row.name = row.name + " " + std::to_string(i);  // unique
    }
    tape.reset();  // Tape::has_variable: the variables this layer reads
    h = net.layer(i)(ctx, h);
    const Shape& out = h.value().shape();
    const std::size_t channels = out.size() == 4 ? 1 : out.size() - 1;
    const double spatial = double(h.value().numel()) / double(out[channels]);
    const std::string suffix = "/weight";
    bool reads_variable = false;
    for (const VariableSpec& w : vars.specs()) {
      const std::string& n = w.name;
      reads_variable = reads_variable || tape.has_variable(n);
      if (w.shape.size() >= 2 && tape.has_variable(n) && n.size() > suffix.size() &&
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) {
        row.forward_flops_per_sample += 2.0 * double(w.numel()) * spatial;
      }
    }
    if (out.size() == 3) {
      row.forward_flops_per_sample +=
          attention_flops_per_sample(net.layer(i).describe(), double(out[1]));
    }
    row.backward_flops_per_sample = (input_needs_grad ? 2.0 : 1.0) * row.forward_flops_per_sample;
    input_needs_grad = input_needs_grad || reads_variable;
    rows.push_back(row);
  }
  return rows;
}

// Sums one tape's time per layer scope (forward: the scope's own time, its inner
// scopes' excluded) and per run of backward records made in a scope (backward), and
// the backward's time per op. Scopes are numbered in the order they open within a
// pass, so scope i of every pass is the same layer; the first pass notes each scope's
// name, kind and top-level layer. Records outside every scope are the loss's.
class LayerTimer : public TapeProfiler {
 public:
  struct Scope {
    std::string name, kind;
    std::size_t top = 0;  // the top-level layer (the row) it is in
    int depth = 0;
    Times forward, backward;
  };

  int begin_scope(const std::string& description) override {
    if (backward_seen_) {  // a new pass
      backward_seen_ = false;
      next_scope_ = 0;
      top_count_ = 0;
    }
    const std::size_t id = std::size_t(next_scope_++);
    if (id == scopes_.size()) {
      const int depth = int(open_.size());
      Scope scope{short_name(description), kind_of(description)};
      scope.top = depth == 0 ? top_count_ : scopes_[open_.back().id].top;
      scope.depth = depth;
      scopes_.push_back(scope);
    }
    if (open_.empty()) ++top_count_;
    const Instant now;
    if (!open_.empty()) open_.back().own.add_since(open_.back().since);  // the parent pauses
    open_.push_back({id, now, {}});
    return int(id);
  }
  void end_scope(int) noexcept override {
    Open done = open_.back();
    open_.pop_back();
    done.own.add_since(done.since);
    if (timing) {
      scopes_[done.id].forward.wall += done.own.wall;
      scopes_[done.id].forward.cpu += done.own.cpu;
    }
    if (!open_.empty()) open_.back().since = Instant();  // the parent resumes
  }
  void backward_record(int scope, const std::string& op) override {
    close_run();
    run_scope_ = scope;
    run_op_ = op;
    run_start_ = Instant();
    in_run_ = true;
    backward_seen_ = true;
  }
  void backward_done() override { close_run(); }

  bool timing = false;
  const std::vector<Scope>& scopes() const { return scopes_; }
  const Times& loss_backward() const { return loss_backward_; }
  const std::map<std::string, Times>& backward_by_op() const { return by_op_; }

 private:
  struct Open {
    std::size_t id;
    Instant since;  // when its own time last resumed
    Times own;
  };

  void close_run() {
    if (!in_run_) return;
    in_run_ = false;
    if (!timing) return;
    Times t;
    t.add_since(run_start_);
    Times& into = run_scope_ >= 0 ? scopes_[std::size_t(run_scope_)].backward : loss_backward_;
    into = into + t;
    by_op_[run_op_] = by_op_[run_op_] + t;
  }

  std::vector<Scope> scopes_;
  std::vector<Open> open_;
  std::map<std::string, Times> by_op_;
  Times loss_backward_;
  int next_scope_ = 0;
  std::size_t top_count_ = 0;
  bool backward_seen_ = false;
  Instant run_start_;
  bool in_run_ = false;
  int run_scope_ = -1;
  std::string run_op_;
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

std::string string_arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

// The model --model names, as the sample builds it, and its title.
const char* model_title(const std::string& model) {
  if (model == "fashion_net") return "FashionNet";
  if (model == "mlp") return "MLP";
  if (model == "resnet") return "ResNet-20";
  if (model == "vit") return "ViT";
  return nullptr;
}
Sequential make_model(const std::string& model, VariableSet& vars) {
  if (model == "mlp") return models::mlp(vars);
  if (model == "resnet") return models::resnet(vars);
  if (model == "vit") return models::vit(vars);
  return models::fashion_net(vars);
}

// The sample's model in a Trainer: T towers, Adam, all on the CPU, each tower's
// tape timed by its LayerTimer (and its whole pass, loss forward included).
struct Training {
  VariableSet vars;
  Sequential net;
  std::vector<LayerRow> rows;
  Tape::FirstWrite first_write;
  std::vector<LayerTimer> timers;
  std::vector<Times> loss_forward;
  Trainer trainer;
  Tensor images, labels;

  Training(const std::string& model, int towers, std::int64_t batch, Tape::FirstWrite first_write,
           bool sharded, Precision precision)
      : net(make_model(model, vars)),
        rows(layer_rows(net, vars)),
        first_write(first_write),
        timers(std::size_t(towers)),
        loss_forward(std::size_t(towers)),
        trainer(vars, tower_fn(), Optimizer::by_name("adam", 1e-3),
                options(model, towers, sharded, precision)),
        images(random_images(batch, 1)),
        labels(labels_for(batch)) {}

  TowerFn tower_fn() {
    return [this](const Tower& tower, const std::vector<Tensor>& b) {
      LayerTimer& timer = timers[std::size_t(tower.index)];
      tower.tape.set_first_write(first_write);
      tower.tape.set_profiler(&timer);  // the trainer removes it after the backward pass
      Var logits = net(tower.context(), tower.input(b[0]));
      const Instant start;
      Var loss = ag::softmax_cross_entropy(logits, tower.input(b[1]));
      if (timer.timing) loss_forward[std::size_t(tower.index)].add_since(start);
      return TowerResult{loss, {}, {}};
    };
  }
  static TrainerOptions options(const std::string& model, int towers, bool sharded,
                                Precision precision) {
    TrainerOptions o;
    o.precision = precision;
    o.devices.assign(std::size_t(towers), Device::cpu());
    if (sharded) {
      o.master_placement = MasterPlacement::Sharded;
    } else {
      o.master = Device::cpu();
    }
    if (model == "resnet") o.batchnorm = BatchNormMode::Sync;  // the sample's recipe
    return o;
  }
  void step(bool timed) {
    for (LayerTimer& t : timers) t.timing = timed;
    trainer.step({images, labels});
  }
};

// The GEMM rate the limit assumes: one 1024^3 GEMM of `operands` (float32, or the
// 16-bit working dtype with float32 sums into a float32 C), best of five, in wall
// time on all threads and in CPU time on one thread (the calling thread's pool share
// set to one). On a loaded machine the second times the number of threads is the
// rate the cores give when they are not taken away.
struct GemmRate {
  double wall_gflops, thread_cpu_gflops;
};
GemmRate gemm_rate(DType operands) {
  const std::int64_t n = 1024;
  const Stream& s = default_stream(Device::cpu());
  Tensor a = Tensor::empty({n, n}, Device::cpu()), b = Tensor::empty({n, n}, Device::cpu());
  Tensor c = Tensor::empty({n, n}, Device::cpu());
  random_normal(a, 1, 0, 0.0f, 1.0f, s);
  random_normal(b, 2, 0, 0.0f, 1.0f, s);
  if (operands != DType::Float32) {
    a = cast(a, operands, s);
    b = cast(b, operands, s);
  }
  matmul(c, a, b, false, false, 1.0f, 0.0f, s);
  double best_wall = 1e30, best_cpu = 1e30;
  for (int r = 0; r < 5; ++r) {
    const Instant start;
    matmul(c, a, b, false, false, 1.0f, 0.0f, s);
    Times t;
    t.add_since(start);
    best_wall = std::min(best_wall, t.wall);
  }
  {
    const ThreadShare alone(0, num_threads());  // a share of one thread: inline
    for (int r = 0; r < 5; ++r) {
      const Instant start;
      matmul(c, a, b, false, false, 1.0f, 0.0f, s);
      Times t;
      t.add_since(start);
      best_cpu = std::min(best_cpu, t.cpu);
    }
  }
  const double flops = 2.0 * double(n * n * n);
  return {flops / (best_wall * 1e6), flops / (best_cpu * 1e6)};
}

double load_average() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1.0;
}

// Whether every argument is one of main's flags followed by its value; else says
// which is not, on one line.
bool arguments_known(int argc, char** argv) {
  static const char* const kFlags[] = {"--model",   "--towers",    "--batch",  "--steps",
                                       "--threads", "--zero-fill", "--master", "--precision"};
  for (int i = 1; i < argc; i += 2) {
    const bool known = std::any_of(std::begin(kFlags), std::end(kFlags), [&](const char* flag) {
      return std::strcmp(argv[i], flag) == 0;
    });
    if (!known || i + 1 >= argc) {
      std::fprintf(stderr, "step_profile_bench: %s '%s' (usage at the top of the source)\n",
                   known ? "no value after" : "unknown argument", argv[i]);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!arguments_known(argc, argv)) return 2;
  const std::string model = string_arg(argc, argv, "--model", "fashion_net");
  if (model_title(model) == nullptr) {
    std::fprintf(stderr,
                 "step_profile_bench: --model is fashion_net, mlp, resnet or vit, got '%s'\n",
                 model.c_str());
    return 2;
  }
  const std::string master = string_arg(argc, argv, "--master", "host");
  if (master != "host" && master != "sharded") {
    std::fprintf(stderr, "step_profile_bench: --master is host or sharded, got '%s'\n",
                 master.c_str());
    return 2;
  }
  const int towers = std::max(1, arg(argc, argv, "--towers", 1));
  const std::int64_t batch = arg(argc, argv, "--batch", 128);
  const int steps = std::max(1, arg(argc, argv, "--steps", 20));
  const std::int64_t per_tower = (batch + towers - 1) / towers;  // tower 0's share
  const Tape::FirstWrite first_write =
      arg(argc, argv, "--zero-fill", 0) != 0 ? Tape::FirstWrite::Zeroed : Tape::FirstWrite::Assign;

  const std::string precision_arg = string_arg(argc, argv, "--precision", "fp32");
  const Precision precision = precision_arg == "bf16"   ? Precision::Bf16
                              : precision_arg == "fp16" ? Precision::Fp16
                                                        : Precision::Fp32;
  if (precision_name(precision) != precision_arg) {
    std::fprintf(stderr, "step_profile_bench: --precision is fp32, bf16 or fp16, got '%s'\n",
                 precision_arg.c_str());
    return 2;
  }

  if (const int threads = arg(argc, argv, "--threads", 0); threads > 0) set_num_threads(threads);
  const double load_before = load_average();
  Training training(model, towers, batch, first_write, master == "sharded", precision);
  for (int w = 0; w < 3; ++w) training.step(false);  // warms caches and allocators
  const auto start = Clock::now();
  const double cpu_start = process_cpu_ms();
  for (int i = 0; i < steps; ++i) training.step(true);
  const double step_ms = ms_between(start, Clock::now()) / steps;
  const double step_cpu_ms = (process_cpu_ms() - cpu_start) / steps;

  const LayerTimer& timer = training.timers[0];
  std::vector<LayerRow> rows = training.rows;
  const Times loss_forward = training.loss_forward[0].per(steps);
  const Times loss_backward = timer.loss_backward().per(steps);
  Times pass = loss_forward + loss_backward;
  double flops = 0;
  std::map<std::string, std::pair<Times, Times>> by_kind;  // forward, backward
  for (const LayerTimer::Scope& scope : timer.scopes()) {
    LayerRow& r = rows[scope.top];
    r.forward = r.forward + scope.forward.per(steps);
    r.backward = r.backward + scope.backward.per(steps);
    auto& kind = by_kind[scope.kind];
    kind.first = kind.first + scope.forward.per(steps);
    kind.second = kind.second + scope.backward.per(steps);
  }
  for (const LayerRow& r : rows) {
    pass = pass + r.forward + r.backward;
    flops += (r.forward_flops_per_sample + r.backward_flops_per_sample) * double(batch);
  }
  const DType gemm_dtype = compute_dtype(precision);
  const GemmRate gemm = gemm_rate(gemm_dtype);
  const double limit_ms = flops / (gemm.wall_gflops * 1e6);
  const double limit_cpu_ms = flops / (gemm.thread_cpu_gflops * 1e6);  // CPU-ms of all threads
  std::printf(
      "%s step on the CPU (fused model, Adam%s%s, %s): %d tower(s), batch %lld (%lld on tower "
      "0), %d threads, gradients %s; load average %.2f before, %.2f after\n",
      model_title(model), model == "resnet" ? ", synchronized batch norm" : "",
      master == "sharded" ? ", sharded master" : ", master on the host", precision_name(precision),
      towers, static_cast<long long>(batch), static_cast<long long>(per_tower), num_threads(),
      first_write == Tape::FirstWrite::Zeroed ? "zero-filled" : "first write assigns", load_before,
      load_average());
  std::printf(
      "trainer step: %.2f ms wall (%.0f images/s), %.2f ms process CPU (%.0f images per "
      "CPU-second)\n\n",
      step_ms, double(batch) * 1000.0 / step_ms, step_cpu_ms, double(batch) * 1000.0 / step_cpu_ms);
  std::printf("%-14s %29s %29s %8s\n", "", "forward: wall ms, CPU ms, share",
              "backward: wall ms, CPU ms, share", "GFLOP/s");
  auto row = [&](const std::string& name, const Times& f, const Times& b, double row_flops) {
    std::printf("%-14s %9.3f %9.3f %8.1f%% %9.3f %9.3f %8.1f%%", name.c_str(), f.wall, f.cpu,
                100.0 * f.cpu / pass.cpu, b.wall, b.cpu, 100.0 * b.cpu / pass.cpu);
    if (row_flops > 0) std::printf(" %8.1f", row_flops / ((f.wall + b.wall) * 1e6));
    std::printf("\n");
  };
  for (const LayerRow& r : rows) {
    row(r.name, r.forward, r.backward,
        (r.forward_flops_per_sample + r.backward_flops_per_sample) * double(per_tower));
  }
  row("loss", loss_forward, loss_backward, 0);
  std::printf(
      "(shares: of tower 0's pass in its thread's CPU time; GFLOP/s: in wall time)\n"
      "tower 0's pass: %.2f ms wall, %.2f ms CPU of its thread; the trainer step beyond it "
      "(split, ring, Adam, copies, waiting): %.2f ms wall\n",
      pass.wall, pass.cpu, step_ms - pass.wall);

  // The same pass by kind of layer, largest first, then the backward by op.
  std::vector<std::pair<std::string, std::pair<Times, Times>>> kinds(by_kind.begin(),
                                                                     by_kind.end());
  kinds.push_back({"loss", {loss_forward, loss_backward}});
  std::sort(kinds.begin(), kinds.end(), [](const auto& a, const auto& b) {
    return a.second.first.cpu + a.second.second.cpu > b.second.first.cpu + b.second.second.cpu;
  });
  std::printf(
      "\nby kind of layer (each scope's own time; a Residual's own is its add and ReLU):\n");
  for (const auto& [kind, t] : kinds) {
    std::printf(
        "%-16s forward %8.3f CPU ms %5.1f%%, backward %8.3f CPU ms %5.1f%%, together %5.1f%%\n",
        kind.c_str(), t.first.cpu, 100.0 * t.first.cpu / pass.cpu, t.second.cpu,
        100.0 * t.second.cpu / pass.cpu, 100.0 * (t.first.cpu + t.second.cpu) / pass.cpu);
  }
  std::vector<std::pair<std::string, Times>> ops(timer.backward_by_op().begin(),
                                                 timer.backward_by_op().end());
  std::sort(ops.begin(), ops.end(),
            [](const auto& a, const auto& b) { return a.second.cpu > b.second.cpu; });
  std::printf("\nbackward by op (the records' ops):\n");
  for (const auto& [op, t] : ops) {
    const Times per = t.per(steps);
    std::printf("%-24s %8.3f CPU ms %5.1f%%\n", op.c_str(), per.cpu, 100.0 * per.cpu / pass.cpu);
  }
  std::printf(
      "\nstep FLOPs %.2f G. GEMM rate (1024^3, %s operands): %.1f GFLOP/s wall on %d threads, "
      "%.1f GFLOP/s per thread in CPU time.\nGEMM-bound limit: %.2f ms wall = %.1f%% of the "
      "step's wall time; %.2f CPU-ms = %.1f%% of the step's process CPU time\n",
      flops / 1e9, dtype_name(gemm_dtype), gemm.wall_gflops, num_threads(), gemm.thread_cpu_gflops,
      limit_ms, 100.0 * limit_ms / step_ms, limit_cpu_ms, 100.0 * limit_cpu_ms / step_cpu_ms);
  return 0;
}
