// Internal (not installed): a sharded master, the ZeRO stage 1/2 layout inside one
// process (TrainerOptions::master_placement, MasterPlacement::Sharded).
//
// n towers, the flat trainable buffer of L values cut by the ring's schedule
// (parallel/ring_schedule.h): tower k owns chunk RingSchedule::summed_at(k), the
// chunk whose complete sum the ring's reduce-scatter leaves at tower k (chunk k+1
// mod n). Every tower owns one slice, a tower without samples in an uneven batch
// too (its gradient is zeros, its slice is updated all the same), and a variable
// may span two slices or more: the optimizer is element-wise, so where a slice
// starts changes no value.
//
// Tower k holds, on its own device: the FP32 master values of its slice and the
// optimizer's slots of its slice (an Optimizer of its own, with the trainer's
// hyper-parameters and step count). A step:
//   reduce-scatter (Ring::reduce_scatter_range): tower k's flat gradient holds the
//     sum of its slice, in the all-reduce's order, so to its bits;
//   update (update()): on tower k's stream, the optimizer on its slice of the
//     master values and slots, then the new values into its replica's slice;
//   all-gather (Ring::all_gather): every replica receives every slice.
// Each element takes the arithmetic the master on one device gives it, so the
// values, the slots and the next losses are those bits. The guard's decision is
// one for all: each tower finds the first non-finite element of its own slice
// (first_nonfinite()), and the trainer takes the smallest index of all before any
// tower updates, which is the whole gradient's first non-finite element.
//
// scatter() and gather() move a whole master (values and slots, on any device)
// into the slices and back: the trainer's host copy that master(), optimizer(),
// the checkpoints and broadcast() read and write (parallel/trainer.h).
//
// Across P processes of M towers (host-staged), the P*M towers of the job own one
// slice each, and every element is summed in the order the master on the host
// sums it. That master's element i is summed twice: inside its process by the
// towers' ring (the order chunk i's of the gradient, over M), then by phase 5's
// allreduce_sum of the exchange buffer (parallel/process_exchange.h), whose ring
// over the processes sums chunk c of that whole buffer in the order rank c, c+1,
// ..., c-1 and finishes it at rank c-1 (parallel/cluster.h). So:
//   1. each tower's reduce-scatter inside the process leaves it its ring chunk's
//      sum, with the in-process all-reduce's bits; the trainer stages every
//      tower's chunk into the exchange buffer, which then holds what tower 0's
//      all-reduced gradient would put there;
//   2. ProcessGroup::reduce_scatter_sum on the gradient range, framed by the whole
//      exchange buffer, is the first half of that same ring: rank r then holds the
//      finished sum of the gradient's part of chunk summed_at(r) of the exchange
//      buffer, to the bits of the all-reduce (the rest of the buffer, statistics,
//      losses and batch sizes, takes allreduce_sum framed alike: the same bits too);
//   3. process r owns that part (sharded_slices()), cut into M balanced pieces,
//      piece k tower k's: tower k reads its piece of the sums from the host buffer
//      into its flat gradient, updates it, and writes its new values back;
//   4. ProcessGroup::allgather_chunks of the values, framed alike, gives every
//      process every slice, and the trainer copies them to every replica.
// Which tower of a process owns a piece changes no bit (the sums are finished on
// the host before any tower reads them); which process owns it is fixed by where
// the ring finishes its sum. The exchange buffer's last chunk also holds the
// statistics, losses and batch sizes, so the last process's slices are smaller by
// those few elements. On NCCL (parallel/sharded_nccl.h) the slices are the same and
// the two halves run on tower 0's device buffers; with three processes or more,
// NCCL's order of the processes' terms replaces the host ring's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../autograd/optimizer.h"
#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "ring_schedule.h"

namespace towerlab {

// Each tower's slice of the flat trainable buffer of `length` values, for
// `towers` towers in each of `ranks` processes, this process being `rank`, and
// phase 5's exchange buffer of `exchange_length` floats whose first `length` are
// the gradient (ignored for one process): with one process, tower k's is chunk
// summed_at(k) of the towers' ring; with several, see the opening comment.
std::vector<RingRange> sharded_slices(std::int64_t length, std::int64_t towers, int ranks = 1,
                                      int rank = 0, std::int64_t exchange_length = 0);

class ShardedMaster {
 public:
  // `slices` (one per tower, of the flat buffer of the trainable values `layout`
  // declares; see sharded_slices()) over towers on `tower_streams`, each with a copy
  // of `optimizer`'s hyper-parameters (its slots and steps come from scatter()).
  // `layout` must outlive this object (the optimizer reads which variables a slice's
  // elements belong to, for WeightDecayOn).
  ShardedMaster(const VariableSet& layout, const std::vector<RingRange>& slices,
                const Optimizer& optimizer, std::vector<const Stream*> tower_streams);

  std::size_t size() const { return shards_.size(); }
  // Tower k's slice of the flat trainable buffer (absolute indices).
  RingRange slice(std::size_t k) const { return shards_[k].range; }

  // Tower k's update, on its stream: the optimizer on its slice from the summed
  // gradient in the same slice of `flat_grads` (tower k's, after the
  // reduce-scatter), then the slice's new values into `replica_values`.
  void update(std::size_t k, const Tensor& flat_grads, const Tensor& replica_values);
  // The index (in the flat buffer) of the first NaN or infinity in tower k's slice
  // of `flat_grads`, or -1. Waits for tower k's stream.
  std::int64_t first_nonfinite(std::size_t k, const Tensor& flat_grads) const;

  // The slices := `values` (flat, L values) and `optimizer`'s slots and step count
  // (ready on `stream`). Returns when every copy is done.
  void scatter(const Tensor& values, const Optimizer& optimizer, const Stream& stream);
  // The reverse: every slice into `values` (on `stream`'s device).
  void gather_values(const Tensor& values, const Stream& stream) const;
  // Every slot (L values on `stream`'s device, this process's slices filled in, the
  // others' left as allocated), by name; empty before the first step of an
  // optimizer with slots.
  std::map<std::string, Tensor> gather_slots(const Stream& stream) const;
  // Updates applied so far (every shard's count is the same).
  std::int64_t steps() const { return shards_.front().optimizer.steps(); }
  // The learning rate of the next update.
  double current_lr() const { return shards_.front().optimizer.current_lr(); }

  // Bytes tower k holds: FP32 master values, and optimizer slots.
  std::int64_t value_bytes(std::size_t k) const;
  std::int64_t slot_bytes(std::size_t k) const;

 private:
  struct Shard {
    RingRange range;
    const Stream* stream;
    Tensor values;        // [range.size()] FP32 master values, on the tower's device
    Optimizer optimizer;  // its slots: [range.size()] each
  };
  const VariableSet* layout_;
  std::int64_t length_;  // layout_'s trainable values
  std::vector<Shard> shards_;
};

}  // namespace towerlab
