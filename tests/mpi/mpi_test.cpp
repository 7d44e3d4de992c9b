// The MPI process group and collective checkpoints, run by mpirun with several
// ranks (tests/mpi/CMakeLists.txt starts each case; every rank runs the same
// tests in the same order, so their collectives pair up). Run without mpirun, the
// binary is a group of one and the same tests pass.
//
// Failure cases (Failure.*) break the group on purpose; each runs in an mpirun of
// its own, and TOWERLAB_MPI_DEADLINE_S sets a short deadline for them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "parallel/ring_schedule.h"
#include "towerlab.h"

namespace towerlab::testing {
namespace {

Cluster* g_cluster = nullptr;

Cluster& cluster() {
  return *g_cluster;
}

// Rank r's values: magnitudes from 1e-3 to 1e5 and both signs, so that the order
// of a float sum changes its rounding.
template <typename T>
std::vector<T> values_of(int rank, std::size_t n, unsigned salt) {
  std::mt19937 gen(1000u * unsigned(rank) + salt);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-3, 5);
  std::vector<T> v(n);
  for (T& x : v) x = T(mantissa(gen) * std::pow(10.0, exponent(gen)));
  return v;
}

// The sum the ring promises: element i of chunk c added in the order c, c+1, ...
template <typename T>
std::vector<T> ring_order_sum(int size, std::size_t n, unsigned salt) {
  std::vector<std::vector<T>> all;
  for (int r = 0; r < size; ++r) all.push_back(values_of<T>(r, n, salt));
  std::vector<T> sum(n);
  for (int c = 0; c < size; ++c) {
    for (std::size_t i = n * std::size_t(c) / std::size_t(size);
         i < n * std::size_t(c + 1) / std::size_t(size); ++i) {
      T s = all[std::size_t(c)][i];
      for (int k = 1; k < size; ++k) s = all[std::size_t((c + k) % size)][i] + s;
      sum[i] = s;
    }
  }
  return sum;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
void check_allreduce(std::size_t n, unsigned salt) {
  Cluster& group = cluster();
  // Guards on both sides: the call touches exactly the span it is given.
  constexpr T kGuard = T(-7777.0);
  std::vector<T> buffer(n + 2, kGuard);
  const std::vector<T> mine = values_of<T>(group.rank(), n, salt);
  std::copy(mine.begin(), mine.end(), buffer.begin() + 1);
  group.allreduce_sum(std::span<T>(buffer.data() + 1, n), "test: all-reduce");
  EXPECT_EQ(buffer.front(), kGuard);
  EXPECT_EQ(buffer.back(), kGuard);
  const std::vector<T> result(buffer.begin() + 1, buffer.end() - 1);
  const std::vector<T> expected = ring_order_sum<T>(group.size(), n, salt);
  EXPECT_EQ(bytes_of(result), bytes_of(expected)) << "n = " << n;
  // The same bits on every rank.
  const auto all = group.allgather(bytes_of(result), "test: compare results");
  for (int r = 0; r < group.size(); ++r)
    EXPECT_EQ(all[std::size_t(r)], all[0]) << "rank " << r << ", n = " << n;
}

TEST(Collectives, AllreduceSumsInTheRingOrderWithTheSameBitsOnEveryRank) {
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(2), std::size_t(7),
                        std::size_t(1000), std::size_t(300001)}) {
    check_allreduce<float>(n, unsigned(n));
    check_allreduce<double>(n, unsigned(n) + 1);
  }
}

// Control: the comparison above can fail. With three or more ranks, summing in
// plain rank order gives other bits for some elements, so a ring that summed in
// another order would be caught.
TEST(Collectives, OrderOfTheSumMattersForTheseValues) {
  const int size = cluster().size();
  if (size < 3) GTEST_SKIP() << "the order of two addends does not change a float sum";
  const std::size_t n = 1000;
  const std::vector<float> ring = ring_order_sum<float>(size, n, 5);
  std::vector<float> plain(n, 0.0f);
  for (int r = 0; r < size; ++r) {
    const std::vector<float> v = values_of<float>(r, n, 5);
    for (std::size_t i = 0; i < n; ++i) plain[i] = r == 0 ? v[i] : plain[i] + v[i];
  }
  EXPECT_NE(bytes_of(ring), bytes_of(plain));
}

// A buffer reduced one range at a time (gradient buckets), each call given its
// frame in the whole buffer: every element gets the bits of the one-call sum.
TEST(Collectives, FramedRangesGetTheBitsOfTheWholeBuffer) {
  Cluster& group = cluster();
  const std::size_t n = 1000;
  std::vector<float> buffer = values_of<float>(group.rank(), n, 11);
  const std::vector<std::size_t> cuts{0, 1, 137, 500, 501, 1000};
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
    group.allreduce_sum(std::span<float>(buffer.data() + cuts[k], cuts[k + 1] - cuts[k]),
                        "test: a range", ReduceFrame{cuts[k], n});
  }
  EXPECT_EQ(bytes_of(buffer), bytes_of(ring_order_sum<float>(group.size(), n, 11)));
}

// The ring's two halves alone (a master sharded across processes runs its update
// between them): reduce_scatter_sum leaves each rank's chunk of the frame with the
// all-reduce's bits, and allgather_chunks then gives every rank all of them.
TEST(Collectives, ReduceScatterThenAllgatherIsTheAllreduce) {
  Cluster& group = cluster();
  const std::size_t n = 1000;
  const std::vector<float> expected = ring_order_sum<float>(group.size(), n, 13);
  for (std::size_t total : {n, n + 301}) {
    std::vector<float> buffer = values_of<float>(group.rank(), n, 13);
    group.reduce_scatter_sum(std::span<float>(buffer), "test: reduce-scatter",
                             ReduceFrame{0, total});
    const RingSchedule schedule(group.size(), std::int64_t(total), 0, std::int64_t(n));
    const RingRange mine = schedule.chunk(schedule.summed_at(group.rank()));
    std::vector<float> framed = values_of<float>(group.rank(), n, 13);
    group.allreduce_sum(std::span<float>(framed), "test: framed all-reduce", ReduceFrame{0, total});
    for (std::int64_t i = mine.begin; i < mine.end; ++i) {
      ASSERT_EQ(std::memcmp(&buffer[std::size_t(i)], &framed[std::size_t(i)], sizeof(float)), 0)
          << "element " << i << " of a frame of " << total;
    }
    group.allgather_chunks(std::span<float>(buffer), "test: all-gather", ReduceFrame{0, total});
    EXPECT_EQ(bytes_of(buffer), bytes_of(framed)) << "a frame of " << total;
    if (total == n) EXPECT_EQ(bytes_of(buffer), bytes_of(expected));
  }
}

TEST(Collectives, RepeatedAllreduceGivesTheSameBits) {
  Cluster& group = cluster();
  std::vector<float> first = values_of<float>(group.rank(), 4099, 9);
  std::vector<float> second = first;
  group.allreduce_sum(std::span<float>(first), "test: first");
  group.allreduce_sum(std::span<float>(second), "test: second");
  EXPECT_EQ(bytes_of(first), bytes_of(second));
}

TEST(Collectives, BroadcastCopiesTheRootsBytesFromEveryRoot) {
  Cluster& group = cluster();
  for (int root = 0; root < group.size(); ++root) {
    std::string text =
        group.rank() == root ? "bytes of rank " + std::to_string(root) : std::string(15, '?');
    text.resize(15, '.');
    group.broadcast(std::as_writable_bytes(std::span<char>(text)), root, "test: broadcast");
    std::string expected = "bytes of rank " + std::to_string(root);
    expected.resize(15, '.');
    EXPECT_EQ(text, expected) << "root " << root;
  }
  std::span<std::byte> nothing;
  group.broadcast(nothing, 0, "test: empty broadcast");
  std::vector<std::byte> none;
  EXPECT_THROW(group.broadcast(none, group.size(), "test: bad root"), InvalidArgument);
}

TEST(Collectives, AllgatherReturnsEveryRanksStringInRankOrder) {
  Cluster& group = cluster();
  // Sizes differ, one is empty.
  const std::string mine =
      group.rank() == 1 ? "" : std::string(std::size_t(group.rank()) + 3, 'a' + char(group.rank()));
  const std::vector<std::string> all = group.allgather(mine, "test: allgather");
  ASSERT_EQ(all.size(), std::size_t(group.size()));
  for (int r = 0; r < group.size(); ++r) {
    const std::string expected = r == 1 ? "" : std::string(std::size_t(r) + 3, 'a' + char(r));
    EXPECT_EQ(all[std::size_t(r)], expected);
  }
  group.barrier("test: barrier");
}

TEST(Collectives, RankSizeAndLocalRankComeFromTheLauncher) {
  Cluster& group = cluster();
  if (const char* size = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(group.size(), std::atoi(size));
    EXPECT_EQ(group.rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
    EXPECT_EQ(group.local_rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")));
    EXPECT_TRUE(group.uses_mpi());
  } else {
    EXPECT_EQ(group.size(), 1);
    EXPECT_FALSE(group.uses_mpi());
  }
  EXPECT_EQ(group.default_device(), cuda_device_count() > 0
                                        ? Device::cuda(group.local_rank() % cuda_device_count())
                                        : Device::cpu());
}

// --- collective checkpoints -------------------------------------------------

const Stream& cpu() {
  return default_stream(Device::cpu());
}

struct Model {
  VariableSet vars;
  Sequential net;
  Tensor images, labels;
  Model() {
    net.add<Conv2d>(vars, "conv1", 1, 4, 3, Conv2dParams{.pad_h = 1, .pad_w = 1}, false);
    net.add<BatchNorm>(vars, "bn1", 4);
    net.add<ReLU>();
    net.add<Flatten>();
    net.add<Linear>(vars, "fc", 4 * 4 * 4, 3);
    images = Tensor::empty({6, 1, 4, 4}, cpu());
    random_normal(images, 9, 0, 0.0f, 1.0f, cpu());
    labels = Tensor::from_host<float>({0, 1, 2, 0, 1, 2}, {6}, cpu());
  }
  void train(VariableStore& store, Optimizer& opt, int steps) {
    for (int i = 0; i < steps; ++i) {
      Tape tape(cpu());
      Context ctx{tape, store, true};
      Var loss = ag::softmax_cross_entropy(net(ctx, tape.constant(images)), tape.constant(labels));
      store.zero_grad(cpu());
      tape.backward(loss);
      opt.step(store, store.flat_grads(), cpu());
    }
  }
};

std::string all_bytes(const VariableStore& store) {
  std::string s;
  for (const VariableSpec& v : store.set().specs())
    s += bytes_of(store.value(v.name).to_host<float>(cpu()));
  return s;
}

std::string slot_bytes(const Optimizer& opt) {
  std::string s;
  for (const auto& [name, flat] : opt.slots()) s += name + bytes_of(flat.to_host<float>(cpu()));
  return s;
}

// A directory every rank names the same: rank 0 creates it and broadcasts its name.
class SharedDir {
 public:
  SharedDir() {
    std::string name(200, '\0');
    if (cluster().rank() == 0) {
      std::string pattern =
          (std::filesystem::temp_directory_path() / "towerlab-mpi-XXXXXX").string();
      if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
      name.replace(0, pattern.size(), pattern);
    }
    cluster().broadcast(std::as_writable_bytes(std::span<char>(name)), 0, "test: directory");
    path_ = name.c_str();
  }
  ~SharedDir() {
    cluster().barrier("test: directory done");
    if (cluster().rank() == 0) std::filesystem::remove_all(path_);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

TEST(CollectiveCheckpoint, SavedByRankZeroLoadsInOneProcessOnTheCpu) {
  SharedDir dir;
  Model m;
  VariableStore store(m.vars, cpu());
  store.initialize(3, cpu());
  Optimizer adam = Optimizer::by_name("adam", 1e-2);
  m.train(store, adam, 2);  // the same on every rank
  const std::string path = dir.file("model.safetensors");
  save_checkpoint(cluster(), path, store, &adam, {{"ranks", std::to_string(cluster().size())}});
  // An ordinary checkpoint: one process, the plain loader, the CPU.
  VariableStore alone(m.vars, cpu());
  alone.initialize(99, cpu());
  Optimizer fresh = Optimizer::by_name("adam", 1e-2);
  const CheckpointInfo info = load_checkpoint(path, alone, &fresh, cpu());
  EXPECT_EQ(info.step, 2);
  EXPECT_EQ(info.metadata.at("ranks"), std::to_string(cluster().size()));
  EXPECT_EQ(all_bytes(alone), all_bytes(store));
  EXPECT_EQ(slot_bytes(fresh), slot_bytes(adam));
}

TEST(CollectiveCheckpoint, LoadReadsOnRankZeroAndGivesEveryRankItsBits) {
  SharedDir dir;
  Model m;
  const std::string path = dir.file("model.safetensors");
  VariableStore saved(m.vars, cpu());
  saved.initialize(5, cpu());
  Optimizer adam = Optimizer::by_name("adam", 1e-2);
  m.train(saved, adam, 3);
  save_checkpoint(cluster(), path, saved, &adam);

  // Every rank starts elsewhere, and only rank 0 is given a file that exists: the
  // others' paths are never read.
  VariableStore store(m.vars, cpu());
  store.initialize(100 + std::uint64_t(cluster().rank()), cpu());
  Optimizer opt = Optimizer::by_name("adam", 1e-2);
  const std::string my_path = cluster().rank() == 0 ? path : dir.file("absent.safetensors");
  const CheckpointInfo info = load_checkpoint(cluster(), my_path, store, &opt, cpu());
  EXPECT_EQ(info.step, 3);
  EXPECT_EQ(info.optimizer, "adam");
  EXPECT_EQ(opt.steps(), 3);
  EXPECT_EQ(all_bytes(store), all_bytes(saved));
  EXPECT_EQ(slot_bytes(opt), slot_bytes(adam));
  // And training goes on alike on every rank.
  m.train(store, opt, 1);
  const auto all = cluster().allgather(all_bytes(store), "test: after a step");
  for (const std::string& s : all) EXPECT_EQ(s, all[0]);
}

// Rank 0's error, thrown on every rank with the same type and message.
template <typename ErrorType, typename Call>
void expect_same_error_everywhere(Call call, const std::string& substring) {
  std::string message;
  try {
    call();
    ADD_FAILURE() << "expected an error";
  } catch (const ErrorType& e) {
    message = e.what();
  }
  EXPECT_NE(message.find(substring), std::string::npos) << message;
  const auto all = cluster().allgather(message, "test: compare errors");
  for (const std::string& s : all) EXPECT_EQ(s, all[0]);
}

TEST(CollectiveCheckpoint, FailingSaveFailsEveryRankWithRankZerosError) {
  SharedDir dir;
  Model m;
  VariableStore store(m.vars, cpu());
  store.initialize(3, cpu());
  const std::string path = dir.file("no/such/dir/model.safetensors");
  expect_same_error_everywhere<IoError>([&] { save_checkpoint(cluster(), path, store); },
                                        "cannot save " + path);
  // The group is still usable: a failed save is not a failed collective.
  save_checkpoint(cluster(), dir.file("ok.safetensors"), store);
  EXPECT_TRUE(cluster().rank() != 0 || std::filesystem::exists(dir.file("ok.safetensors")));
}

TEST(CollectiveCheckpoint, FailingLoadFailsEveryRankWithRankZerosError) {
  SharedDir dir;
  Model m;
  VariableStore store(m.vars, cpu());
  store.initialize(3, cpu());
  const std::string before = all_bytes(store);
  expect_same_error_everywhere<IoError>(
      [&] { load_checkpoint(cluster(), dir.file("absent.safetensors"), store, nullptr, cpu()); },
      "absent.safetensors");
  // Another model's file: CheckpointMismatch everywhere, nothing changed.
  VariableSet other_vars;
  Linear other(other_vars, "other", 2, 2);
  VariableStore other_store(other_vars, cpu());
  other_store.initialize(1, cpu());
  save_checkpoint(cluster(), dir.file("other.safetensors"), other_store);
  expect_same_error_everywhere<CheckpointMismatch>(
      [&] { load_checkpoint(cluster(), dir.file("other.safetensors"), store, nullptr, cpu()); },
      "other.safetensors");
  EXPECT_EQ(all_bytes(store), before);
}

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
  // The ranks arrive at the write at different times; their clocks are aligned
  // where they leave it together.
  std::this_thread::sleep_for(std::chrono::milliseconds(100 * cluster().rank()));
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
    EXPECT_LT(*high - *low, 50.0) << "step " << step << ": the ranks' all-reduce ends (ms)";
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

// --- failures: each in an mpirun of its own -----------------------------------

std::int64_t seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
      .count();
}

// The last rank stalls for 3 deadlines before the all-reduce of step 7. The others
// fail after one deadline, naming it and the call; the stalled rank, when it
// comes, fails at once with their reason.
TEST(Failure, StalledRankMakesTheOthersFailAfterTheDeadline) {
  Cluster& group = cluster();
  ASSERT_GE(group.size(), 2);
  const int late = group.size() - 1;
  const auto deadline = group.deadline();
  std::vector<float> grads(1000, 1.0f);
  group.allreduce_sum(std::span<float>(grads), "step 6: gradients");  // all healthy
  if (group.rank() == late) std::this_thread::sleep_for(3 * deadline);
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    group.allreduce_sum(std::span<float>(grads), "step 7: gradients");
    ADD_FAILURE() << "expected CommunicationError";
  } catch (const CommunicationError& e) {
    message = e.what();
  }
  std::fprintf(stderr, "rank %d: %s\n", group.rank(), message.c_str());
  EXPECT_NE(message.find("step 7: gradients"), std::string::npos) << message;
  EXPECT_NE(message.find("rank " + std::to_string(late) + " did not arrive within"),
            std::string::npos)
      << message;
  if (group.rank() == late) {
    EXPECT_LE(seconds_since(start), 1);  // told by the others, not by its own deadline
  } else {
    EXPECT_LE(seconds_since(start), 2 * deadline.count() / 1000 + 2);
  }
  // Broken for good: the next call repeats the cause.
  EXPECT_THROW(group.barrier("step 8: after"), CommunicationError);
  // Stay until the late rank has seen the notice: over TCP, Open MPI ends a
  // process whose peer has exited at its next call, before it could report.
  if (group.rank() != late) std::this_thread::sleep_for(3 * deadline);
}

// Rank 1 calls an all-reduce of another size: every rank stops with one message
// naming it, instead of a wrong sum or a hang.
TEST(Failure, MismatchedCallIsNamedOnEveryRank) {
  Cluster& group = cluster();
  ASSERT_GE(group.size(), 2);
  std::vector<float> grads(group.rank() == 1 ? 999 : 1000, 1.0f);
  try {
    group.allreduce_sum(std::span<float>(grads), "step 3: gradients");
    ADD_FAILURE() << "expected CommunicationError";
  } catch (const CommunicationError& e) {
    std::fprintf(stderr, "rank %d: %s\n", group.rank(), e.what());
    EXPECT_NE(std::string(e.what()).find("step 3: gradients"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("999 floats"), std::string::npos) << e.what();
  }
}

// Rank 1 dies before step 5. Under `mpirun --enable-recovery` the others live on
// and stop with a message naming rank 1 and the call (the ctest case checks the
// output; without the option mpirun ends the job itself and names the rank).
TEST(Failure, KilledRankMakesTheOthersStop) {
  Cluster& group = cluster();
  ASSERT_GE(group.size(), 2);
  std::vector<float> grads(1000, 1.0f);
  group.allreduce_sum(std::span<float>(grads), "step 4: gradients");
  if (group.rank() == 1) std::raise(SIGKILL);
  try {
    group.allreduce_sum(std::span<float>(grads), "step 5: gradients");
    ADD_FAILURE() << "expected CommunicationError";
  } catch (const CommunicationError& e) {
    std::fprintf(stderr, "rank %d: %s\n", group.rank(), e.what());
    const std::string message = e.what();
    EXPECT_NE(message.find("step 5: gradients"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
  }
}

// Rank 1 is stopped by SIGTERM between two calls (as mpirun stops a rank when
// another dies). It says which call it finished last and ends by SIGTERM; mpirun
// then stops rank 0, which says which call it was waiting in (the ctest case
// checks both lines).
TEST(Failure, TerminatedRankSaysWhereItWas) {
  Cluster& group = cluster();
  ASSERT_GE(group.size(), 2);
  std::vector<float> grads(1000, 1.0f);
  group.allreduce_sum(std::span<float>(grads), "step 4: gradients");
  if (group.rank() == 1) std::raise(SIGTERM);
  try {
    group.allreduce_sum(std::span<float>(grads), "step 5: gradients");
    ADD_FAILURE() << "expected CommunicationError or SIGTERM";
  } catch (const CommunicationError& e) {
    std::fprintf(stderr, "rank %d: %s\n", group.rank(), e.what());
  }
}

}  // namespace
}  // namespace towerlab::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  towerlab::Cluster cluster;
  towerlab::testing::g_cluster = &cluster;
  return RUN_ALL_TESTS();
}
