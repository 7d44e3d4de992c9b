// The ring all-reduce's schedule as data: how a buffer is cut into chunks, and at
// each step which chunk every member sends, receives and reduces. Both rings use
// it, the towers' (parallel/ring_allreduce.h, on streams or host threads) and the
// processes' (parallel/cluster.h, over MPI), so the two cannot drift apart: an
// element's sum is accumulated in the order this schedule gives it, and
// "bucketed and unbucketed steps give the same bits" (parallel/buckets.h) holds for
// both because a range is scheduled with the whole buffer's chunks.
//
// n members, a buffer of L elements, member j sending to member j+1 (mod n):
//   chunk k (0 <= k < n) is [L*k/n, L*(k+1)/n): balanced, sizes differ by at most
//     one, some empty when L < n.
//   reduce-scatter, steps s = 0..n-2: member j receives chunk (j-1-s) from member
//     j-1 and adds it into its own, and sends its chunk (j-s) to member j+1.
//     Afterwards member j holds the complete sum of chunk j+1, accumulated in the
//     fixed order member k's, plus member k+1's, ..., plus member k-1's (chunk k).
//   all-gather, steps s = 0..n-2: member j receives chunk (j-s) from member j-1
//     and copies it over its own, and sends its chunk (j+1-s).
// The reduce-scatter alone leaves member j with the sum of one chunk, j+1: that
// chunk is member j's slice of a sharded master (parallel/sharded_master.h), so
// the shards follow this schedule and a slice's sum has the all-reduce's bits.
// A range [begin, end) of the buffer (a gradient bucket) keeps the whole buffer's
// chunks, each cut to the range: chunk k of the range is chunk k of the buffer
// within [begin, end), so every element is summed in the same order, and to the
// same bits, as in a reduction of the whole buffer.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace towerlab {

// [begin, end) of chunk k of n over length L: balanced, sizes differ by at most one.
std::pair<std::int64_t, std::int64_t> ring_chunk(std::int64_t length, std::int64_t n,
                                                 std::int64_t k);

enum class RingPhase { ReduceScatter, AllGather };

// One step of one member.
struct RingStep {
  RingPhase phase = RingPhase::ReduceScatter;
  std::int64_t index = 0;    // s, 0..n-2 within its phase
  std::int64_t send = 0;     // the chunk its successor receives from it
  std::int64_t receive = 0;  // the chunk it receives from its predecessor: added
                             // into its own (reduce-scatter) or copied over it
};

// Elements [begin, end) of a buffer (may be empty).
struct RingRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};

class RingSchedule {
 public:
  // `members` (>= 1) reducing elements [begin, end) of buffers of `length`
  // elements; throws InvalidArgument for a range outside the buffer.
  RingSchedule(std::int64_t members, std::int64_t length, std::int64_t begin, std::int64_t end);
  RingSchedule(std::int64_t members, std::int64_t length)
      : RingSchedule(members, length, 0, length) {}

  std::int64_t members() const { return members_; }
  std::int64_t steps_per_phase() const { return members_ - 1; }
  // Step s of `phase` for `member` (any integer: taken mod n).
  RingStep step(std::int64_t member, RingPhase phase, std::int64_t s) const;
  // Every step of `member` in the order it takes them: the reduce-scatter's, then
  // the all-gather's.
  std::vector<RingStep> steps(std::int64_t member) const;
  // Chunk k (taken mod n) of the whole buffer, cut to the range: absolute indices
  // into the buffer, possibly empty.
  RingRange chunk(std::int64_t k) const;
  // The chunk whose complete sum the reduce-scatter leaves at `member` (any
  // integer: taken mod n): chunk member+1, mod n.
  std::int64_t summed_at(std::int64_t member) const;
  // The size of the largest chunk() (a receive buffer's).
  std::int64_t largest_chunk() const;

 private:
  std::int64_t members_, length_, begin_, end_;
};

}  // namespace towerlab
