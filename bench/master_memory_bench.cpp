// What each device holds for each master placement (parallel/trainer.h's
// master_memory(), docs/master_placement.md): FashionNet, the MLP and ResNet-20 of
// models/, on 1, 2 and 4 towers, with the master on the host, on tower 0's device
// or sharded over the towers, Adam's two slots. One iteration each: the trainer is
// built and takes two steps of 4 samples per tower; the counters are bytes.
//   tower0_values, tower0_slots  the master's slice on tower 0 (sharded), or 0
//   master_values, master_slots  the master on one device, or (sharded) the host copy
//   peak_<device>                the device allocator's peak in-use bytes while the
//                                trainer was built and stepped (MemoryStats::
//                                peak_in_use_bytes, reset first): replicas,
//                                gradients, activations and the master together
// On CUDA towers the towers are cuda:0 .. cuda:N-1 (N devices needed; on the emulated
// GPUs set TOWERLAB_EMULATED_GPUS=4). The peak is the allocator's own count, the code
// that runs on a GPU; with TOWERLAB_EXACT_ALLOCATIONS=1 every tensor is its own
// segment of exactly the requested bytes, so the peak is the bytes requested (a
// caching run counts blocks rounded up), and every free waits for the device: slow.
// same_loss is 1 when the last step's loss equals the first placement's of the same
// model, towers and device kind bit for bit (the placements took the same steps).
#include <benchmark/benchmark.h>

#include <map>
#include <string>
#include <tuple>

#include "bench_util.h"

#include "models/fashion_net.h"
#include "models/mlp.h"
#include "models/resnet.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

enum ModelKind { kFashionNet, kMlp, kResNet };
enum Placement { kHost, kTowerDevice, kSharded };

Sequential make_model(ModelKind kind, VariableSet& vars) {
  if (kind == kMlp) return models::mlp(vars);
  if (kind == kResNet) return models::resnet(vars);
  return models::fashion_net(vars);
}

// The last step's loss of the first placement run, by model, towers and device kind.
std::map<std::tuple<int, int, bool>, double>& last_losses() {
  static std::map<std::tuple<int, int, bool>, double> losses;
  return losses;
}

void BM_MasterMemory(benchmark::State& state, Device kind) {
  if (bench::skip_without(kind, state)) return;
  const auto model_kind = ModelKind(state.range(0));
  const int towers = int(state.range(1));
  const auto placement = Placement(state.range(2));
  if (kind.is_cuda() && cuda_device_count() < towers) {
    state.SkipWithError("fewer CUDA devices than towers");
    return;
  }
  TrainerOptions options;
  options.devices.clear();
  for (int i = 0; i < towers; ++i) {
    options.devices.push_back(kind.is_cuda() ? Device::cuda(i) : Device::cpu());
  }
  if (placement == kHost) options.master = Device::cpu();
  if (placement == kTowerDevice) options.master = options.devices.front();
  if (placement == kSharded) options.master_placement = MasterPlacement::Sharded;
  std::vector<Device> watched{Device::cpu()};
  if (kind.is_cuda()) watched = options.devices;
  const std::int64_t batch = 4 * towers;
  Tensor images = Tensor::empty({batch, 1, 28, 28}, Device::cpu());
  random_normal(images, 1, 0, 0.0f, 1.0f, default_stream(Device::cpu()));
  std::vector<float> ids(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % 10);
  Tensor labels = Tensor::from_host<float>(ids, {batch}, default_stream(Device::cpu()));
  for (auto _ : state) {
    VariableSet vars;
    Sequential net = make_model(model_kind, vars);
    TowerFn fn = [&net](const Tower& tower, const std::vector<Tensor>& b) {
      Var logits = net(tower.context(), tower.input(b[0]));
      return TowerResult{ag::softmax_cross_entropy(logits, tower.input(b[1])), {}, {}};
    };
    for (Device d : watched) device_allocator(d).reset_peak();
    Trainer trainer(vars, fn, Optimizer::by_name("adam", 1e-3), options);
    trainer.step({images, labels});
    const double loss = trainer.step({images, labels}).loss;
    for (const Trainer::MasterMemory& m : trainer.master_memory()) {
      const bool tower0 = m.holder == "tower 0";
      state.counters[tower0 ? "tower0_values" : "master_values"] = double(m.value_bytes);
      state.counters[tower0 ? "tower0_slots" : "master_slots"] = double(m.slot_bytes);
    }
    for (Device d : watched) {
      state.counters["peak_" + d.str()] = double(device_allocator(d).stats().peak_in_use_bytes);
    }
    state.counters["parameters"] = double(vars.trainable_numel());
    const auto key = std::make_tuple(int(model_kind), towers, kind.is_cuda());
    const auto it = last_losses().emplace(key, loss).first;
    state.counters["same_loss"] = it->second == loss ? 1.0 : 0.0;
  }
  static const char* const models[] = {"FashionNet", "MLP", "ResNet-20"};
  static const char* const placements[] = {"master on the host", "master on tower 0's device",
                                           "sharded"};
  state.SetLabel(std::string(models[model_kind]) + ", " + placements[placement]);
}

void args(benchmark::internal::Benchmark* b) {
  for (int model : {kFashionNet, kMlp, kResNet}) {
    for (int towers : {1, 2, 4}) {
      for (int placement : {kHost, kTowerDevice, kSharded}) b->Args({model, towers, placement});
    }
  }
  b->Iterations(1)->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_CAPTURE(BM_MasterMemory, cpu, Device::cpu())->Apply(args);
BENCHMARK_CAPTURE(BM_MasterMemory, cuda, Device::cuda(0))->Apply(args);
