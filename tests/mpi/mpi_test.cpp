// The MPI process group and collective checkpoints, run by mpirun with several
// ranks (tests/mpi/CMakeLists.txt starts each case; every rank runs the same
// tests in the same order, so their collectives pair up). Run without mpirun, the
// binary is a group of one and the same tests pass. Training across the ranks:
// mpi_training_test.cpp; failures: mpi_failure_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "mpi_test.h"
#include "parallel/ring_schedule.h"
#include "towerlab.h"

namespace towerlab::testing {
namespace {

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

}  // namespace
}  // namespace towerlab::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  towerlab::Cluster cluster;
  towerlab::testing::g_cluster = &cluster;
  return RUN_ALL_TESTS();
}
