#include "parallel/ring_schedule.h"

#include <algorithm>

#include "engine/error.h"

namespace towerlab {

std::pair<std::int64_t, std::int64_t> ring_chunk(std::int64_t length, std::int64_t n,
                                                 std::int64_t k) {
  return {length * k / n, length * (k + 1) / n};
}

RingSchedule::RingSchedule(std::int64_t members, std::int64_t length, std::int64_t begin,
                           std::int64_t end)
    : members_(members), length_(length), begin_(begin), end_(end) {
  TL_CHECK(members >= 1, InvalidArgument, "ring schedule: " << members << " members");
  TL_CHECK(0 <= begin && begin <= end && end <= length, InvalidArgument,
           "ring schedule: range [" << begin << ", " << end << ") of buffers of " << length
                                    << " elements");
}

RingStep RingSchedule::step(std::int64_t member, RingPhase phase, std::int64_t s) const {
  const auto mod = [n = members_](std::int64_t k) { return ((k % n) + n) % n; };
  // The all-gather passes on, one step behind, what the reduce-scatter completed:
  // member j's chunk j+1 first.
  const std::int64_t first_send = phase == RingPhase::ReduceScatter ? member : member + 1;
  return {phase, s, mod(first_send - s), mod(first_send - 1 - s)};
}

std::vector<RingStep> RingSchedule::steps(std::int64_t member) const {
  std::vector<RingStep> all;
  for (RingPhase phase : {RingPhase::ReduceScatter, RingPhase::AllGather}) {
    for (std::int64_t s = 0; s < steps_per_phase(); ++s) all.push_back(step(member, phase, s));
  }
  return all;
}

RingRange RingSchedule::chunk(std::int64_t k) const {
  const auto [first, last] = ring_chunk(length_, members_, ((k % members_) + members_) % members_);
  const std::int64_t from = std::clamp(first, begin_, end_);
  return {from, std::clamp(last, from, end_)};
}

std::int64_t RingSchedule::summed_at(std::int64_t member) const {
  // The last reduce-scatter step adds chunk (member - 1 - (n - 2)) = member + 1 - n.
  return step(member, RingPhase::ReduceScatter, members_ - 2).receive;
}

std::int64_t RingSchedule::largest_chunk() const {
  std::int64_t largest = 0;
  for (std::int64_t k = 0; k < members_; ++k) largest = std::max(largest, chunk(k).size());
  return largest;
}

}  // namespace towerlab
