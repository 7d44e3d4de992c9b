// Ring all-reduce: every member ends with the elementwise sum of all members'
// buffers, moving 2(n-1)/n of a buffer in and out of each member, whatever the
// number of members (the bandwidth-optimal schedule of Patarasuk and Yuan).
//
// The buffer of length L is cut into n chunks (sizes differ by at most one; some
// are empty when L < n). With member i sending to member i+1 (mod n):
//   reduce-scatter, steps s = 0..n-2: member i+1 receives chunk (i - s) of member i
//     into a scratch buffer and adds it into its own chunk (i - s). Afterwards
//     member i holds the complete sum of chunk i+1.
//   all-gather, steps s = 0..n-2: member i+1 receives chunk (i + 1 - s) of member i
//     and copies it over its own. Afterwards every member holds every sum.
// Each chunk's sum is accumulated in one fixed order around the ring, so the result
// is the same bits on every run and in every member, however the threads and
// streams are scheduled.
//
// Ordering. On CUDA each member's work runs on its own stream: member i+1 waits on
// an event member i recorded after its previous step (it reads what that step
// wrote), a member waits for its successor to finish the reduce-scatter before
// overwriting chunks the successor may still be reading, and at the end every
// stream waits for every member, so the buffers may be used at once. Copies between
// two GPUs are peer-to-peer where the hardware allows it (engine/tensor.h). On the
// CPU a member's stream is the host: the members of one step run in parallel on the
// host thread pool and the step's end is the barrier.
#pragma once

#include <memory>
#include <vector>

#include "engine/stream.h"
#include "engine/tensor.h"

namespace towerlab {

class Trace;

class Ring {
 public:
  // One member per stream (repeats of a device are fine: virtual devices).
  explicit Ring(std::vector<const Stream*> streams);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // buffers[i] (float32, one length, on streams[i]'s device) := sum of all buffers.
  // When `trace` is given each member's steps are recorded on row `first_row + i`.
  void allreduce(const std::vector<Tensor>& buffers, Trace* trace = nullptr, int first_row = 0);

  // The seeds' reduction, for comparison: every buffer is copied to member `root`,
  // summed there in member order, and the sum copied back to every member.
  void reduce_to_one(const std::vector<Tensor>& buffers, std::size_t root = 0);

  std::size_t size() const { return streams_.size(); }

 private:
  std::vector<const Stream*> streams_;
  std::vector<Event> done_;  // one per member, recorded after each of its steps
  bool all_host_ = true;
};

// [begin, end) of chunk k of n over length L: balanced, sizes differ by at most one.
std::pair<std::int64_t, std::int64_t> ring_chunk(std::int64_t length, std::int64_t n,
                                                 std::int64_t k);

}  // namespace towerlab
