// The trace of a training job across processes (Trace::write with a ProcessGroup),
// on the thread-backed group of tests/thread_process_group.h: rank 0 writes one
// file where every rank is a process with its towers, master and cross-process
// all-reduce as rows, each named once; the ranks' times are aligned; a failing
// write fails every rank alike.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "file_test_util.h"
#include "test_util.h"
#include "thread_process_group.h"

namespace towerlab::testing {
namespace {

using Json = nlohmann::json;

struct Mlp {
  VariableSet vars;
  Sequential net;
  Mlp() {
    net.add<Linear>(vars, "fc1", 6, 5);
    net.add<ReLU>();
    net.add<Linear>(vars, "fc2", 5, 3);
  }
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Context ctx = tower.context();
      Var logits = net(ctx, tower.input(batch[0], "x"));
      Var loss = ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels"));
      return TowerResult{loss, {logits}, {}};
    };
  }
};

std::vector<Tensor> make_batch(std::int64_t n) {
  Tensor x = Tensor::empty({n, 6}, cpu());
  random_normal(x, 3, 0, 0.0f, 1.0f, cpu());
  std::vector<float> labels;
  for (std::int64_t i = 0; i < n; ++i) labels.push_back(float(i % 3));
  return {x, Tensor::from_host<float>(labels, {n}, cpu())};
}

constexpr int kRanks = 3;
constexpr int kTowers = 2;
constexpr int kSteps = 2;
// Rank 1 reaches the write this late: were its times aligned at its arrival rather
// than at the common exit, its spans would sit this far from the others'.
constexpr auto kLate = std::chrono::milliseconds(300);

// Each rank traces kSteps steps of kRanks x kTowers and writes the trace
// collectively: rank 0 to `path`, the others to a path of their own (which must
// stay unwritten). Returns each rank's error ("" when it returned).
std::vector<std::string> trace_ranks(const Mlp& model, const ScratchDir& dir,
                                     const std::string& path) {
  return run_ranks(kRanks, [&](int rank, ProcessGroup& group) {
    TrainerOptions options;
    options.devices.assign(kTowers, Device::cpu());
    options.process_group = &group;
    Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), options);
    Trace trace;
    trainer.set_trace(&trace);
    for (int s = 1; s <= kSteps; ++s) {
      trace.set_step(s);
      trainer.step(make_batch(13));
    }
    trainer.set_trace(nullptr);
    if (rank == 1) std::this_thread::sleep_for(kLate);
    trace.write(rank == 0 ? path : dir.file("rank" + std::to_string(rank) + ".json"), group);
  });
}

TEST(MultiRankTrace, RankZeroWritesEveryRanksRowsOnceWithAlignedTimes) {
  Mlp model;
  ScratchDir dir;
  const std::string path = dir.file("trace.json");
  const auto errors = trace_ranks(model, dir, path);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[std::size_t(r)], "") << "rank " << r;
  EXPECT_EQ(dir.list(), std::vector<std::string>{"trace.json"});  // rank 0's file alone

  std::ifstream in(path);
  const Json trace = Json::parse(in);
  std::map<int, std::vector<std::string>> processes;             // pid -> its names
  std::map<std::pair<int, int>, std::vector<std::string>> rows;  // (pid, tid) -> its names
  std::map<std::pair<int, int>, int> spans;                      // (pid, tid) -> spans
  std::map<std::int64_t, std::vector<double>> all_reduce_ends;   // step -> one per rank, in ms
  std::set<std::int64_t> all_reduce_bytes;
  double earliest = 1e300;
  for (const Json& e : trace["traceEvents"]) {
    const int pid = e["pid"].get<int>();
    if (e["ph"] == "M" && e["name"] == "process_name") {
      processes[pid].push_back(e["args"]["name"]);
    } else if (e["ph"] == "M" && e["name"] == "thread_name") {
      rows[{pid, e["tid"].get<int>()}].push_back(e["args"]["name"]);
    } else if (e["ph"] == "X") {
      ++spans[{pid, e["tid"].get<int>()}];
      const double ts = e["ts"].get<double>();
      earliest = std::min(earliest, ts);
      if (e["cat"] == "processes") {
        EXPECT_EQ(e["name"], "all-reduce: gradients, moving statistics, losses, batch sizes");
        EXPECT_EQ(e["args"]["processes"], kRanks);
        all_reduce_bytes.insert(e["args"]["bytes"].get<std::int64_t>());
        all_reduce_ends[e["args"]["step"].get<std::int64_t>()].push_back(
            (ts + e["dur"].get<double>()) / 1000.0);
      }
    }
  }
  EXPECT_EQ(earliest, 0.0);
  ASSERT_EQ(processes.size(), std::size_t(kRanks));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(processes[r].size(), 1u) << "rank " << r;
    EXPECT_EQ(processes[r][0].rfind("rank " + std::to_string(r) + " (", 0), 0u) << processes[r][0];
    // Row 3 is the gradient buckets' (one bucket here: none).
    const std::map<int, std::string> names{
        {0, "tower 0 (cpu)"}, {1, "tower 1 (cpu)"}, {2, "master (cpu)"}, {4, "processes"}};
    for (const auto& [row, name] : names) {
      EXPECT_EQ(rows[std::pair(r, row)], std::vector<std::string>{name})
          << "rank " << r << " row " << row;
      EXPECT_GT(spans[std::pair(r, row)], 0) << "rank " << r << " row " << row;
    }
  }
  EXPECT_EQ(rows.size(), std::size_t(kRanks) * 4);
  // Gradients, no moving statistics, kRanks x kTowers losses, kRanks batch sizes.
  const std::int64_t floats = model.vars.trainable_numel() + kRanks * kTowers + kRanks;
  EXPECT_EQ(all_reduce_bytes, std::set<std::int64_t>{floats * 4});
  // The ranks leave each step's all-reduce together: their ends agree to well
  // within kLate.
  ASSERT_EQ(all_reduce_ends.size(), std::size_t(kSteps));
  for (const auto& [step, ends] : all_reduce_ends) {
    ASSERT_EQ(ends.size(), std::size_t(kRanks)) << "step " << step;
    const auto [low, high] = std::minmax_element(ends.begin(), ends.end());
    EXPECT_LT(*high - *low, 100.0) << "step " << step << ": the ranks' all-reduce ends (ms)";
  }
}

TEST(MultiRankTrace, FailingWriteOnRankZeroFailsEveryRankWithItsError) {
  Mlp model;
  ScratchDir dir;
  const std::string path = dir.file("no/such/dir/trace.json");
  const auto errors = trace_ranks(model, dir, path);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_NE(errors[std::size_t(r)].find(path), std::string::npos) << "rank " << r;
    EXPECT_EQ(errors[std::size_t(r)], errors[0]) << "rank " << r;
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{});
}

}  // namespace
}  // namespace towerlab::testing
