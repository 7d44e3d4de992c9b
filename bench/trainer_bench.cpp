// Training step time of FashionNet for 1 to 4 towers on virtual devices (several
// towers on one CPU or one GPU), with the total batch fixed: the difference from one
// tower is the overhead of the towers (the split, per-tower launches and the ring).
// images/s is reported as the items-processed rate.
//
// Wall-clock time, not bench::time_calls' CUDA events: a step runs on the towers'
// own streams and threads and waits for the GPU itself (it reads the loss and checks
// the gradient on the host), so the host's time per step is the step's time.
#include <benchmark/benchmark.h>

#include <chrono>

#include "bench_util.h"

#include "models/fashion_net.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

void BM_FashionNetStep(benchmark::State& state, Device device, BatchNormMode mode) {
  if (bench::skip_without(device, state)) return;
  const int towers = int(state.range(0));
  const std::int64_t batch = state.range(1);
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  TowerFn fn = [&net](const Tower& tower, const std::vector<Tensor>& b) {
    Var logits = net(tower.context(), tower.input(b[0]));
    return TowerResult{ag::softmax_cross_entropy(logits, tower.input(b[1])), {}, {}};
  };
  TrainerOptions options;
  options.devices.assign(std::size_t(towers), device);
  options.master = device;
  options.batchnorm = mode;
  Trainer trainer(vars, fn, Optimizer::by_name("adam", 1e-3), options);
  Tensor images = Tensor::empty({batch, 1, 28, 28}, Device::cpu());
  random_normal(images, 1, 0, 0.0f, 1.0f, default_stream(Device::cpu()));
  std::vector<float> ids(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % 10);
  Tensor labels = Tensor::from_host<float>(ids, {batch}, default_stream(Device::cpu()));
  trainer.step({images, labels});  // warm-up: caches, allocator
  for (auto _ : state) trainer.step({images, labels});
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["towers"] = towers;
}

// Sharded master against the master on the host, the two trainers' steps taken in
// turn on the same batch (so a change of the machine's load meets both alike): the
// counters are each one's mean step time, and their ratio. The CPU towers share
// the host, so the sharded update's gain is the update split over the towers'
// threads, less the all-gather's copies that replace the broadcast.
void BM_ShardedVsHostMaster(benchmark::State& state) {
  const int towers = int(state.range(0));
  const std::int64_t batch = state.range(1);
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  TowerFn fn = [&net](const Tower& tower, const std::vector<Tensor>& b) {
    Var logits = net(tower.context(), tower.input(b[0]));
    return TowerResult{ag::softmax_cross_entropy(logits, tower.input(b[1])), {}, {}};
  };
  TrainerOptions host;
  host.devices.assign(std::size_t(towers), Device::cpu());
  host.master = Device::cpu();
  TrainerOptions sharded = host;
  sharded.master.reset();
  sharded.master_placement = MasterPlacement::Sharded;
  Trainer on_host(vars, fn, Optimizer::by_name("adam", 1e-3), host);
  Trainer on_towers(vars, fn, Optimizer::by_name("adam", 1e-3), sharded);
  Tensor images = Tensor::empty({batch, 1, 28, 28}, Device::cpu());
  random_normal(images, 1, 0, 0.0f, 1.0f, default_stream(Device::cpu()));
  std::vector<float> ids(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % 10);
  Tensor labels = Tensor::from_host<float>(ids, {batch}, default_stream(Device::cpu()));
  on_host.step({images, labels});  // warm-up: caches, allocator, the slots
  on_towers.step({images, labels});
  double host_s = 0.0, sharded_s = 0.0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    on_host.step({images, labels});
    auto middle = std::chrono::steady_clock::now();
    on_towers.step({images, labels});
    auto end = std::chrono::steady_clock::now();
    host_s += std::chrono::duration<double>(middle - start).count();
    sharded_s += std::chrono::duration<double>(end - middle).count();
  }
  const double steps = double(std::max<std::int64_t>(state.iterations(), 1));
  state.counters["host_master_ms"] = 1e3 * host_s / steps;
  state.counters["sharded_ms"] = 1e3 * sharded_s / steps;
  state.counters["sharded_over_host"] = sharded_s / std::max(host_s, 1e-12);
  state.counters["towers"] = towers;
  // Both trainers took the same steps: the same bits, or the timing compares two
  // different computations.
  if (on_host.master().flat_values().to_host<float>() !=
      on_towers.master().flat_values().to_host<float>()) {
    state.SkipWithError("the sharded master's values differ from the host master's");
  }
}

void args(benchmark::internal::Benchmark* b) {
  for (int towers : {1, 2, 3, 4}) b->Args({towers, 128});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_CAPTURE(BM_FashionNetStep, cpu_local, Device::cpu(), BatchNormMode::Local)->Apply(args);
BENCHMARK_CAPTURE(BM_FashionNetStep, cpu_sync, Device::cpu(), BatchNormMode::Sync)->Apply(args);
BENCHMARK_CAPTURE(BM_FashionNetStep, cuda_local, Device::cuda(0), BatchNormMode::Local)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int towers : {1, 2, 3, 4}) {
        b->Args({towers, 128});
        b->Args({towers, 512});
      }
      b->UseRealTime()->Unit(benchmark::kMillisecond);
    });
BENCHMARK(BM_ShardedVsHostMaster)
    ->Args({2, 128})
    ->Args({2, 512})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_FashionNetStep, cuda_sync, Device::cuda(0), BatchNormMode::Sync)->Apply(args);
