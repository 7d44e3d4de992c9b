// The host thread pool: exact coverage of the range, nested callers (which must run
// inline rather than deadlock), concurrent callers and their thread shares,
// errors, and settings.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/thread_pool.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class ThreadPoolTest : public RestoresThreadCount {};

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

TEST_F(ThreadPoolTest, ThreadShareSplitsThePoolAndRestoresTheOldShare) {
  set_num_threads(5);
  EXPECT_EQ(thread_share(), 5);
  {
    const ThreadShare first(0, 2);
    EXPECT_EQ(thread_share(), 3);  // 5 / 2, and the remainder to the first index
    {
      const ThreadShare inner(1, 2);
      EXPECT_EQ(thread_share(), 2);
    }
    EXPECT_EQ(thread_share(), 3);
    set_num_threads(7);  // the share follows the pool's size
    EXPECT_EQ(thread_share(), 4);
  }
  EXPECT_EQ(thread_share(), 7);
  set_num_threads(2);
  const ThreadShare third(2, 3);  // more towers than threads: each keeps its own
  EXPECT_EQ(thread_share(), 1);
  std::atomic<int> chunks{0};
  parallel_for(0, 100, [&](std::int64_t, std::int64_t) { ++chunks; });
  EXPECT_EQ(chunks.load(), 1);  // inline
  EXPECT_THROW_WITH(ThreadShare(3, 3), InvalidArgument, "ThreadShare: thread 3 of 3");
  EXPECT_THROW_WITH(ThreadShare(0, 0), InvalidArgument, "ThreadShare: thread 0 of 0");
}

// Two "towers" with their shares of a 4-thread pool each call parallel_for over
// and over: each call splits into at most its share's chunks, and no more than 4
// chunks ever run at once. Without the shares, the first caller to reach the pool
// would take all 4 threads while the other ran its own chunk beside them.
TEST_F(ThreadPoolTest, TowersWithSharesNeverRunMoreThreadsThanThePool) {
  set_num_threads(4);
  constexpr int kTowers = 2, kRounds = 40;
  std::atomic<int> running{0}, most_running{0}, most_chunks{0};
  std::vector<std::thread> towers;
  std::vector<std::int64_t> covered(kTowers, 0);
  for (int t = 0; t < kTowers; ++t) {
    towers.emplace_back([&, t] {
      const ThreadShare share(t, kTowers);
      for (int round = 0; round < kRounds; ++round) {
        std::atomic<int> chunks{0};
        std::atomic<std::int64_t> items{0};
        parallel_for(0, 64, [&](std::int64_t lo, std::int64_t hi) {
          ++chunks;
          const int now = ++running;
          for (int m = most_running.load();
               now > m && !most_running.compare_exchange_weak(m, now);) {
          }
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          items += hi - lo;
          --running;
        });
        for (int m = most_chunks.load();
             chunks > m && !most_chunks.compare_exchange_weak(m, chunks.load());) {
        }
        covered[std::size_t(t)] += items.load();
      }
    });
  }
  for (auto& t : towers) t.join();
  for (int t = 0; t < kTowers; ++t) EXPECT_EQ(covered[std::size_t(t)], 64 * kRounds);
  EXPECT_EQ(most_chunks.load(), 2);
  EXPECT_LE(most_running.load(), 4);
}

// A group's members share the pool in proportion to their own shares while they
// run, and lend the shares of those that have finished to the rest (the members
// here end one after another on one thread: only the group's count matters).
TEST_F(ThreadPoolTest, ThreadShareGroupLendsTheSharesOfFinishedMembers) {
  set_num_threads(5);
  ThreadShareGroup group;
  group.start(3);  // own shares 2, 2, 1
  {
    const ThreadShare last(2, 3, group);
    EXPECT_EQ(thread_share(), 1);  // all three running: 5 * 1 / 5
  }
  {
    const ThreadShare first(0, 3, group);
    EXPECT_EQ(thread_share(), 2);  // members 0 and 1 running: 5 * 2 / 4
    {
      const ThreadShare second(1, 3, group);
      EXPECT_EQ(thread_share(), 2);
    }
    EXPECT_EQ(thread_share(), 5);  // member 0 alone: the whole pool
  }
  EXPECT_EQ(thread_share(), 5);  // no share at all

  set_num_threads(2);
  group.start(4);  // more members than threads: one thread each
  {
    const ThreadShare a(0, 4, group);
    EXPECT_EQ(thread_share(), 1);
  }
  {
    const ThreadShare b(1, 4, group);
    EXPECT_EQ(thread_share(), 1);  // 2 * 1 / 3
  }
  {
    const ThreadShare c(2, 4, group);
    EXPECT_EQ(thread_share(), 1);  // 2 * 1 / 2
  }
  const ThreadShare d(3, 4, group);
  EXPECT_EQ(thread_share(), 2);  // alone
  std::atomic<int> chunks{0};
  parallel_for(0, 100, [&](std::int64_t, std::int64_t) { ++chunks; });
  EXPECT_EQ(chunks.load(), 2);
  EXPECT_THROW_WITH(group.start(0), InvalidArgument, "ThreadShareGroup::start: 0 members");
}

// Two towers of a group on a 4-thread pool: while both run, each call splits into
// its own share's chunks (2) and no more than 4 chunks ever run at once; once the
// second tower is done, the first one's calls take all 4 threads.
TEST_F(ThreadPoolTest, AGroupNeverRunsMoreThreadsThanThePoolAndLendsIdleCores) {
  set_num_threads(4);
  constexpr int kRounds = 20;
  ThreadShareGroup group;
  group.start(2);
  std::atomic<int> running{0}, most_running{0};
  std::atomic<bool> second_done{false};
  std::vector<int> chunks_together, chunks_alone;
  auto call = [&] {
    std::atomic<int> chunks{0};
    parallel_for(0, 64, [&](std::int64_t, std::int64_t) {
      ++chunks;
      const int now = ++running;
      for (int m = most_running.load(); now > m && !most_running.compare_exchange_weak(m, now);) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      --running;
    });
    return chunks.load();
  };
  std::thread second([&] {
    {
      const ThreadShare share(1, 2, group);
      for (int round = 0; round < kRounds; ++round) call();
    }
    second_done = true;
  });
  {
    const ThreadShare share(0, 2, group);
    for (int round = 0; round < kRounds; ++round) chunks_together.push_back(call());
    second.join();
    ASSERT_TRUE(second_done.load());
    for (int round = 0; round < kRounds; ++round) chunks_alone.push_back(call());
  }
  // While the second tower may still run, at most the own share; alone, all four.
  for (int c : chunks_together) EXPECT_LE(c, 4);
  EXPECT_EQ(chunks_together.front(), 2);  // the second tower counts from the start
  for (int c : chunks_alone) EXPECT_EQ(c, 4);
  EXPECT_LE(most_running.load(), 4);
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
