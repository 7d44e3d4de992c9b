// Training across the ranks of an mpirun (tests/mpi/CMakeLists.txt): the trace of a
// job, gradient buckets and a sharded master, each against its one-call or
// host-master twin, bit for bit, on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "mpi_test.h"
#include "towerlab.h"

namespace towerlab::testing {
namespace {

// --- the trace of a job ------------------------------------------------------

// Every rank traces two steps of 2 CPU towers and writes the trace collectively:
// rank 0's file holds each rank as a process, named once, with its towers, master
// and processes rows, and the ranks' times aligned (they leave each step's
// all-reduce together). Without mpirun: one process, no processes row.
TEST(JobTrace, RankZeroWritesEveryRanksRowsWithAlignedTimes) {
  SharedDir dir;
  Model m;
  TrainerOptions options;
  options.devices = {Device::cpu(), Device::cpu()};
  options.process_group = &cluster();
  Trainer trainer(
      m.vars,
      [&m](const Tower& tower, const std::vector<Tensor>& batch) {
        Context ctx = tower.context();
        Var logits = m.net(ctx, tower.input(batch[0], "images"));
        return TowerResult{ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels"))};
      },
      Optimizer::by_name("sgd", 0.1), options);
  Trace trace;
  trainer.set_trace(&trace);
  for (int step = 1; step <= 2; ++step) {
    trace.set_step(step);
    trainer.step({m.images, m.labels});
  }
  trainer.set_trace(nullptr);
  // The ranks arrive at the write at different times (`stagger` apart); their
  // clocks are aligned where they leave it together. Aligned where they arrive
  // instead, the ranks' ends of one all-reduce would lie `stagger` apart; aligned
  // right, only the scheduler's delays part them (up to 77 ms seen at load 16 on 2
  // cores), so the bound is half the stagger.
  constexpr double stagger = 300.0;  // ms
  std::this_thread::sleep_for(
      std::chrono::duration<double, std::milli>(stagger * cluster().rank()));
  const std::string path = dir.file("trace.json");
  trace.write(path, cluster());
  if (cluster().rank() != 0) return;

  std::ifstream in(path);
  const nlohmann::json json = nlohmann::json::parse(in);
  const int ranks = cluster().size();
  std::map<int, int> process_names, rows;
  std::map<std::int64_t, std::vector<double>> all_reduce_ends;  // step -> per rank, ms
  for (const nlohmann::json& e : json["traceEvents"]) {
    const int pid = e["pid"].get<int>();
    if (e["name"] == "process_name") {
      ++process_names[pid];
      EXPECT_EQ(e["args"]["name"].get<std::string>().rfind("rank " + std::to_string(pid) + " (", 0),
                0u);
    }
    if (e["name"] == "thread_name") ++rows[pid];
    if (e["ph"] == "X" && e["cat"] == "processes") {
      all_reduce_ends[e["args"]["step"].get<std::int64_t>()].push_back(
          (e["ts"].get<double>() + e["dur"].get<double>()) / 1000.0);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(process_names[r], 1) << "rank " << r;
    // 2 towers, the master, and in a job of several ranks the processes.
    EXPECT_EQ(rows[r], ranks > 1 ? 4 : 3) << "rank " << r;
  }
  EXPECT_EQ(process_names.size(), std::size_t(ranks));
  ASSERT_EQ(all_reduce_ends.size(), ranks > 1 ? 2u : 0u);
  for (const auto& [step, ends] : all_reduce_ends) {
    ASSERT_EQ(ends.size(), std::size_t(ranks)) << "step " << step;
    const auto [low, high] = std::minmax_element(ends.begin(), ends.end());
    EXPECT_LT(*high - *low, stagger / 2) << "step " << step << ": the ranks' all-reduce ends (ms)";
  }
}

// --- gradient buckets -------------------------------------------------------

// Three steps of 2 CPU towers per rank on an uneven batch drawn from `seed`, with
// `adjust` setting the options: every rank's master values, moving statistics and
// losses as bytes, and with `slots` the optimizer's slots too (optimizer() gathers
// every rank's slots under a sharded master: every rank calls it).
std::string three_steps(unsigned seed, const char* optimizer,
                        const std::function<void(TrainerOptions&)>& adjust, bool slots) {
  Model m;
  const std::int64_t n = 4 * cluster().size() + 1;  // uneven; two samples or more per tower
  Tensor images = Tensor::empty({n, 1, 4, 4}, cpu());
  random_normal(images, seed, 0, 0.0f, 1.0f, cpu());
  std::vector<float> labels;
  for (std::int64_t i = 0; i < n; ++i) labels.push_back(float(i % 3));
  const std::vector<Tensor> batch{images, Tensor::from_host<float>(labels, {n}, cpu())};
  TrainerOptions options;
  options.devices = {Device::cpu(), Device::cpu()};
  options.process_group = &cluster();
  options.seed = seed;
  adjust(options);
  auto tower_fn = [&m](const Tower& tower, const std::vector<Tensor>& b) {
    Var logits = m.net(tower.context(), tower.input(b[0]));
    return TowerResult{ag::softmax_cross_entropy(logits, tower.input(b[1])), {}, {}};
  };
  Trainer trainer(m.vars, tower_fn, Optimizer::by_name(optimizer, 0.05), options);
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) losses.push_back(trainer.step(batch).loss);
  return all_bytes(trainer.master()) + (slots ? slot_bytes(trainer.optimizer()) : "") +
         bytes_of(losses);
}

std::string bucketed_training(std::int64_t bucket_bytes, const char* optimizer) {
  return three_steps(
      21, optimizer, [&](TrainerOptions& o) { o.bucket_bytes = bucket_bytes; }, false);
}

TEST(Buckets, ABucketedStepAcrossProcessesGivesTheBitsOfAnUnbucketedOne) {
  for (const char* optimizer : {"sgd", "adam"}) {
    const std::string reference = bucketed_training(0, optimizer);
    // One variable per bucket, and buckets of one or two variables.
    for (std::int64_t bytes : {std::int64_t(1), std::int64_t(64)}) {
      EXPECT_EQ(bucketed_training(bytes, optimizer), reference)
          << optimizer << ", buckets of " << bytes << " bytes";
    }
    const auto all = cluster().allgather(reference, "test: compare trainings");
    for (int r = 0; r < cluster().size(); ++r) {
      EXPECT_EQ(all[std::size_t(r)], all[0]) << "rank " << r;
    }
  }
}

// --- a sharded master --------------------------------------------------------

std::string placed_training(MasterPlacement placement, const char* optimizer) {
  return three_steps(
      22, optimizer, [&](TrainerOptions& o) { o.master_placement = placement; }, true);
}

TEST(ShardedMaster, AcrossProcessesTakesTheHostMastersStepsBitForBit) {
  for (const char* optimizer : {"sgd", "adam"}) {
    const std::string host = placed_training(MasterPlacement::OneDevice, optimizer);
    EXPECT_EQ(placed_training(MasterPlacement::Sharded, optimizer), host) << optimizer;
    const auto all = cluster().allgather(host, "test: compare trainings");
    for (int r = 0; r < cluster().size(); ++r) {
      EXPECT_EQ(all[std::size_t(r)], all[0]) << "rank " << r;
    }
  }
}

// --- the gradient's reduction in bfloat16 contributions ------------------------

// One CPU tower per rank: each process contributes its tower's gradient rounded to
// bfloat16 once, summed in float32 in rank order (parallel/ring_contributions.h),
// which is what one process with a tower per rank sums: every rank computes that
// alone and compares. Sharded across the processes: the same bits. Control: the
// float32 reduction differs.
TEST(ReduceDtype, ProcessesOfOneTowerTakeTheStepsOfOneProcessBitForBit) {
  const auto job = [](DType dtype, MasterPlacement placement) {
    return three_steps(
        23, "adam",
        [&](TrainerOptions& o) {
          o.devices = {Device::cpu()};
          o.reduce_dtype = dtype;
          o.master_placement = placement;
        },
        false);
  };
  const std::string bf16 = job(DType::BFloat16, MasterPlacement::OneDevice);
  const std::string alone = three_steps(
      23, "adam",
      [](TrainerOptions& o) {
        o.devices.assign(std::size_t(cluster().size()), Device::cpu());
        o.process_group = nullptr;
        o.reduce_dtype = DType::BFloat16;
      },
      false);
  EXPECT_EQ(bf16, alone);
  EXPECT_EQ(job(DType::BFloat16, MasterPlacement::Sharded), bf16);
  EXPECT_NE(job(DType::Float32, MasterPlacement::OneDevice), bf16) << "control: float32";
  const auto all = cluster().allgather(bf16, "test: compare trainings");
  for (int r = 0; r < cluster().size(); ++r) EXPECT_EQ(all[std::size_t(r)], all[0]) << "rank " << r;
}
}  // namespace
}  // namespace towerlab::testing
