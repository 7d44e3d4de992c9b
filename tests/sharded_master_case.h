// What the sharded master's tests share (tests/sharded_master_test.cpp in one
// process, tests/sharded_master_processes_test.cpp across processes): the model,
// its batches, every optimizer with a schedule and weight decay, and the bits of a
// step's result and of a trainer's state, which a sharded master must give as the
// master on one device does.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cnn_model.h"
#include "test_util.h"

namespace towerlab::testing {

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

inline std::vector<Tensor> make_batch(std::int64_t n, unsigned seed) {
  return small_image_batch(n, seed, 7);
}

// Every optimizer, with a schedule and weight decay where it has them.
struct NamedOptimizer {
  const char* name;
  std::function<Optimizer()> make;
};

inline std::vector<NamedOptimizer> every_optimizer() {
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
inline std::vector<std::uint32_t> bits(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return {};
  const std::vector<float> host = t.to_host<float>(default_stream(t.device()));
  std::vector<std::uint32_t> out(host.size());
  std::memcpy(out.data(), host.data(), host.size() * sizeof(float));
  return out;
}

inline std::uint64_t bits(double d) {
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

inline StepBits step_bits(const StepResult& r) {
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
inline StateBits state_bits(Trainer& t, bool with_gradient = true) {
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

inline TrainerOptions towers_on(const std::vector<Device>& devices, MasterPlacement placement,
                                std::optional<Device> master) {
  TrainerOptions o;
  o.devices = devices;
  o.seed = 11;
  o.master_placement = placement;
  if (placement == MasterPlacement::OneDevice) o.master = master;
  return o;
}

inline std::vector<Device> repeat(Device d, int n) {
  return std::vector<Device>(std::size_t(n), d);
}

inline std::vector<std::vector<Tensor>> batches_of(std::int64_t n, unsigned seed, int steps = 3) {
  std::vector<std::vector<Tensor>> all;
  for (int s = 0; s < steps; ++s) all.push_back(make_batch(n, seed + unsigned(s)));
  return all;
}

}  // namespace towerlab::testing
