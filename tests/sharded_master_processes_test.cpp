// A master sharded across processes (parallel/sharded_master.h): across 2 and 3
// processes (threads, tests/thread_process_group.h) of 1 or 2 towers, the job's
// towers own a slice each and take the host master's steps across the same
// processes bit for bit; another layout is seen as different (the control). On
// NCCL, two processes of one tower each on a GPU of its own take the steps of one
// process of those two GPUs, sharded against the master on the host, and so does
// clipping by the global norm with the master on each process's GPU (controls:
// other rounding, and no clipping, are seen as different). One process:
// tests/sharded_master_test.cpp.
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "bn_model.h"
#include "parallel/nccl_communicator.h"
#include "parallel/ring_schedule.h"
#include "parallel/sharded_master.h"
#include "sharded_master_case.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

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

// --- one tower per GPU across processes, on NCCL ------------------------------

// Why a job of two processes, each on a GPU of its own, cannot meet on NCCL in this
// build, or "" (the emulated GPUs can).
std::string two_nccl_gpus_missing() {
  if (!NcclCommunicator::available()) return "this build of towerlab has no NCCL";
  if (cuda_device_count() < 2) {
    return "needs 2 GPUs for as many NCCL ranks; " + std::to_string(cuda_device_count()) +
           " visible";
  }
  return {};
}

// What a trainer gave over some steps: each step's loss and gradient norm, and its
// state after the last.
struct RunBits {
  std::vector<std::uint64_t> losses, norms;
  StateBits state;
};

RunBits train(Trainer& t, const std::vector<std::vector<Tensor>>& batches, bool with_gradient) {
  RunBits run;
  for (const auto& batch : batches) {
    const StepResult r = t.step(batch);
    run.losses.push_back(bits(r.loss));
    run.norms.push_back(bits(r.grad_norm));
  }
  run.state = state_bits(t, with_gradient);
  return run;
}

// Two processes (threads) of one tower each, rank r's on cuda:r, with the master
// where `placement` puts it (OneDevice: on the rank's GPU) and phase 5 on `path`,
// which each rank's placement log must name: each rank's run. `adjust` sets the
// options further.
std::vector<RunBits> one_tower_per_gpu(const VariableSet& vars, const TowerFn& tower_fn,
                                       const NamedOptimizer& optimizer, MasterPlacement placement,
                                       const std::vector<std::vector<Tensor>>& batches,
                                       const std::function<void(TrainerOptions&)>& adjust = {},
                                       CrossProcessPath path = CrossProcessPath::Nccl) {
  std::vector<RunBits> job(2);
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& group) {
    std::ostringstream log;
    TrainerOptions o = towers_on({Device::cuda(rank)}, placement, Device::cuda(rank));
    o.process_group = &group;
    o.cross_process = path;
    o.log_placement = true;
    o.log = &log;
    if (adjust) adjust(o);
    Trainer t(vars, tower_fn, optimizer.make(), o);
    const std::string named = path == CrossProcessPath::Nccl
                                  ? "by NCCL on cuda:" + std::to_string(rank)
                                  : "by the process group (host staging";
    EXPECT_NE(log.str().find(named), std::string::npos) << log.str();
    // Across processes a sharded trainer's gradients() holds its own slices only.
    job[std::size_t(rank)] = train(t, batches, placement == MasterPlacement::OneDevice);
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
  return job;
}

// Two processes of one tower, each on a GPU of its own, with the master sharded and
// the processes' halves on NCCL (parallel/sharded_nccl.h), take the steps of one
// process whose two towers are those GPUs with the master on the host, bit for bit:
// each element's sum is one addition, a + b, in the towers' ring or in NCCL, and
// the batch is split and weighted alike; the update runs on the GPUs, whose kernel
// gives the host's bits on the emulated GPUs (as
// NcclTrainer.ShardedOnNcclTakesTheHostMastersStepsBitForBit has it). Losses,
// values, slots and counts for every optimizer on an uneven batch, and an even one,
// and moving statistics with batch norm. The control: one tower on the whole batch, the same
// steps to float rounding, is seen as different.
TEST(ShardedMasterOnNccl, OneTowerPerGpuTakesTheOneProcessHostMastersStepsBitForBit) {
  if (const std::string missing = two_nccl_gpus_missing(); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  const auto expect_job_is_one_process = [](const VariableSet& vars, const TowerFn& tower_fn,
                                            const NamedOptimizer& optimizer, std::int64_t batch) {
    SCOPED_TRACE(std::string(optimizer.name) + ", batch of " + std::to_string(batch));
    const auto batches = batches_of(batch, 120);
    const auto job =
        one_tower_per_gpu(vars, tower_fn, optimizer, MasterPlacement::Sharded, batches);
    Trainer one(
        vars, tower_fn, optimizer.make(),
        towers_on({Device::cuda(0), Device::cuda(1)}, MasterPlacement::OneDevice, Device::cpu()));
    const RunBits expected = train(one, batches, false);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(job[std::size_t(r)].losses, expected.losses) << "rank " << r;
      EXPECT_TRUE(job[std::size_t(r)].state == expected.state)
          << "rank " << r << ": values, statistics, slots or counts differ";
    }
    return job;
  };
  Model model;
  for (const NamedOptimizer& optimizer : every_optimizer()) {
    // Under ThreadSanitizer the emulated GPUs' streams are host threads it shadows
    // (as in ShardedMasterBackendTest): three optimizers stand for the rest.
    const std::string name = optimizer.name;
    if (kThreadSanitizer && name != "nesterov" && name != "rmsprop centered" && name != "adamw")
      continue;
    expect_job_is_one_process(model.vars, model.tower_fn(), optimizer, 9);  // 5 + 4 samples
  }
  expect_job_is_one_process(model.vars, model.tower_fn(), every_optimizer()[6], 8);
  BnModel bn_model;
  expect_job_is_one_process(bn_model.vars, bn_model.tower_fn(), every_optimizer()[6], 9);

  const NamedOptimizer adam = every_optimizer()[5];
  const auto job = expect_job_is_one_process(model.vars, model.tower_fn(), adam, 9);
  Trainer alone(model.vars, model.tower_fn(), adam.make(),
                towers_on({Device::cuda(0)}, MasterPlacement::OneDevice, Device::cpu()));
  EXPECT_NE(train(alone, batches_of(9, 120), false).state.values, job[0].state.values)
      << "one tower on the whole batch rounds as two processes do: the comparison could not fail";
}

// Clipping by the global norm with the master on each process's GPU, not sharded,
// and phase 5 on NCCL. The norm's parts are the sharded master's slices of the
// host-staged exchange buffer on either path (Trainer::unscale_and_clip_gradients),
// each part's sum of squares read from tower 0's whole gradient, so every rank gets
// one norm, and the job clips to the bits of the same processes staged on the host
// and of the same job sharded on NCCL. One process of the same two GPUs cuts its
// parts at its towers' ring chunks, so its norm rounds otherwise (a float's
// rounding of a part's sum), and the test allows that; on these steps the
// coefficient, rounded to float before it scales the gradient, comes out the same,
// so the values and the clipped gradient are the job's, bit for bit (a norm nearer
// a rounding boundary could move the coefficient by one float step). The control:
// that process without clipping (the limit bites at every step) is seen as
// different.
TEST(ClipGradNormOnNccl, UnshardedAcrossProcessesClipsAsOneProcess) {
  if (const std::string missing = two_nccl_gpus_missing(); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  Model model;
  const NamedOptimizer adam = every_optimizer()[5];
  const auto batches = batches_of(9, 130);
  const double limit = 0.05;
  const auto clip = [&](TrainerOptions& o) { o.clip_grad_norm = limit; };
  const auto nccl = one_tower_per_gpu(model.vars, model.tower_fn(), adam,
                                      MasterPlacement::OneDevice, batches, clip);
  const auto staged =
      one_tower_per_gpu(model.vars, model.tower_fn(), adam, MasterPlacement::OneDevice, batches,
                        clip, CrossProcessPath::HostStaged);
  const auto sharded = one_tower_per_gpu(model.vars, model.tower_fn(), adam,
                                         MasterPlacement::Sharded, batches, clip);
  TrainerOptions o =
      towers_on({Device::cuda(0), Device::cuda(1)}, MasterPlacement::OneDevice, Device::cuda(0));
  o.clip_grad_norm = limit;
  Trainer one(model.vars, model.tower_fn(), adam.make(), o);
  const RunBits alone = train(one, batches, true);
  o.clip_grad_norm = 0.0;
  Trainer unclipped(model.vars, model.tower_fn(), adam.make(), o);
  EXPECT_NE(train(unclipped, batches, true).state.values, alone.state.values)
      << "clipping changed no bit: the comparison with one process could not fail";
  for (int r = 0; r < 2; ++r) {
    const RunBits &mine = nccl[std::size_t(r)], &theirs = staged[std::size_t(r)];
    for (std::uint64_t norm : mine.norms) {
      double value;
      std::memcpy(&value, &norm, sizeof value);
      EXPECT_GT(value, limit) << "rank " << r << ": the limit must bite";
    }
    EXPECT_EQ(mine.norms, nccl[0].norms) << "rank " << r << ": one norm for the job";
    EXPECT_EQ(mine.norms, theirs.norms) << "rank " << r << ": staged on the host";
    EXPECT_TRUE(mine.state == theirs.state) << "rank " << r << ": staged on the host";
    EXPECT_EQ(mine.norms, sharded[std::size_t(r)].norms) << "rank " << r << ": sharded on NCCL";
    StateBits unsharded = mine.state;
    unsharded.gradient.clear();
    EXPECT_TRUE(unsharded == sharded[std::size_t(r)].state) << "rank " << r << ": sharded on NCCL";
    EXPECT_EQ(mine.state.values, alone.state.values) << "rank " << r << ": one process";
    EXPECT_EQ(mine.state.gradient, alone.state.gradient) << "rank " << r << ": one process";
    for (std::size_t k = 0; k < alone.norms.size(); ++k) {
      double job_norm, one_norm;
      std::memcpy(&job_norm, &mine.norms[k], sizeof job_norm);
      std::memcpy(&one_norm, &alone.norms[k], sizeof one_norm);
      EXPECT_NEAR(job_norm, one_norm, 1e-6 * one_norm) << "rank " << r << ", step " << k;
    }
  }
}

}  // namespace
}  // namespace towerlab::testing
