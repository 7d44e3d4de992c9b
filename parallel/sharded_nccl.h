// Internal (not installed): a master sharded across processes on NCCL, the
// device-buffer twin of the host-staged path of parallel/sharded_master.h.
//
// The slices are the host-staged path's (sharded_slices()): process q owns the range
// owned(q) of the flat trainable buffer of L values, cut among its towers. NCCL's
// reduce-scatter and all-gather take P blocks of one length B, block q rank q's, so
// the flat buffer is laid out as blocks, on tower 0's device:
//
//   blocks [P x B]:  block q = flat[owned(q)], then zeros up to B
//                    (B = the largest owned(q); the padding stays zero: its sums
//                    are 0 + 0 and the all-gather copies them)
//
// A step (parallel/trainer_update.cpp, phases 5 and 7):
//   1. every tower's ring chunk (its in-process sum, phase 3) into tower 0's flat
//      gradient, which then holds what the in-process all-reduce gives it;
//   2. reduce_scatter(): block q := flat[owned(q)] for every q, then
//      ncclReduceScatter in place: this process's block holds the sums over the
//      processes of the values it owns;
//   3. each tower reads its slice of those sums (mine()) into its flat gradient and
//      updates it (ShardedMaster::update), then writes its new values into mine();
//   4. all_gather(): ncclAllGather in place, then flat[owned(q)] := block q for
//      every q in tower 0's replica, which the trainer copies to its other towers.
//
// Bits. Inside a process every element takes the host-staged path's sum. Across
// processes it is NCCL's: on the emulated GPUs the ranks' values added in rank order
// (0, 1, ...); the host-staged ring adds chunk c starting at rank c. With two
// processes both are one addition, a + b = b + a: the master on the host's bits,
// as for NCCL's all-reduce (parallel/nccl_communicator.h). With three or more the
// P terms of an element may be added in another order: each order's rounding error
// is at most (P-1) 2^-24 sum_q |x_q|, so the two sums differ by at most twice that,
// and the update carries the difference on. On the emulated GPUs the sharded run
// then has the bits of the unsharded run on NCCL (both add in rank order); a real
// NCCL ring's order depends on the buffer's length and is not promised to match.
#pragma once

#include <string_view>
#include <vector>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "ring_schedule.h"

namespace towerlab {

class NcclCommunicator;

// The range of the flat buffer each process owns (by rank): the union of its
// towers' sharded_slices(), with the same arguments.
std::vector<RingRange> process_slices(std::int64_t length, std::int64_t towers, int ranks,
                                      std::int64_t exchange_length);

class ShardedNccl {
 public:
  // `owned`: process_slices(); this process is `rank`; the blocks live on
  // `stream`'s device (tower 0's, the communicator's).
  ShardedNccl(std::vector<RingRange> owned, int rank, const Stream& stream);

  // Step 2: packs `flat` (tower 0's flat gradient, L values, ready on `stream`) into
  // the blocks and reduce-scatters them; returns with the sums on the device.
  void reduce_scatter(NcclCommunicator& nccl, const Tensor& flat, const Stream& stream,
                      std::string_view what);
  // The part of this process's block that holds `slice` (inside owned(rank)): the
  // sums after reduce_scatter(), the values all_gather() sends.
  Tensor mine(RingRange slice) const;
  // Step 4: all-gathers the blocks and unpacks them into `flat` (tower 0's flat
  // values) on `stream`; returns with the all-gather done, the unpacking queued.
  void all_gather(NcclCommunicator& nccl, const Tensor& flat, const Stream& stream,
                  std::string_view what);

  std::int64_t block() const { return block_; }

 private:
  std::vector<RingRange> owned_;
  int rank_;
  std::int64_t block_ = 0;
  Tensor blocks_;  // [P x block_] on tower 0's device
};

}  // namespace towerlab
