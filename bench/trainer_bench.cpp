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

// Two trainers of FashionNet on `towers` CPU towers, their steps taken in turn on the
// same batch of `batch` images (so a change of the machine's load meets both alike),
// after one warm-up step each (caches, allocator, the slots): each one's mean step
// time in seconds.
struct Alternated {
  double first_s = 0.0, second_s = 0.0;
};
Alternated alternate_steps(benchmark::State& state, Trainer& first, Trainer& second,
                           std::int64_t batch) {
  Tensor images = Tensor::empty({batch, 1, 28, 28}, Device::cpu());
  random_normal(images, 1, 0, 0.0f, 1.0f, default_stream(Device::cpu()));
  std::vector<float> ids(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % 10);
  Tensor labels = Tensor::from_host<float>(ids, {batch}, default_stream(Device::cpu()));
  first.step({images, labels});
  second.step({images, labels});
  Alternated total;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    first.step({images, labels});
    auto middle = std::chrono::steady_clock::now();
    second.step({images, labels});
    auto end = std::chrono::steady_clock::now();
    total.first_s += std::chrono::duration<double>(middle - start).count();
    total.second_s += std::chrono::duration<double>(end - middle).count();
  }
  const double steps = double(std::max<std::int64_t>(state.iterations(), 1));
  return {total.first_s / steps, total.second_s / steps};
}

TowerFn fashion_net_tower(Sequential& net) {
  return [&net](const Tower& tower, const std::vector<Tensor>& b) {
    Var logits = net(tower.context(), tower.input(b[0]));
    return TowerResult{ag::softmax_cross_entropy(logits, tower.input(b[1])), {}, {}};
  };
}

// Sharded master against the master on the host, alternated. The CPU towers share
// the host, so the sharded update's gain is the update split over the towers'
// threads, less the all-gather's copies that replace the broadcast.
void BM_ShardedVsHostMaster(benchmark::State& state) {
  const int towers = int(state.range(0));
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  TrainerOptions host;
  host.devices.assign(std::size_t(towers), Device::cpu());
  host.master = Device::cpu();
  TrainerOptions sharded = host;
  sharded.master.reset();
  sharded.master_placement = MasterPlacement::Sharded;
  Trainer on_host(vars, fashion_net_tower(net), Optimizer::by_name("adam", 1e-3), host);
  Trainer on_towers(vars, fashion_net_tower(net), Optimizer::by_name("adam", 1e-3), sharded);
  const Alternated t = alternate_steps(state, on_host, on_towers, state.range(1));
  state.counters["host_master_ms"] = 1e3 * t.first_s;
  state.counters["sharded_ms"] = 1e3 * t.second_s;
  state.counters["sharded_over_host"] = t.second_s / std::max(t.first_s, 1e-12);
  state.counters["towers"] = towers;
  // Both trainers took the same steps: the same bits, or the timing compares two
  // different computations.
  if (on_host.master().flat_values().to_host<float>() !=
      on_towers.master().flat_values().to_host<float>()) {
    state.SkipWithError("the sharded master's values differ from the host master's");
  }
}

// The gradient's reduction in bfloat16 contributions against float32
// (TrainerOptions::reduce_dtype), alternated. The counters: each one's mean step
// time, their ratio, and the bytes the towers' ring receives per step by its
// schedule (parallel/ring_allreduce.h, Ring::bytes_received): 8(n-1) per gradient
// value in float32, 6(n-1) in bfloat16 contributions.
void BM_ReduceDtype(benchmark::State& state) {
  const int towers = int(state.range(0));
  VariableSet vars;
  Sequential net = models::fashion_net(vars);
  TrainerOptions fp32;
  fp32.devices.assign(std::size_t(towers), Device::cpu());
  TrainerOptions bf16 = fp32;
  bf16.reduce_dtype = DType::BFloat16;
  Trainer in_fp32(vars, fashion_net_tower(net), Optimizer::by_name("adam", 1e-3), fp32);
  Trainer in_bf16(vars, fashion_net_tower(net), Optimizer::by_name("adam", 1e-3), bf16);
  const Alternated t = alternate_steps(state, in_fp32, in_bf16, state.range(1));
  const double values = double(vars.trainable_numel());
  state.counters["fp32_ms"] = 1e3 * t.first_s;
  state.counters["bf16_ms"] = 1e3 * t.second_s;
  state.counters["bf16_over_fp32"] = t.second_s / std::max(t.first_s, 1e-12);
  state.counters["fp32_ring_bytes"] = 8 * (towers - 1) * values;
  state.counters["bf16_ring_bytes"] = 6 * (towers - 1) * values;
  state.counters["towers"] = towers;
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
BENCHMARK(BM_ReduceDtype)->Args({2, 128})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_FashionNetStep, cuda_sync, Device::cuda(0), BatchNormMode::Sync)->Apply(args);
