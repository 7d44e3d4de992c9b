// Trainer::save_state and Trainer::restore_state (parallel/trainer.h): a run saved
// after some steps and restored into a new trainer continues bit for bit as the
// uninterrupted run (variables, moving statistics, optimizer slots and step, the
// numeric guard's count); a state of another run is refused naming the first
// difference, before anything changes; another tower count resumes to rounding.
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>

#include "bn_model.h"
#include "file_test_util.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

TrainerOptions towers(int n, NumericGuard guard = NumericGuard::Skip) {
  TrainerOptions o;
  o.devices.assign(std::size_t(n), Device::cpu());
  o.seed = 7;
  o.numeric_guard = guard;
  // The skip warning is not the point here. One stream per thread: the ranks of
  // run_ranks are threads, and both warn at the same step.
  thread_local std::ostringstream quiet;
  o.log = &quiet;
  return o;
}

// Step s's batch: 7 images (uneven over 2 towers); step 2's holds a NaN, which
// NumericGuard::Skip leaves out, so the skipped count is part of the state.
std::vector<Tensor> batch(int s) {
  std::vector<Tensor> b = small_image_batch(7, 40 + unsigned(s), 3);
  if (s == 2) {
    std::vector<float> pixels = b[0].to_host<float>();
    pixels[5] = std::numeric_limits<float>::quiet_NaN();
    b[0] = Tensor::from_host<float>(pixels, b[0].shape(), default_stream(Device::cpu()));
  }
  return b;
}

struct State {
  std::vector<float> values, slots;
  std::int64_t steps = 0, skipped = 0;
  explicit State(Trainer& t)
      : values(t.master().flat_values().to_host<float>()),
        slots(t.optimizer().slots().at("m").to_host<float>()),
        steps(t.optimizer().steps()),
        skipped(t.skipped_steps()) {
    const auto state = t.master().flat_state().to_host<float>();  // moving statistics
    values.insert(values.end(), state.begin(), state.end());
  }
  bool operator==(const State&) const = default;
};

TEST(TrainerState, ARestoredRunContinuesBitForBit) {
  BnModel m;
  ScratchDir dir;
  Trainer first(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), towers(2));
  for (int s = 0; s < 4; ++s) first.step(batch(s));
  ASSERT_EQ(first.skipped_steps(), 1);
  first.save_state(dir.file("state.safetensors"), {{"epoch", "3"}});
  for (int s = 4; s < 7; ++s) first.step(batch(s));

  Trainer resumed(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), towers(2));
  const CheckpointInfo info = resumed.restore_state(dir.file("state.safetensors"));
  EXPECT_EQ(info.metadata.at("epoch"), "3");
  EXPECT_EQ(resumed.skipped_steps(), 1);
  EXPECT_EQ(resumed.optimizer().steps(), 3);
  for (int s = 4; s < 7; ++s) resumed.step(batch(s));
  EXPECT_TRUE(State(resumed) == State(first));

  // The control: without the restore the comparison fails.
  Trainer fresh(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), towers(2));
  for (int s = 4; s < 7; ++s) fresh.step(batch(s));
  EXPECT_FALSE(State(fresh) == State(first));
}

TEST(TrainerState, AnotherTowerCountResumesToRounding) {
  BnModel m;
  ScratchDir dir;
  TrainerOptions sync = towers(2);
  sync.batchnorm = BatchNormMode::Sync;
  Trainer first(m.vars, m.tower_fn(), Optimizer::by_name("sgd", 0.05), sync);
  for (int s = 0; s < 2; ++s) first.step(batch(s + 3));
  first.save_state(dir.file("state.safetensors"));
  for (int s = 2; s < 4; ++s) first.step(batch(s + 3));
  TrainerOptions one = towers(1);
  one.batchnorm = BatchNormMode::Sync;
  Trainer resumed(m.vars, m.tower_fn(), Optimizer::by_name("sgd", 0.05), one);
  resumed.restore_state(dir.file("state.safetensors"));
  for (int s = 2; s < 4; ++s) resumed.step(batch(s + 3));
  EXPECT_TRUE(all_close(resumed.master().flat_values().to_host<float>(),
                        first.master().flat_values().to_host<float>(), 1e-5, 1e-4));
}

// A master sharded across 2 processes of 2 towers (threads,
// tests/thread_process_group.h) saves the one checkpoint any run saves: resumed
// sharded, or with the master on the host on the same processes, it continues bit
// for bit; in one process of one tower it restores the saved state.
TEST(TrainerState, AMasterShardedAcrossProcessesResumesOnAnyPlacement) {
  BnModel m;
  ScratchDir dir;
  const std::string path = dir.file("sharded.safetensors");
  const auto options = [](MasterPlacement placement, ProcessGroup* group) {
    TrainerOptions o = towers(2);
    o.batchnorm = BatchNormMode::Sync;  // 7 images over 4 towers: one has a single image
    o.master_placement = placement;
    o.process_group = group;
    return o;
  };
  // Each rank's state after steps 4..6: trained from the start, or resumed at step 4.
  const auto job = [&](MasterPlacement placement, bool resume) {
    std::vector<std::unique_ptr<State>> states(2);
    std::unique_ptr<State> saved;
    const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
      Trainer t(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), options(placement, &group));
      if (resume) {
        t.restore_state(path);
      } else {
        for (int s = 0; s < 4; ++s) t.step(batch(s));
        t.save_state(path);
        State here(t);
        if (rank == 0) saved = std::make_unique<State>(here);
      }
      for (int s = 4; s < 7; ++s) t.step(batch(s));
      states[std::size_t(rank)] = std::make_unique<State>(t);
    });
    EXPECT_EQ(errors, std::vector<std::string>(2, "")) << (resume ? "resumed" : "first");
    return std::make_pair(std::move(states), std::move(saved));
  };
  auto [first, saved] = job(MasterPlacement::Sharded, false);
  ASSERT_TRUE(first[0] && first[1] && saved);
  EXPECT_EQ(saved->skipped, 1);
  EXPECT_TRUE(*first[1] == *first[0]) << "every process holds the same state";
  for (MasterPlacement placement : {MasterPlacement::Sharded, MasterPlacement::OneDevice}) {
    auto [resumed, unused] = job(placement, true);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(resumed[std::size_t(r)]);
      EXPECT_TRUE(*resumed[std::size_t(r)] == *first[0])
          << "rank " << r << ", resumed "
          << (placement == MasterPlacement::Sharded ? "sharded" : "with the master on the host");
    }
  }
  TrainerOptions one = options(MasterPlacement::OneDevice, nullptr);
  one.devices = {Device::cpu()};
  Trainer alone(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), one);
  alone.restore_state(path);
  EXPECT_TRUE(State(alone) == *saved) << "one process of one tower";
  // The control: a run not resumed differs.
  Trainer fresh(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), towers(1));
  fresh.step(batch(0));
  EXPECT_FALSE(State(fresh) == *saved);
}

TEST(TrainerState, AnotherRunIsRefusedNamingTheFirstDifferenceAndNothingChanges) {
  BnModel m;
  ScratchDir dir;
  Trainer saved(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), towers(2));
  saved.step(batch(0));
  saved.save_state(dir.file("state.safetensors"), {{"run/batch", "7"}});

  Trainer other_lr(m.vars, m.tower_fn(), Optimizer::by_name("adam", 2e-2), towers(2));
  const std::vector<float> before = other_lr.master().flat_values().to_host<float>();
  EXPECT_THROW_WITH(other_lr.restore_state(dir.file("state.safetensors")), InvalidArgument,
                    "another model or other step options ('optimizer learning rate constant "
                    "0.01' in the file, 'optimizer learning rate constant 0.02' in this run)");
  EXPECT_EQ(other_lr.master().flat_values().to_host<float>(), before);
  EXPECT_EQ(other_lr.optimizer().steps(), 0);

  TrainerOptions other_seed = towers(2);
  other_seed.seed = 8;
  Trainer seeded(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), other_seed);
  EXPECT_THROW_WITH(seeded.restore_state(dir.file("state.safetensors")), InvalidArgument,
                    "'seed 7' in the file, 'seed 8' in this run");

  // Local batch norm normalizes each tower's slice: one tower is another step.
  Trainer one_tower(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), towers(1));
  EXPECT_THROW_WITH(one_tower.restore_state(dir.file("state.safetensors")), InvalidArgument,
                    "'towers in the job (local batch norm) 2' in the file, 'towers in the job "
                    "(local batch norm) 1' in this run");

  Trainer same(m.vars, m.tower_fn(), Optimizer::by_name("adam", 1e-2), towers(2));
  EXPECT_THROW_WITH(same.restore_state(dir.file("state.safetensors"), {{"run/batch", "8"}}),
                    InvalidArgument, "another run (run/batch 7 in the file, 8 in this run)");
  EXPECT_NO_THROW(same.restore_state(dir.file("state.safetensors"), {{"run/batch", "7"}}));

  // Plain weights or a checkpoint without the trainer's state: not a training state.
  save_checkpoint(dir.file("weights.safetensors"), saved.master(), &saved.optimizer());
  EXPECT_THROW_WITH(same.restore_state(dir.file("weights.safetensors")), InvalidArgument,
                    "not a training state");
  // A truncated file is an IoError (a resume skips it and takes the one before).
  const std::string bytes = read_file(dir.file("state.safetensors"));
  write_file(dir.file("cut.safetensors"), bytes.substr(0, bytes.size() / 2));
  EXPECT_THROW(same.restore_state(dir.file("cut.safetensors")), IoError);
  // A flipped bit in the data: the header reads, the checksum does not match.
  std::string flipped = bytes;
  flipped[flipped.size() - 10] = char(flipped[flipped.size() - 10] ^ 0x01);
  write_file(dir.file("flipped.safetensors"), flipped);
  EXPECT_THROW_WITH(same.restore_state(dir.file("flipped.safetensors")), IoError,
                    "its data does not match its checksum");
}

// Summaries after a resume: the rows up to the checkpoint stay, later ones (written
// before a kill) are replaced, none is missing or doubled.
TEST(TrainerState, SummariesContinueAtTheCheckpointsPosition) {
  ScratchDir dir;
  for (const std::string name : {"s.csv", "s.jsonl"}) {
    const std::string path = dir.file(name);
    std::uint64_t at_checkpoint = 0;
    {
      SummaryWriter w(path);
      w.write(1, {{"loss", 2.0}, {"lr", 0.1}});
      w.write(2, {{"loss", 1.5}, {"lr", 0.1}});
      at_checkpoint = w.bytes();
      w.write(3, {{"loss", 9.0}, {"lr", 0.1}});  // after the checkpoint: lost with the kill
    }
    {
      SummaryWriter w(path, at_checkpoint);
      w.write(3, {{"loss", 1.25}, {"lr", 0.1}});
      if (name.ends_with(".csv")) {  // the header's columns still hold
        EXPECT_THROW(w.write(4, {{"loss", 1.0}}), InvalidArgument);
      }
    }
    SummaryWriter uninterrupted(dir.file("u" + name));
    uninterrupted.write(1, {{"loss", 2.0}, {"lr", 0.1}});
    uninterrupted.write(2, {{"loss", 1.5}, {"lr", 0.1}});
    uninterrupted.write(3, {{"loss", 1.25}, {"lr", 0.1}});
    EXPECT_EQ(read_file(path), read_file(dir.file("u" + name))) << name;
    EXPECT_THROW_WITH(SummaryWriter(path, 1000), IoError, "the checkpoint wrote 1000");
  }
}

}  // namespace
}  // namespace towerlab::testing
