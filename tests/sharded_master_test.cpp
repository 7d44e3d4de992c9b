// A sharded master (MasterPlacement::Sharded, parallel/sharded_master.h) takes the
// steps of a master on one device bit for bit: the same towers with the master
// on the host (on a GPU's towers, on their device: the same update kernel) give
// the same losses, outputs, logs, values, moving statistics, optimizer slots and
// step counts, for one to four towers, even and uneven batches (a tower without
// samples still updates its slice), every optimizer with a learning-rate schedule
// and weight decay, synchronized batch norm, gradient buckets and the numeric
// guard. Checkpoints are the same file whichever the placement and resume across
// placements to the same bits. A mis-sliced update is seen as different (the
// control), and misuse is a clear error. On every backend: virtual towers on
// cuda:0, and on two GPUs (cuda:0, cuda:1) where there are two. Across processes:
// tests/sharded_master_processes_test.cpp.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "bn_model.h"
#include "file_test_util.h"
#include "parallel/ring_allreduce.h"
#include "parallel/ring_schedule.h"
#include "sharded_master_case.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

std::string describe(const std::vector<Device>& devices) {
  std::string s = std::to_string(devices.size()) + " towers on";
  for (Device d : devices) s += " " + d.str();
  return s;
}

// The same steps with the master on `master` and sharded: every step's result and
// the state after each step, bit for bit. `adjust` sets the options both share.
void expect_sharded_is_one_device(const VariableSet& vars, const TowerFn& tower_fn,
                                  const NamedOptimizer& optimizer,
                                  const std::vector<Device>& devices, Device master,
                                  const std::vector<std::vector<Tensor>>& batches,
                                  const std::function<void(TrainerOptions&)>& adjust = {}) {
  TrainerOptions one = towers_on(devices, MasterPlacement::OneDevice, master);
  TrainerOptions sharded = towers_on(devices, MasterPlacement::Sharded, std::nullopt);
  if (adjust) {
    adjust(one);
    adjust(sharded);
  }
  Trainer reference(vars, tower_fn, optimizer.make(), one);
  Trainer trainer(vars, tower_fn, optimizer.make(), sharded);
  ASSERT_EQ(trainer.master_placement(), MasterPlacement::Sharded);
  for (std::size_t s = 0; s < batches.size(); ++s) {
    const StepBits expected = step_bits(reference.step(batches[s]));
    EXPECT_TRUE(step_bits(trainer.step(batches[s])) == expected)
        << optimizer.name << ", " << describe(devices) << ", batch of " << batches[s][0].size(0)
        << ", step " << s << ": loss, outputs or logs differ";
    EXPECT_TRUE(state_bits(trainer) == state_bits(reference))
        << optimizer.name << ", " << describe(devices) << ", batch of " << batches[s][0].size(0)
        << ", step " << s << ": values, statistics, gradient, slots or counts differ";
  }
}

TEST(ShardedMaster, EveryOptimizerTakesTheHostMastersStepsBitForBit) {
  Model model;
  for (const NamedOptimizer& optimizer : every_optimizer()) {
    for (int towers = 1; towers <= 4; ++towers) {
      // Even, uneven, and fewer samples than towers (4 towers on 3: tower 3 has none).
      for (std::int64_t batch : {8, 7, 3}) {
        expect_sharded_is_one_device(model.vars, model.tower_fn(), optimizer,
                                     repeat(Device::cpu(), towers), Device::cpu(),
                                     batches_of(batch, 20));
      }
    }
  }
}

TEST(ShardedMaster, SynchronizedBatchNormAndGradientBucketsKeepTheBits) {
  BnModel model;
  for (const NamedOptimizer& optimizer : every_optimizer()) {
    if (std::string(optimizer.name) != "momentum" && std::string(optimizer.name) != "adamw")
      continue;
    for (int towers = 2; towers <= 4; ++towers) {
      for (std::int64_t batch : {8, 7}) {
        expect_sharded_is_one_device(
            model.vars, model.tower_fn(), optimizer, repeat(Device::cpu(), towers), Device::cpu(),
            batches_of(batch, 30), [](TrainerOptions& o) { o.batchnorm = BatchNormMode::Sync; });
        // Small buckets: each bucket's reduce-scatter during the backward.
        expect_sharded_is_one_device(model.vars, model.tower_fn(), optimizer,
                                     repeat(Device::cpu(), towers), Device::cpu(),
                                     batches_of(batch, 40), [](TrainerOptions& o) {
                                       o.batchnorm = BatchNormMode::Sync;
                                       o.batchnorm_stats = BatchNormStats::Tower0;
                                       o.bucket_bytes = 64;
                                     });
      }
    }
  }
}

// Each tower holds the slice the ring's reduce-scatter sums at it, and 1/N of the
// slots; the slices cover the flat buffer once.
TEST(ShardedMaster, TowersHoldTheRingsChunksOfValuesAndSlots) {
  Model model;
  const std::int64_t length = model.vars.trainable_numel();
  for (int towers = 1; towers <= 4; ++towers) {
    Trainer host(
        model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
        towers_on(repeat(Device::cpu(), towers), MasterPlacement::OneDevice, Device::cpu()));
    Trainer sharded(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
                    towers_on(repeat(Device::cpu(), towers), MasterPlacement::Sharded, {}));
    host.step(make_batch(5, 3));
    sharded.step(make_batch(5, 3));
    const auto memory = sharded.master_memory();
    ASSERT_EQ(memory.size(), std::size_t(towers) + 1) << "each tower, and the host copy";
    const RingSchedule schedule(towers, length);
    std::int64_t values = 0, slots = 0;
    for (int k = 0; k < towers; ++k) {
      const auto chunk = schedule.chunk(schedule.summed_at(k));
      EXPECT_EQ(memory[std::size_t(k)].holder, "tower " + std::to_string(k));
      EXPECT_EQ(memory[std::size_t(k)].value_bytes, chunk.size() * 4) << towers << " towers";
      EXPECT_EQ(memory[std::size_t(k)].slot_bytes, 2 * chunk.size() * 4) << "Adam's m and v";
      values += memory[std::size_t(k)].value_bytes;
      slots += memory[std::size_t(k)].slot_bytes;
    }
    const auto one = host.master_memory();
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(values, one[0].value_bytes);
    EXPECT_EQ(slots, one[0].slot_bytes);
    EXPECT_EQ(one[0].slot_bytes, 2 * length * 4);
    // The host copy holds no slots between steps, and the gathered ones until the next.
    EXPECT_EQ(memory.back().holder, "host copy");
    EXPECT_EQ(memory.back().slot_bytes, 0);
    sharded.optimizer();
    EXPECT_EQ(sharded.master_memory().back().slot_bytes, 2 * length * 4);
    sharded.step(make_batch(5, 4));
    EXPECT_EQ(sharded.master_memory().back().slot_bytes, 0);
  }
}

// The guard decides on the whole gradient: each tower checks its slice and the
// first non-finite element of all is the verdict, before any tower updates. Skip
// and Stop behave, and read, as with the master on the host.
TEST(ShardedMaster, TheNumericGuardDecidesAsOneMaster) {
  Model model;
  for (int towers : {1, 2, 3, 4}) {
    std::vector<std::vector<Tensor>> batches = batches_of(7, 60, 4);
    // A NaN in sample 5's image: the last tower's (or the third's) slice of the batch.
    batches[1][0].data<float>()[5 * 64 + 10] = std::numeric_limits<float>::quiet_NaN();
    std::ostringstream host_log, sharded_log;
    expect_sharded_is_one_device(
        model.vars, model.tower_fn(), every_optimizer()[5], repeat(Device::cpu(), towers),
        Device::cpu(), batches, [&](TrainerOptions& o) {
          o.numeric_guard = NumericGuard::Skip;
          o.log = o.master_placement == MasterPlacement::Sharded ? &sharded_log : &host_log;
        });
    EXPECT_NE(host_log.str().find("skipped the step"), std::string::npos) << host_log.str();
    EXPECT_EQ(sharded_log.str(), host_log.str()) << "the same warning, element and value";

    // Stop: the same NumericError, and nothing updated.
    std::string messages[2];
    for (MasterPlacement placement : {MasterPlacement::OneDevice, MasterPlacement::Sharded}) {
      Trainer t(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
                towers_on(repeat(Device::cpu(), towers), placement, Device::cpu()));
      t.step(batches[0]);
      const StateBits before = state_bits(t);
      try {
        t.step(batches[1]);
        ADD_FAILURE() << "a NaN input must stop the step";
      } catch (const NumericError& e) {
        messages[placement == MasterPlacement::Sharded] = e.what();
      }
      const StateBits after = state_bits(t);
      EXPECT_EQ(after.values, before.values);
      EXPECT_EQ(after.slots, before.slots);
      EXPECT_EQ(after.steps, before.steps);
    }
    EXPECT_NE(messages[0].find("averaged gradient of conv1/weight"), std::string::npos)
        << messages[0];
    EXPECT_EQ(messages[1], messages[0]);
  }
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A sharded run saves the one checkpoint any run saves (the slices gathered),
// which resumes with the master on the host, and the reverse, to the bits of the
// uninterrupted run; it restores on another tower count too.
TEST(ShardedMaster, CheckpointsAreTheSameFileAndResumeAcrossPlacements) {
  Model model;
  ScratchDir dir;
  const auto batches = batches_of(7, 70, 5);
  const auto optimizer = every_optimizer()[5];  // adam: two slots, a schedule
  const auto options = [](MasterPlacement placement) {
    return towers_on(repeat(Device::cpu(), 3), placement, Device::cpu());
  };
  Trainer whole(model.vars, model.tower_fn(), optimizer.make(), options(MasterPlacement::Sharded));
  for (const auto& b : batches) whole.step(b);
  const StateBits expected = state_bits(whole);

  for (MasterPlacement saver : {MasterPlacement::Sharded, MasterPlacement::OneDevice}) {
    const MasterPlacement resumer =
        saver == MasterPlacement::Sharded ? MasterPlacement::OneDevice : MasterPlacement::Sharded;
    const std::string path =
        dir.file(saver == MasterPlacement::Sharded ? "sharded.safetensors" : "host.safetensors");
    Trainer first(model.vars, model.tower_fn(), optimizer.make(), options(saver));
    for (int s = 0; s < 2; ++s) first.step(batches[std::size_t(s)]);
    first.save_state(path, {{"epoch", "1"}});
    Trainer resumed(model.vars, model.tower_fn(), optimizer.make(), options(resumer));
    resumed.restore_state(path);
    // The gradient is the last step's, which a checkpoint does not hold.
    StateBits restored = state_bits(resumed), saved = state_bits(first);
    restored.gradient = saved.gradient = {};
    EXPECT_TRUE(restored == saved) << "restored whole";
    for (std::size_t s = 2; s < batches.size(); ++s) resumed.step(batches[s]);
    EXPECT_TRUE(state_bits(resumed) == expected)
        << "saved " << (saver == MasterPlacement::Sharded ? "sharded" : "on the host")
        << ", resumed the other way: the uninterrupted run's bits";
  }
  EXPECT_EQ(file_bytes(dir.file("sharded.safetensors")), file_bytes(dir.file("host.safetensors")))
      << "the same checkpoint, byte for byte, whichever the placement";

  // Another layout: four sharded towers, and one tower, restore the same values.
  for (int towers : {4, 1}) {
    Trainer other(model.vars, model.tower_fn(), optimizer.make(),
                  towers_on(repeat(Device::cpu(), towers), MasterPlacement::Sharded, {}));
    other.restore_state(dir.file("sharded.safetensors"));
    Trainer saved(model.vars, model.tower_fn(), optimizer.make(),
                  options(MasterPlacement::Sharded));
    saved.restore_state(dir.file("sharded.safetensors"));
    const StateBits a = state_bits(other), b = state_bits(saved);
    EXPECT_EQ(a.values, b.values) << towers << " towers";
    EXPECT_EQ(a.slots, b.slots) << towers << " towers";
    EXPECT_EQ(a.steps, b.steps);
    EXPECT_FALSE(other.step(batches[2]).skipped);
  }
}

// Writes to master() reach the slices at broadcast(), as a load_checkpoint does.
TEST(ShardedMaster, WritesToTheMasterReachTheSlicesAtBroadcast) {
  Model model;
  Trainer t(model.vars, model.tower_fn(), Optimizer::by_name("momentum", 0.1),
            towers_on(repeat(Device::cpu(), 3), MasterPlacement::Sharded, {}));
  t.step(make_batch(6, 1));
  fill(t.master().value("fc/bias"), 0.25, cpu());
  t.broadcast();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(t.replica(i).value("fc/bias").to_host<float>(), std::vector<float>(3, 0.25f));
  }
  t.step(make_batch(6, 2));  // the slices hold the write: the update starts from it
  EXPECT_NE(t.master().value("fc/bias").to_host<float>(), std::vector<float>(3, 0.25f));
  EXPECT_EQ(t.replica(2).flat_values().to_host<float>(), t.master().flat_values().to_host<float>());
}

// A trace shows each tower's reduce-scatter steps, the guard's check of its slice,
// its update and its all-gather steps, on its own row.
TEST(ShardedMaster, TheTraceShowsEachTowersThreeParts) {
  Model model;
  Trainer t(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
            towers_on(repeat(Device::cpu(), 3), MasterPlacement::Sharded, {}));
  Trace trace;
  t.set_trace(&trace);
  t.step(make_batch(6, 1));
  const auto events = nlohmann::json::parse(trace.json())["traceEvents"];
  std::map<std::string, std::set<int>> rows;  // span name: the rows it is on
  for (const auto& e : events) {
    if (e.value("ph", "") == "X") rows[e["name"].get<std::string>()].insert(e["tid"].get<int>());
  }
  for (const char* name : {"reduce-scatter 0", "reduce-scatter 1", "guard", "update slice",
                           "all-gather 0", "all-gather 1"}) {
    EXPECT_EQ(rows[name], (std::set<int>{0, 1, 2})) << name;
  }
  EXPECT_EQ(rows.count("update + broadcast"), 0u) << "no master's update";
}

// The control: slices updated where they belong give the whole buffer's update
// bit for bit, and one slice updated from its neighbour's gradient (mis-sliced by
// one element) is seen as different by the same comparison.
TEST(ShardedMaster, AMisSlicedUpdateIsSeenAsDifferent) {
  const std::int64_t length = 1001;
  const auto values = random_values(std::size_t(length), 5);
  const auto grads = random_values(std::size_t(length) + 1, 6);
  VariableSet layout;
  layout.get("w", {length}, Initializer::zeros());
  const auto update = [&](std::int64_t shift) {
    Tensor p = Tensor::from_host<float>(values, {length}, cpu());
    Tensor g = Tensor::from_host<float>(grads, {length + 1}, cpu());
    const RingSchedule schedule(3, length);
    for (std::int64_t k = 0; k < 3; ++k) {
      const RingRange r = schedule.chunk(schedule.summed_at(k));
      Optimizer o = Optimizer::by_name("adam", 1e-2);
      const std::int64_t s = k == 1 ? shift : 0;  // tower 1 reads shifted
      o.step(layout, r.begin, p.slice(r.begin, r.end), g.slice(r.begin + s, r.end + s), cpu());
    }
    return bits(p);
  };
  Tensor p = Tensor::from_host<float>(values, {length}, cpu());
  Tensor g = Tensor::from_host<float>(grads, {length + 1}, cpu());
  Optimizer::by_name("adam", 1e-2).step(layout, 0, p, g.slice(0, length), cpu());
  EXPECT_EQ(update(0), bits(p)) << "slices in place: the whole update's bits";
  EXPECT_NE(update(1), bits(p)) << "mis-sliced by one: different bits";
}

TEST(ShardedMaster, MisuseIsAClearError) {
  Model model;
  TrainerOptions o = towers_on(repeat(Device::cpu(), 2), MasterPlacement::Sharded, {});
  o.master = Device::cpu();
  EXPECT_THROW_WITH(Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), o),
                    InvalidArgument, "leave master unset");
  o.master.reset();
  o.reduction = AllReduce::ReduceToOne;
  EXPECT_THROW_WITH(Trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), o),
                    InvalidArgument, "needs AllReduce::Ring");
}

// On every backend: virtual towers of the backend's device, and two GPUs where
// there are two (the emulated GPUs have two). A GPU's towers update on the GPU, so
// the reference is the master on their device (the same kernel); on the CPU, the host.
class ShardedMasterBackendTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(ShardedMasterBackendTest);

TEST_P(ShardedMasterBackendTest, VirtualTowersAndTwoDevicesTakeTheOneDeviceSteps) {
  Model model;
  BnModel bn_model;
  std::vector<std::vector<Device>> layouts{repeat(device(), 2), repeat(device(), 3)};
  if (device().is_cuda() && cuda_device_count() >= 2) {
    layouts.push_back({Device::cuda(0), Device::cuda(1)});
  }
  // Under a sanitizer the emulated GPUs' streams are host threads it shadows (as in
  // tests/trainer_test.cpp): two layouts and three optimizers stand for the rest.
  const bool sanitized_gpu = kThreadSanitizer && kEmulatedGpus && device().is_cuda();
  if (sanitized_gpu) layouts.erase(layouts.begin() + 1);
  for (const auto& devices : layouts) {
    for (const NamedOptimizer& optimizer : every_optimizer()) {
      const std::string name = optimizer.name;
      if (sanitized_gpu && name != "nesterov" && name != "rmsprop centered" && name != "adamw")
        continue;
      for (std::int64_t batch : {7, 2}) {
        expect_sharded_is_one_device(model.vars, model.tower_fn(), optimizer, devices, devices[0],
                                     batches_of(batch, 80, 2));
      }
    }
    expect_sharded_is_one_device(bn_model.vars, bn_model.tower_fn(), every_optimizer()[5], devices,
                                 devices[0], batches_of(7, 90, 2),
                                 [](TrainerOptions& o) { o.batchnorm = BatchNormMode::Sync; });
  }
}

// The ring's halves: the reduce-scatter leaves member j the all-reduce's sum of
// chunk summed_at(j), bit for bit, and the all-gather then gives every member the
// all-reduce's result; short chunks (on the caller's thread) and long ones (a
// thread per member on the host).
TEST_P(ShardedMasterBackendTest, TheRingsHalvesGiveTheAllReducesBits) {
  for (int n : {2, 3, 4}) {
    for (std::int64_t length : {std::int64_t(7), std::int64_t(3 * 20000 + 5)}) {
      std::vector<std::unique_ptr<Stream>> streams;
      std::vector<const Stream*> members;
      std::vector<Tensor> whole, halves;
      for (int k = 0; k < n; ++k) {
        streams.push_back(std::make_unique<Stream>(device()));
        members.push_back(streams.back().get());
        const auto values = random_values(std::size_t(length), 10 + unsigned(k));
        whole.push_back(Tensor::from_host<float>(values, {length}, *streams.back()));
        halves.push_back(Tensor::from_host<float>(values, {length}, *streams.back()));
      }
      Ring ring(members);
      ring.allreduce(whole);
      ring.reduce_scatter_range(halves, 0, length);
      for (auto& s : streams) s->synchronize();
      const RingSchedule schedule(n, length);
      for (int j = 0; j < n; ++j) {
        const RingRange r = schedule.chunk(schedule.summed_at(j));
        EXPECT_EQ(bits(halves[std::size_t(j)].slice(r.begin, r.end)),
                  bits(whole[std::size_t(j)].slice(r.begin, r.end)))
            << n << " members, " << length << " values, member " << j;
      }
      ring.all_gather(halves);
      for (auto& s : streams) s->synchronize();
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(bits(halves[std::size_t(j)]), bits(whole[std::size_t(j)]))
            << n << " members, " << length << " values, member " << j;
      }
    }
  }
}

TEST_P(ShardedMasterBackendTest, ACheckpointSavedShardedResumesOnTheHost) {
  Model model;
  ScratchDir dir;
  const auto batches = batches_of(7, 100, 4);
  const std::vector<Device> devices = repeat(device(), 2);
  Trainer sharded(model.vars, model.tower_fn(), Optimizer::by_name("adamw", 1e-2),
                  towers_on(devices, MasterPlacement::Sharded, {}));
  for (int s = 0; s < 2; ++s) sharded.step(batches[std::size_t(s)]);
  sharded.save_state(dir.file("state.safetensors"));
  Trainer on_host(model.vars, model.tower_fn(), Optimizer::by_name("adamw", 1e-2),
                  towers_on(repeat(Device::cpu(), 1), MasterPlacement::OneDevice, Device::cpu()));
  on_host.restore_state(dir.file("state.safetensors"));
  const StateBits a = state_bits(on_host), b = state_bits(sharded);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.slots, b.slots);
  EXPECT_EQ(a.steps, 2);
}

}  // namespace
}  // namespace towerlab::testing
