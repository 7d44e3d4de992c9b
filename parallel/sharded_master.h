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

class ShardedMaster {
 public:
  // Slices of the trainable values `layout` declares over towers on `tower_streams`,
  // each with a copy of `optimizer`'s hyper-parameters (its slots and steps come from
  // scatter()). `layout` must outlive this object (the optimizer reads which
  // variables a slice's elements belong to, for WeightDecayOn).
  ShardedMaster(const VariableSet& layout, const Optimizer& optimizer,
                std::vector<const Stream*> tower_streams);

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
  // Every slot, whole (L values on `stream`'s device), by name; empty before the
  // first step of an optimizer with slots.
  std::map<std::string, Tensor> gather_slots(const Stream& stream) const;
  // Updates applied so far (every shard's count is the same).
  std::int64_t steps() const { return shards_.front().optimizer.steps(); }

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
  std::vector<Shard> shards_;
};

}  // namespace towerlab
