// The ring schedule (parallel/ring_schedule.h) that the towers' ring and the
// processes' ring both follow: its invariants checked on the schedule as data,
// for many member counts, lengths and ranges. The rings' own tests check the sums'
// bits; this one checks the argument they rest on: the chunks tile the buffer, a
// range keeps the whole buffer's chunks, every member adds into every chunk
// exactly once in one fixed order, and the steps the header's event ordering
// relies on are the ones the schedule gives.
#include <algorithm>
#include <map>
#include <vector>

#include "parallel/ring_schedule.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

std::int64_t mod(std::int64_t k, std::int64_t n) {
  return ((k % n) + n) % n;
}

TEST(RingSchedule, ChunksTileTheBufferInOrderWithBalancedSizes) {
  for (std::int64_t n = 1; n <= 9; ++n) {
    for (std::int64_t length : {0, 1, 2, 5, 7, 8, 9, 16, 17, 100, 1001}) {
      const RingSchedule schedule(n, length);
      std::int64_t at = 0, smallest = length, largest = 0;
      for (std::int64_t k = 0; k < n; ++k) {
        const RingRange c = schedule.chunk(k);
        EXPECT_EQ(c.begin, at) << "n " << n << " length " << length << " chunk " << k;
        EXPECT_LE(c.begin, c.end);
        at = c.end;
        smallest = std::min(smallest, c.size());
        largest = std::max(largest, c.size());
        EXPECT_EQ(schedule.chunk(k + n).begin, c.begin);  // taken mod n
        EXPECT_EQ(schedule.chunk(k - n).end, c.end);
      }
      EXPECT_EQ(at, length) << "n " << n << " length " << length;
      EXPECT_LE(largest - smallest, 1) << "n " << n << " length " << length;
      EXPECT_EQ(schedule.largest_chunk(), largest);
    }
  }
}

TEST(RingSchedule, ARangeKeepsTheWholeBuffersChunks) {
  const std::int64_t length = 23;
  for (std::int64_t n = 1; n <= 6; ++n) {
    const RingSchedule whole(n, length);
    for (std::int64_t begin = 0; begin <= length; ++begin) {
      for (std::int64_t end = begin; end <= length; ++end) {
        const RingSchedule range(n, length, begin, end);
        std::int64_t covered = 0, largest = 0;
        for (std::int64_t k = 0; k < n; ++k) {
          const RingRange c = range.chunk(k), w = whole.chunk(k);
          // Chunk k of the range is chunk k of the whole buffer, cut to the range.
          EXPECT_EQ(c.size(),
                    std::max<std::int64_t>(0, std::min(w.end, end) - std::max(w.begin, begin)));
          if (c.size() > 0) {
            EXPECT_EQ(c.begin, std::max(w.begin, begin));
            EXPECT_EQ(c.end, std::min(w.end, end));
          }
          EXPECT_TRUE(begin <= c.begin && c.end <= end);
          covered += c.size();
          largest = std::max(largest, c.size());
        }
        EXPECT_EQ(covered, end - begin) << "n " << n << " [" << begin << ", " << end << ")";
        EXPECT_EQ(range.largest_chunk(), largest);
      }
    }
  }
  EXPECT_THROW_WITH(RingSchedule(3, 10, 4, 11), InvalidArgument,
                    "ring schedule: range [4, 11) of buffers of 10 elements");
  EXPECT_THROW_WITH(RingSchedule(0, 10), InvalidArgument, "ring schedule: 0 members");
}

TEST(RingSchedule, EveryMemberTakesTheStepsOfBothPhasesInOrder) {
  for (std::int64_t n = 1; n <= 9; ++n) {
    const RingSchedule schedule(n, 100);
    EXPECT_EQ(schedule.steps_per_phase(), n - 1);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::vector<RingStep> steps = schedule.steps(j);
      ASSERT_EQ(std::int64_t(steps.size()), 2 * (n - 1));
      for (std::int64_t s = 0; s < n - 1; ++s) {
        const RingStep& rs = steps[std::size_t(s)];
        const RingStep& ag = steps[std::size_t(n - 1 + s)];
        EXPECT_EQ(rs.phase, RingPhase::ReduceScatter);
        EXPECT_EQ(ag.phase, RingPhase::AllGather);
        EXPECT_EQ(rs.index, s);
        EXPECT_EQ(ag.index, s);
        for (const RingStep& at : {rs, ag}) {
          const RingStep same = schedule.step(j, at.phase, at.index);
          EXPECT_EQ(same.send, at.send);
          EXPECT_EQ(same.receive, at.receive);
          // What a member receives is what its predecessor sends at the same step.
          EXPECT_EQ(at.receive, schedule.step(j - 1, at.phase, at.index).send)
              << "n " << n << " member " << j << " step " << s;
          EXPECT_EQ(schedule.step(j + n, at.phase, at.index).send, at.send);  // mod n
        }
      }
    }
  }
}

// The sums, symbolically: each member's chunk holds the list of members whose
// values it has accumulated, in the order they were added. Stepping every member
// through the schedule must give every member every chunk summed over all members
// once each, chunk k in the order k, k+1, ..., k-1: one fixed order, the same in
// every member, which is what makes the bits the same everywhere.
TEST(RingSchedule, EveryChunkIsSummedOnceOverEveryMemberInOneFixedOrder) {
  for (std::int64_t n = 1; n <= 9; ++n) {
    const RingSchedule schedule(n, 1000);
    using Sum = std::vector<std::int64_t>;
    std::vector<std::vector<Sum>> held(static_cast<std::size_t>(n),
                                       std::vector<Sum>(static_cast<std::size_t>(n)));
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t k = 0; k < n; ++k) held[std::size_t(j)][std::size_t(k)] = {j};
    }
    for (RingPhase phase : {RingPhase::ReduceScatter, RingPhase::AllGather}) {
      for (std::int64_t s = 0; s < schedule.steps_per_phase(); ++s) {
        // Every member of a step reads what its predecessor held before the step.
        const auto before = held;
        for (std::int64_t j = 0; j < n; ++j) {
          const RingStep at = schedule.step(j, phase, s);
          const Sum& theirs = before[std::size_t(mod(j - 1, n))][std::size_t(at.receive)];
          Sum& mine = held[std::size_t(j)][std::size_t(at.receive)];
          if (phase == RingPhase::ReduceScatter) {
            // The sender's partial sum is complete up to the member before this one.
            ASSERT_EQ(theirs.back(), mod(j - 1, n));
            Sum sum = theirs;
            sum.push_back(j);
            mine = sum;
          } else {
            mine = theirs;
          }
          // Within a step a member never writes the chunk its successor reads.
          EXPECT_NE(at.receive, schedule.step(j + 1, phase, s).receive);
        }
      }
      if (phase == RingPhase::ReduceScatter) {
        // Member j holds the complete sum of chunk j+1.
        for (std::int64_t j = 0; j < n; ++j) {
          EXPECT_EQ(held[std::size_t(j)][std::size_t(mod(j + 1, n))].size(), std::size_t(n))
              << "n " << n << " member " << j;
        }
      }
    }
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t k = 0; k < n; ++k) {
        Sum expected;
        for (std::int64_t m = 0; m < n; ++m) expected.push_back(mod(k + m, n));
        EXPECT_EQ(held[std::size_t(j)][std::size_t(k)], expected)
            << "n " << n << " member " << j << " chunk " << k;
      }
    }
  }
}

// The towers' ring orders "write after read" with one wait before the all-gather:
// the chunk a member sends at reduce-scatter step s is first overwritten by it at
// all-gather step s (parallel/ring_allreduce.h). That holds only for this schedule.
TEST(RingSchedule, ASentChunkIsFirstOverwrittenAtTheSameStepOfTheAllGather) {
  for (std::int64_t n = 2; n <= 9; ++n) {
    const RingSchedule schedule(n, 100);
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t s = 0; s < n - 1; ++s) {
        const std::int64_t sent = schedule.step(j, RingPhase::ReduceScatter, s).send;
        // Written at later reduce-scatter steps? (It must not be: the successor is
        // reading it without a wait.)
        for (std::int64_t later = s + 1; later < n - 1; ++later)
          EXPECT_NE(schedule.step(j, RingPhase::ReduceScatter, later).receive, sent);
        std::int64_t first_gather_write = -1;
        for (std::int64_t g = 0; g < n - 1 && first_gather_write < 0; ++g) {
          if (schedule.step(j, RingPhase::AllGather, g).receive == sent) first_gather_write = g;
        }
        EXPECT_EQ(first_gather_write, s) << "n " << n << " member " << j;
      }
    }
  }
}

}  // namespace
}  // namespace towerlab::testing
