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
// cuda:0, and on two GPUs (cuda:0, cuda:1) where there are two. Across 2 and 3
// processes (threads, tests/thread_process_group.h) of 1 or 2 towers, the job's
// towers own a slice each and take the host master's steps across the same
// processes bit for bit; another layout is seen as different (the control).
#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "bn_model.h"
#include "cnn_model.h"
#include "file_test_util.h"
#include "parallel/ring_allreduce.h"
#include "parallel/ring_schedule.h"
#include "parallel/sharded_master.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

// tests/cnn_model.h with an L2 term and a logged data loss.
struct Model : CnnModel {
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Context ctx = tower.context();
      Var logits = net(ctx, tower.input(batch[0], "images"));
      Var loss = ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels"));
      Var total = ag::add_n({loss, l2_regularization(ctx, 1e-3)});
      return TowerResult{total, {logits}, {{"data_loss", loss}}};
    };
  }
};

std::vector<Tensor> make_batch(std::int64_t n, unsigned seed) {
  return small_image_batch(n, seed, 7);
}

// Every optimizer, with a schedule and weight decay where it has them.
struct NamedOptimizer {
  const char* name;
  std::function<Optimizer()> make;
};

std::vector<NamedOptimizer> every_optimizer() {
  return {
      {"sgd",
       [] { return Optimizer::sgd({.weight_decay = 1e-3}, LearningRate::step(0.1, 2, 0.5)); }},
      {"momentum", [] { return Optimizer::sgd({.momentum = 0.9}, LearningRate::constant(0.05)); }},
      {"nesterov",
       [] {
         return Optimizer::sgd({.momentum = 0.9, .weight_decay = 1e-3, .nesterov = true},
                               LearningRate::cosine(0.05, 4));
       }},
      {"rmsprop", [] { return Optimizer::rmsprop({}, LearningRate::constant(1e-2)); }},
      {"rmsprop centered",
       [] {
         return Optimizer::rmsprop({.momentum = 0.5, .centered = true},
                                   LearningRate::step(1e-2, 2, 0.5));
       }},
      {"adam",
       [] { return Optimizer::adam({.weight_decay = 1e-3}, LearningRate::cosine(1e-2, 4, 1e-3)); }},
      {"adamw",
       [] { return Optimizer::adamw({.weight_decay = 0.01}, LearningRate::constant(1e-2)); }},
  };
}

// A float tensor's bits (== on floats would take -0 for 0 and refuse NaN).
std::vector<std::uint32_t> bits(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return {};
  const std::vector<float> host = t.to_host<float>(default_stream(t.device()));
  std::vector<std::uint32_t> out(host.size());
  std::memcpy(out.data(), host.data(), host.size() * sizeof(float));
  return out;
}

std::uint64_t bits(double d) {
  std::uint64_t out;
  std::memcpy(&out, &d, sizeof d);
  return out;
}

// What a step returns.
struct StepBits {
  std::uint64_t loss;
  std::vector<std::vector<std::uint32_t>> outputs;
  std::map<std::string, std::uint64_t> logs;
  bool skipped;
  bool operator==(const StepBits&) const = default;
};

StepBits step_bits(const StepResult& r) {
  StepBits b{bits(r.loss), {}, {}, r.skipped};
  for (const Tensor& o : r.outputs) b.outputs.push_back(bits(o));
  for (const auto& [name, v] : r.logs) b.logs[name] = bits(v);
  return b;
}

// Everything a trainer holds that the placement must not change.
struct StateBits {
  std::vector<std::uint32_t> values, state, gradient;
  std::map<std::string, std::vector<std::uint32_t>> slots;
  std::int64_t steps;
  std::uint64_t lr;
  std::int64_t skipped;
  bool operator==(const StateBits&) const = default;
};

// `with_gradient` false: across processes a sharded trainer's gradients() holds
// the sums of its own slices only (Trainer::gradients()).
StateBits state_bits(Trainer& t, bool with_gradient = true) {
  StateBits s{bits(t.master().flat_values()),
              bits(t.master().flat_state()),
              with_gradient ? bits(t.gradients()) : std::vector<std::uint32_t>{},
              {},
              t.optimizer().steps(),
              bits(t.optimizer().current_lr()),
              t.skipped_steps()};
  for (const auto& [name, slot] : t.optimizer().slots()) s.slots[name] = bits(slot);
  // Every replica holds the master's values and moving statistics.
  for (std::size_t i = 0; i < t.num_towers(); ++i) {
    EXPECT_EQ(bits(t.replica(i).flat_values()), s.values) << "replica " << i;
    EXPECT_EQ(bits(t.replica(i).flat_state()), s.state) << "replica " << i << " statistics";
  }
  return s;
}

TrainerOptions towers_on(const std::vector<Device>& devices, MasterPlacement placement,
                         std::optional<Device> master) {
  TrainerOptions o;
  o.devices = devices;
  o.seed = 11;
  o.master_placement = placement;
  if (placement == MasterPlacement::OneDevice) o.master = master;
  return o;
}

std::vector<Device> repeat(Device d, int n) {
  return std::vector<Device>(std::size_t(n), d);
}

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

std::vector<std::vector<Tensor>> batches_of(std::int64_t n, unsigned seed, int steps = 3) {
  std::vector<std::vector<Tensor>> all;
  for (int s = 0; s < steps; ++s) all.push_back(make_batch(n, seed + unsigned(s)));
  return all;
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

// A trace shows each tower's reduce-scatter steps, its update and its all-gather
// steps, on its own row.
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
  for (const char* name :
       {"reduce-scatter 0", "reduce-scatter 1", "update slice", "all-gather 0", "all-gather 1"}) {
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

// --- across processes (host-staged) -------------------------------------------

// What each rank's steps returned and its state after each step.
struct JobBits {
  std::vector<StepBits> steps;
  std::vector<StateBits> states;
};

// A job of `ranks` processes (threads, tests/thread_process_group.h) of `towers`
// CPU towers each, every process given the same global batches.
std::vector<JobBits> run_job(const VariableSet& vars, const TowerFn& tower_fn,
                             const NamedOptimizer& optimizer, int ranks, int towers,
                             MasterPlacement placement,
                             const std::vector<std::vector<Tensor>>& batches,
                             const std::function<void(TrainerOptions&)>& adjust = {}) {
  std::vector<JobBits> job(static_cast<std::size_t>(ranks));
  const auto errors = run_ranks(ranks, [&](int rank, ProcessGroup& group) {
    TrainerOptions o = towers_on(repeat(Device::cpu(), towers), placement, Device::cpu());
    o.process_group = &group;
    if (adjust) adjust(o);
    Trainer t(vars, tower_fn, optimizer.make(), o);
    JobBits& mine = job[std::size_t(rank)];
    for (const auto& batch : batches) {
      mine.steps.push_back(step_bits(t.step(batch)));
      // Read before optimizer() gathers anything: what rank 0 alone may read.
      const std::int64_t steps = t.steps();
      const double rate = t.learning_rate();
      mine.states.push_back(state_bits(t, placement == MasterPlacement::OneDevice));
      EXPECT_EQ(steps, mine.states.back().steps);
      EXPECT_EQ(bits(rate), mine.states.back().lr);
    }
  });
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
  return job;
}

// The same job with the master on the host and sharded: every rank's every step
// and state, bit for bit.
void expect_sharded_job_is_host_job(const VariableSet& vars, const TowerFn& tower_fn,
                                    const NamedOptimizer& optimizer, int ranks, int towers,
                                    const std::vector<std::vector<Tensor>>& batches,
                                    const std::function<void(TrainerOptions&)>& adjust = {}) {
  const auto host = run_job(vars, tower_fn, optimizer, ranks, towers, MasterPlacement::OneDevice,
                            batches, adjust);
  const auto sharded =
      run_job(vars, tower_fn, optimizer, ranks, towers, MasterPlacement::Sharded, batches, adjust);
  for (int r = 0; r < ranks; ++r) {
    const JobBits &h = host[std::size_t(r)], &s = sharded[std::size_t(r)];
    ASSERT_EQ(s.steps.size(), h.steps.size());
    for (std::size_t k = 0; k < h.steps.size(); ++k) {
      const std::string where = std::string(optimizer.name) + ", " + std::to_string(ranks) +
                                " processes of " + std::to_string(towers) + " towers, batch of " +
                                std::to_string(batches[k][0].size(0)) + ", rank " +
                                std::to_string(r) + ", step " + std::to_string(k);
      EXPECT_TRUE(s.steps[k] == h.steps[k]) << where << ": loss, outputs or logs differ";
      StateBits expected = h.states[k];
      expected.gradient.clear();
      EXPECT_TRUE(s.states[k] == expected)
          << where << ": values, statistics, slots or counts differ";
    }
  }
}

TEST(ShardedMasterAcrossProcesses, EveryOptimizerTakesTheHostMastersStepsBitForBit) {
  Model model;
  for (const NamedOptimizer& optimizer : every_optimizer()) {
    for (int ranks : {2, 3}) {
      for (int towers : {1, 2}) {
        // Even, uneven, and one sample fewer than processes (the last has none).
        for (std::int64_t batch : {std::int64_t(12), std::int64_t(7), std::int64_t(ranks - 1)}) {
          expect_sharded_job_is_host_job(model.vars, model.tower_fn(), optimizer, ranks, towers,
                                         batches_of(batch, 70));
        }
      }
    }
  }
}

TEST(ShardedMasterAcrossProcesses, SynchronizedBatchNormAndGradientBucketsKeepTheBits) {
  BnModel model;
  const NamedOptimizer adamw = every_optimizer()[6];
  for (int ranks : {2, 3}) {
    expect_sharded_job_is_host_job(model.vars, model.tower_fn(), adamw, ranks, 2,
                                   batches_of(13, 80), [](TrainerOptions& o) {
                                     o.batchnorm = BatchNormMode::Sync;
                                     o.bucket_bytes = 64;
                                   });
    // Local batch norm and buckets: the host master's buckets cross the processes
    // during the backward, the sharded one's in phase 5; the same bits.
    expect_sharded_job_is_host_job(model.vars, model.tower_fn(), adamw, ranks, 2,
                                   batches_of(13, 90),
                                   [](TrainerOptions& o) { o.bucket_bytes = 64; });
  }
}

// The job's towers each hold one slice, where the processes' reduce-scatter
// finishes its sum: together they cover the buffer once.
TEST(ShardedMasterAcrossProcesses, TheJobsTowersHoldOneSliceEach) {
  const std::int64_t length = 1001, exchange = 1001 + 40;
  for (int ranks : {2, 3}) {
    for (int towers : {1, 2, 4}) {
      std::vector<int> owners(std::size_t(length), 0);
      for (int r = 0; r < ranks; ++r) {
        const RingSchedule processes(ranks, exchange, 0, length);
        const RingRange chunk = processes.chunk(processes.summed_at(r));
        const auto slices = sharded_slices(length, towers, ranks, r, exchange);
        ASSERT_EQ(slices.size(), std::size_t(towers));
        for (const RingRange& slice : slices) {
          EXPECT_GE(slice.begin, chunk.begin);
          EXPECT_LE(slice.end, chunk.end);
          EXPECT_LE(slice.size(), chunk.size() / towers + 1) << "balanced";
          for (std::int64_t i = slice.begin; i < slice.end; ++i) ++owners[std::size_t(i)];
        }
      }
      EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), length)
          << ranks << " processes of " << towers << " towers";
    }
  }
  EXPECT_THROW_WITH(sharded_slices(10, 2, 2, 0, 5), InvalidArgument, "exchange buffer of 5");
}

// The guard's verdict is the job's: a NaN in one process's samples makes every
// process skip (or stop) alike, with the host master's message.
TEST(ShardedMasterAcrossProcesses, TheNumericGuardDecidesForTheJob) {
  Model model;
  for (int ranks : {2, 3}) {
    std::vector<std::vector<Tensor>> batches = batches_of(9, 100, 4);
    // Sample 8: the last process's.
    batches[1][0].data<float>()[8 * 64 + 3] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::string> logs[2];
    for (MasterPlacement placement : {MasterPlacement::OneDevice, MasterPlacement::Sharded}) {
      std::vector<std::ostringstream> streams(static_cast<std::size_t>(ranks));
      const auto job = run_job(model.vars, model.tower_fn(), every_optimizer()[5], ranks, 2,
                               placement, batches, [&](TrainerOptions& o) {
                                 o.numeric_guard = NumericGuard::Skip;
                                 o.log = &streams[std::size_t(o.process_group->rank())];
                               });
      for (int r = 0; r < ranks; ++r) {
        EXPECT_TRUE(job[std::size_t(r)].steps[1].skipped) << "rank " << r;
        EXPECT_FALSE(job[std::size_t(r)].steps[2].skipped) << "rank " << r;
        logs[placement == MasterPlacement::Sharded].push_back(streams[std::size_t(r)].str());
      }
    }
    for (int r = 0; r < ranks; ++r) {
      EXPECT_NE(logs[0][std::size_t(r)].find("skipped the step"), std::string::npos);
      EXPECT_EQ(logs[1][std::size_t(r)], logs[0][std::size_t(r)]) << "rank " << r;
    }
    expect_sharded_job_is_host_job(model.vars, model.tower_fn(), every_optimizer()[5], ranks, 2,
                                   batches,
                                   [](TrainerOptions& o) { o.numeric_guard = NumericGuard::Skip; });
    // Stop: every process throws the host master's NumericError.
    std::vector<std::string> messages[2];
    for (MasterPlacement placement : {MasterPlacement::OneDevice, MasterPlacement::Sharded}) {
      std::vector<std::string>& mine = messages[placement == MasterPlacement::Sharded];
      mine.resize(std::size_t(ranks));
      run_ranks(ranks, [&](int rank, ProcessGroup& group) {
        TrainerOptions o = towers_on(repeat(Device::cpu(), 2), placement, Device::cpu());
        o.process_group = &group;
        Trainer t(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2), o);
        t.step(batches[0]);
        try {
          t.step(batches[1]);
        } catch (const NumericError& e) {
          mine[std::size_t(rank)] = e.what();
        }
      });
    }
    for (int r = 0; r < ranks; ++r) {
      EXPECT_NE(messages[0][std::size_t(r)].find("averaged gradient of"), std::string::npos)
          << messages[0][std::size_t(r)];
      EXPECT_EQ(messages[1][std::size_t(r)], messages[0][std::size_t(r)]) << "rank " << r;
    }
  }
}

// The processes' two halves are their all-reduce: reduce_scatter_sum leaves each
// rank's chunk with allreduce_sum's bits, and allgather_chunks then gives every
// rank all of them. The control: the same values reduce-scattered without the
// whole buffer's frame are summed in another order, and the comparison sees it.
TEST(ShardedMasterAcrossProcesses, TheProcessesHalvesGiveTheAllReducesBits) {
  const std::size_t n = 1000, total = 1300;
  for (int ranks : {2, 3}) {
    const auto r_count = static_cast<std::size_t>(ranks);
    std::vector<std::vector<float>> summed(r_count), halves(r_count), unframed(r_count);
    run_ranks(ranks, [&](int rank, ProcessGroup& group) {
      const auto values = random_values(n, 30 + unsigned(rank));
      std::vector<float>& all = summed[std::size_t(rank)];
      all.assign(values.begin(), values.end());
      group.allreduce_sum(all, "all-reduce", ReduceFrame{0, total});
      std::vector<float>& two = halves[std::size_t(rank)];
      two.assign(values.begin(), values.end());
      group.reduce_scatter_sum(two, "reduce-scatter", ReduceFrame{0, total});
      const RingSchedule schedule(ranks, std::int64_t(total), 0, std::int64_t(n));
      const RingRange mine = schedule.chunk(schedule.summed_at(rank));
      for (std::int64_t i = mine.begin; i < mine.end; ++i) {
        EXPECT_EQ(std::memcmp(&two[std::size_t(i)], &all[std::size_t(i)], sizeof(float)), 0)
            << "rank " << rank << ", element " << i;
      }
      group.allgather_chunks(two, "all-gather", ReduceFrame{0, total});
      std::vector<float>& other = unframed[std::size_t(rank)];
      other.assign(values.begin(), values.end());
      group.allreduce_sum(other, "all-reduce without the frame");
    });
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(std::memcmp(halves[std::size_t(r)].data(), summed[std::size_t(r)].data(),
                            n * sizeof(float)),
                0)
          << ranks << " ranks, rank " << r;
      EXPECT_EQ(std::memcmp(summed[std::size_t(r)].data(), summed[0].data(), n * sizeof(float)), 0);
    }
    if (ranks > 2) {  // two addends sum alike in either order
      EXPECT_NE(std::memcmp(unframed[0].data(), summed[0].data(), n * sizeof(float)), 0)
          << "another frame, another order: the comparison must see it";
    }
  }
}

// The control of the trainer's comparison: the same global batches over another
// layout (one process of four towers against two of two) sum in another order,
// and the comparison sees other bits.
TEST(ShardedMasterAcrossProcesses, AnotherLayoutIsSeenAsDifferent) {
  Model model;
  const NamedOptimizer adam = every_optimizer()[5];
  const auto batches = batches_of(12, 110);
  const auto sharded =
      run_job(model.vars, model.tower_fn(), adam, 2, 2, MasterPlacement::Sharded, batches);
  Trainer one(model.vars, model.tower_fn(), adam.make(),
              towers_on(repeat(Device::cpu(), 4), MasterPlacement::OneDevice, Device::cpu()));
  bool differs = false;
  for (std::size_t k = 0; k < batches.size(); ++k) {
    one.step(batches[k]);
    differs = differs || state_bits(one).values != sharded[0].states[k].values;
  }
  EXPECT_TRUE(differs) << "four towers in one process and two in each of two processes round "
                          "alike: the bit-for-bit comparisons above could not fail";
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
