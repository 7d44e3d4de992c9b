// What gradient buckets buy (TrainerOptions::bucket_bytes, parallel/buckets.h):
// the step time of a model with several large layers, unbucketed (the gradient
// reduced after the backward) against bucketed (each bucket reduced, within the
// process and across processes, while the backward of earlier layers goes on).
// The two contenders alternate in rounds within one run, so that a machine's
// changing load falls on both alike; each reports the median and the best of its
// rounds' mean step times. It checks itself: both contenders train the same model
// from the same start on the same batches, and their final values must be equal
// bit for bit (exit 1 otherwise).
//
// A collective program, not a Google Benchmark (every rank must run the same
// steps). Alone, or under mpirun with the ranks' towers on host threads:
//
//   build/cpu/bench/bucket_overlap_bench --towers 2
//   mpirun -np 2 build/cpu/bench/bucket_overlap_bench                # shared memory
//   mpirun -np 2 --mca btl self,tcp build/cpu/bench/bucket_overlap_bench
//
// Options: --towers N (per process, 1), --batch B (global, 64), --width W (1024),
// --layers L (hidden layers of W x W, 4), --bucket-mib M (4), --rounds R (6),
// --steps S (per round, 3), --threads T (kernel threads per process: the cores
// divided among the processes of the host by default, so that ranks on one machine
// do not oversubscribe it).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "parallel/buckets.h"
#include "towerlab.h"

namespace {

using namespace towerlab;
using Clock = std::chrono::steady_clock;

struct Options {
  int towers = 1;
  std::int64_t batch = 64, width = 1024;
  int layers = 4;
  double bucket_mib = 4.0;
  int rounds = 6, steps = 3;
  int threads = 0;  // 0: the host's cores / processes on the host
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const char* value = argv[i + 1];
    if (key == "--towers") {
      o.towers = std::atoi(value);
    } else if (key == "--batch") {
      o.batch = std::atoll(value);
    } else if (key == "--width") {
      o.width = std::atoll(value);
    } else if (key == "--layers") {
      o.layers = std::atoi(value);
    } else if (key == "--bucket-mib") {
      o.bucket_mib = std::atof(value);
    } else if (key == "--rounds") {
      o.rounds = std::atoi(value);
    } else if (key == "--steps") {
      o.steps = std::atoi(value);
    } else if (key == "--threads") {
      o.threads = std::atoi(value);
    } else {
      std::fprintf(stderr, "bucket_overlap_bench: unknown option %s\n", key.c_str());
      std::exit(2);
    }
  }
  return o;
}

// A multilayer perceptron: `layers` hidden layers of width x width, then 10 classes.
struct Mlp {
  VariableSet vars;
  Sequential net;
  explicit Mlp(const Options& o) {
    for (int l = 0; l < o.layers; ++l) {
      net.add<Linear>(vars, "fc" + std::to_string(l), o.width, o.width);
      net.add<ReLU>();
    }
    net.add<Linear>(vars, "logits", o.width, 10);
  }
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Var logits = net(tower.context(), tower.input(batch[0]));
      return TowerResult{ag::softmax_cross_entropy(logits, tower.input(batch[1])), {}, {}};
    };
  }
};

struct Contender {
  const char* name;
  std::unique_ptr<Trainer> trainer;
  std::vector<double> round_ms;  // mean step time of each round
};

// What overlap can hide at most: the mean time of the whole gradient's reduction
// alone, the towers' ring and then the processes' all-reduce, as an unbucketed
// step makes it after the backward.
double reduction_ms(Cluster& cluster, int towers, std::int64_t numel) {
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<const Stream*> members;
  std::vector<Tensor> buffers;
  for (int i = 0; i < towers; ++i) {
    streams.push_back(std::make_unique<Stream>(Device::cpu()));
    members.push_back(streams.back().get());
    buffers.push_back(Tensor::zeros({numel}, *streams.back()));
  }
  Ring ring(members);
  Tensor host = Tensor::zeros({numel}, default_stream(Device::cpu()));
  auto reduce = [&] {
    ring.allreduce(buffers);
    cluster.allreduce_sum(std::span<float>(host.data<float>(), std::size_t(numel)),
                          "bench: the reduction alone");
  };
  reduce();
  const int calls = 5;
  const auto start = Clock::now();
  for (int k = 0; k < calls; ++k) reduce();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count() / calls;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  Cluster cluster;  // a group of one without mpirun
  set_num_threads(
      o.threads > 0 ? o.threads
                    : std::max(1, int(std::thread::hardware_concurrency()) / cluster.local_size()));
  Mlp mlp(o);
  const Stream& host = default_stream(Device::cpu());
  Tensor images = Tensor::empty({o.batch, o.width}, Device::cpu());
  random_normal(images, 1, 0, 0.0f, 1.0f, host);
  std::vector<float> labels;
  for (std::int64_t i = 0; i < o.batch; ++i) labels.push_back(float(i % 10));
  const std::vector<Tensor> batch{images, Tensor::from_host<float>(labels, {o.batch}, host)};

  const auto bucket_bytes = std::int64_t(o.bucket_mib * 1024 * 1024);
  std::vector<Contender> contenders;
  for (const auto& [name, bytes] :
       {std::pair{"unbucketed", std::int64_t(0)}, std::pair{"bucketed", bucket_bytes}}) {
    TrainerOptions options;
    options.devices.assign(std::size_t(o.towers), Device::cpu());
    options.process_group = &cluster;
    options.bucket_bytes = bytes;
    options.seed = 7;
    contenders.push_back({name,
                          std::make_unique<Trainer>(mlp.vars, mlp.tower_fn(),
                                                    Optimizer::by_name("sgd", 0.01), options),
                          {}});
  }
  const std::int64_t gradient_bytes = mlp.vars.trainable_numel() * std::int64_t(sizeof(float));
  const std::size_t buckets = make_buckets(mlp.vars, bucket_bytes).size();
  if (cluster.rank() == 0) {
    std::printf(
        "%d process(es) x %d tower(s) on the CPU, %d kernel thread(s) each; MLP %d x [%lld x %lld] "
        "+ %lld x 10, gradient "
        "%.1f MiB; global batch %lld; bucketed: %zu buckets of >= %.1f MiB; %d rounds x %d "
        "steps, contenders alternating\n",
        cluster.size(), o.towers, num_threads(), o.layers, (long long)o.width, (long long)o.width,
        (long long)o.width, double(gradient_bytes) / (1 << 20), (long long)o.batch, buckets,
        o.bucket_mib, o.rounds, o.steps);
  }
  for (Contender& c : contenders) c.trainer->step(batch);  // warm-up: allocations, pages
  for (int round = 0; round < o.rounds; ++round) {
    for (Contender& c : contenders) {
      const auto start = Clock::now();
      for (int s = 0; s < o.steps; ++s) c.trainer->step(batch);
      c.round_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count() /
                           o.steps);
    }
  }
  const double base = median(contenders[0].round_ms);
  const double alone = reduction_ms(cluster, o.towers, mlp.vars.trainable_numel());
  if (cluster.rank() == 0) {
    std::printf("the reduction alone (what overlap can hide at most): %.2f ms\n", alone);
    std::printf("%-12s %12s %10s %10s\n", "contender", "median ms", "best ms", "vs unbucketed");
    for (const Contender& c : contenders) {
      const double m = median(c.round_ms);
      std::printf("%-12s %12.2f %10.2f %10.3f\n", c.name, m,
                  *std::min_element(c.round_ms.begin(), c.round_ms.end()), m / base);
    }
  }
  // Both took the same steps on the same batches: the same bits.
  const auto a = contenders[0].trainer->master().flat_values().to_host<float>();
  const auto b = contenders[1].trainer->master().flat_values().to_host<float>();
  if (a != b) {
    std::fprintf(stderr, "bucket_overlap_bench: rank %d: bucketed and unbucketed differ\n",
                 cluster.rank());
    return 1;
  }
  return 0;
}
