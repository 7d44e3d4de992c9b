// The processes that train one model together, and the collectives a Trainer
// needs between them.
//
// Inside a process a Trainer reduces its towers' gradients with the ring
// (parallel/ring_allreduce.h). Across processes it makes one more call per step
// on a ProcessGroup: the rank-local sums travel in one all-reduce, and every
// process then applies the same update. A Trainer without a ProcessGroup is one
// process, as before.
//
// Contract of every implementation:
//  - Every process of the group makes the same calls in the same order with the
//    same sizes; `what` names the call ("step 12: gradients") for error messages.
//  - allreduce_sum leaves the same bits on every process, run after run, for a
//    fixed group size: each element is summed in one fixed order and the result
//    is distributed, never re-summed per process.
//  - That order may depend on an element's position in the buffer (a ring sums
//    each chunk starting at another process). A buffer reduced in several calls,
//    one range at a time (gradient buckets, parallel/buckets.h), passes each call
//    its ReduceFrame: the order is then the position's in the whole buffer, so the
//    ranges get the bits one call on the whole buffer would give them.
//  - A call that cannot complete (a process died, stalled past deadline(), or
//    reported an error) throws CommunicationError naming the peer and `what`, on
//    every process that notices; none waits forever. Communicators made over the
//    group (parallel/nccl_communicator.h) wait for their calls as long.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../engine/error.h"

namespace towerlab {

// Where the values of one allreduce_sum lie in the whole buffer of which they are
// a range (see the contract above).
struct ReduceFrame {
  std::size_t offset = 0;  // of the first value, in the whole buffer
  std::size_t total = 0;   // the whole buffer's length; 0: the values are all of it
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;        // 0 .. size()-1
  virtual int size() const = 0;        // processes in the group, >= 1
  virtual int local_rank() const = 0;  // index among the processes of this host
  // How long one call waits for the other processes before it throws.
  virtual std::chrono::milliseconds deadline() const = 0;

  // values[i] = sum over processes of values[i], the same bits on every process.
  // Every process passes the same frame.
  virtual void allreduce_sum(std::span<float> values, std::string_view what,
                             ReduceFrame frame = {}) = 0;
  virtual void allreduce_sum(std::span<double> values, std::string_view what) = 0;

  // The two halves of allreduce_sum, for a master sharded across processes
  // (parallel/sharded_master.h). With S = RingSchedule(size(), total, offset,
  // offset + values.size()), the frame's schedule (parallel/ring_schedule.h), rank
  // r's chunk is S.chunk(S.summed_at(r)):
  //   reduce_scatter_sum: this rank's chunk := the sum over processes, with the bits
  //     allreduce_sum gives it; the rest of `values` is unspecified afterwards.
  //   allgather_chunks: every rank's chunk, as that rank holds it, into every
  //     rank's `values` (copies, no arithmetic).
  // One after the other they are allreduce_sum, to the bits. Every process passes
  // the same frame.
  virtual void reduce_scatter_sum(std::span<float> values, std::string_view what,
                                  ReduceFrame frame = {}) = 0;
  virtual void allgather_chunks(std::span<float> values, std::string_view what,
                                ReduceFrame frame = {}) = 0;

  // Copies root's bytes into every process's `bytes` (same size everywhere).
  virtual void broadcast(std::span<std::byte> bytes, int root, std::string_view what) = 0;

  // Every process's `mine`, in rank order (sizes may differ).
  virtual std::vector<std::string> allgather(std::string_view mine, std::string_view what) = 0;
};

}  // namespace towerlab
