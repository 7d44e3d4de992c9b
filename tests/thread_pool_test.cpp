// The host thread pool: exact coverage of the range, nested and concurrent
// callers (which must run inline rather than deadlock), errors, and settings.
#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/thread_pool.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// Restores the pool's size when a test ends, whatever it set.
class ThreadPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = num_threads(); }
  void TearDown() override { set_num_threads(saved_); }

 private:
  int saved_ = 1;
};

TEST_F(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    for (std::int64_t size : {0, 1, 2, 3, 7, 64, 1001}) {
      const std::int64_t begin = 5;
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(size));
      std::atomic<int> chunks{0};
      parallel_for(begin, begin + size, [&](std::int64_t lo, std::int64_t hi) {
        EXPECT_LT(lo, hi);
        ++chunks;
        for (std::int64_t i = lo; i < hi; ++i) ++hits[static_cast<std::size_t>(i - begin)];
      });
      for (std::int64_t i = 0; i < size; ++i) {
        ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1)
            << "index " << i << " of " << size << " with " << threads << " threads";
      }
      EXPECT_LE(chunks.load(), std::max<std::int64_t>(1, std::min<std::int64_t>(threads, size)));
    }
  }
}

TEST_F(ThreadPoolTest, UsesSeveralThreadsWhenAsked) {
  set_num_threads(2);
  std::atomic<int> chunks{0};
  parallel_for(0, 100, [&](std::int64_t, std::int64_t) { ++chunks; });
  EXPECT_EQ(chunks.load(), 2);
}

TEST_F(ThreadPoolTest, NestedCallsRunInline) {
  set_num_threads(3);
  std::vector<std::atomic<int>> hits(50 * 40);
  parallel_for(0, 50, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      std::atomic<int> inner_chunks{0};
      parallel_for(0, 40, [&](std::int64_t a, std::int64_t b) {
        ++inner_chunks;
        for (std::int64_t j = a; j < b; ++j) ++hits[static_cast<std::size_t>(i * 40 + j)];
      });
      EXPECT_EQ(inner_chunks.load(), 1);  // inline: one chunk, the whole range
    }
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST_F(ThreadPoolTest, ConcurrentCallersAllFinishWithCorrectResults) {
  set_num_threads(2);
  constexpr int kCallers = 4, kRounds = 300;
  std::vector<std::thread> callers;
  std::vector<std::int64_t> totals(kCallers, 0);
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        std::atomic<std::int64_t> sum{0};
        parallel_for(0, 1000, [&](std::int64_t lo, std::int64_t hi) {
          std::int64_t s = 0;
          for (std::int64_t i = lo; i < hi; ++i) s += i;
          sum += s;
        });
        totals[t] += sum.load();
      }
    });
  }
  for (auto& c : callers) c.join();
  for (int t = 0; t < kCallers; ++t) EXPECT_EQ(totals[t], std::int64_t{kRounds} * 999 * 1000 / 2);
}

TEST_F(ThreadPoolTest, ExceptionReachesTheCallerAndThePoolStaysUsable) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for(0, 100,
                            [](std::int64_t lo, std::int64_t hi) {
                              if (lo <= 70 && 70 < hi) throw std::runtime_error("chunk failed");
                            }),
               std::runtime_error);
  std::atomic<int> covered{0};
  parallel_for(0, 100, [&](std::int64_t lo, std::int64_t hi) { covered += hi - lo; });
  EXPECT_EQ(covered.load(), 100);
}

TEST_F(ThreadPoolTest, SettingsAreChecked) {
  EXPECT_THROW_WITH(set_num_threads(-1), InvalidArgument, "set_num_threads: n is -1");
  set_num_threads(0);
  EXPECT_EQ(num_threads(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  set_num_threads(2);
  EXPECT_THROW_WITH(parallel_for(0, 2, [](std::int64_t, std::int64_t) { set_num_threads(1); }),
                    InvalidArgument, "inside a parallel_for");
  EXPECT_EQ(num_threads(), 2);
}

}  // namespace
}  // namespace towerlab::testing
