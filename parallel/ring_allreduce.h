// Ring all-reduce: every member ends with the elementwise sum of all members'
// buffers, moving 2(n-1)/n of a buffer in and out of each member, whatever the
// number of members (the bandwidth-optimal schedule of Patarasuk and Yuan).
//
// The buffer of length L is cut into n chunks (sizes differ by at most one; some
// are empty when L < n). With member i sending to member i+1 (mod n):
//   reduce-scatter, steps s = 0..n-2: member i+1 reads chunk (i - s) of member i
//     and adds it into its own chunk (i - s). Afterwards member i holds the
//     complete sum of chunk i+1.
//   all-gather, steps s = 0..n-2: member i+1 copies chunk (i + 1 - s) of member i
//     over its own. Afterwards every member holds every sum.
// Each chunk's sum is accumulated in one fixed order around the ring (chunk k:
// member k's, plus member k+1's, plus member k+2's, ...), so the result is the same
// bits on every run and in every member, however the threads and streams are
// scheduled. The schedule is data in parallel/ring_schedule.h, which the processes'
// ring (parallel/cluster.h) follows too.
//
// Reads. The receiver reads the sender's chunk in place and adds it in one kernel
// (kernels/peer_add.h) when its device can read the sender's memory: on the host,
// on one GPU (virtual devices), or between GPUs with peer access, which the ring
// turns on when it is built. Only between devices that cannot, the chunk is first
// copied into a receive buffer. Per element of a step's chunk that is 3 memory
// passes (read theirs, read mine, write mine) instead of 5, and the all-gather's
// copy is 2: on one device the ring reads and writes 5(n-1) buffer lengths in all
// rather than 7(n-1). Both paths add the same two floats, so they give the same bits.
//
// Ordering. Every access happens on the reader's or writer's own stream; one event
// per member, recorded after each of its steps, orders the two hazards:
//   - read after write: at step s member i+1 reads what member i wrote at step s-1,
//     so every member waits on its predecessor's event before each step (all waits
//     are issued before the step's records, so each captures the previous step).
//   - write after read: member i's chunk (i - s), read by member i+1 at
//     reduce-scatter step s, is next written by member i at all-gather step s, so
//     before its first all-gather step every member waits on its successor's event
//     from the end of the reduce-scatter. No other write can meet a read: within a
//     step member i writes another chunk than the one its successor reads (chunk
//     i-1-s against i-s in the reduce-scatter, i-s against i+1-s in the all-gather),
//     and every chunk it writes is read only at a later step.
// At the end every stream waits for every member, so the buffers may be used (and
// overwritten) at once. No device-wide synchronize. On the CPU a member's stream is
// the host: every member runs its steps on its own thread of the ring (so the
// members of one step run side by side, each step on its own core where there are
// enough), and a barrier after each step gives both orders; chunks under 64 KiB
// are added on the caller's thread alone, step by step, which costs less than
// waking the others. The schedule, and so every sum and its bits, is the one above.
//
// Members that share one GPU (virtual devices) have nothing to send: every chunk is
// in the one memory. There the ring is one launch (kernels/peer_add.h's peer_sum,
// on member 0's stream, after every member's buffer is ready): each element is
// summed in its chunk's ring order, so the bits are the steps', and read once from
// and written once to every member, 2n memory passes where the steps take 5(n-1)
// and 2n(n-1) launches with their events. RingOnOneGpu::Steps keeps the steps there,
// for the trace that shows them and for comparison in tests and benchmarks.
//
// Reduce to member 0 (Ring::reduce): when only member 0 needs the sum (the trainer's
// CPU towers, whose master reads tower 0's gradient and nothing reads the others'),
// members on the host skip the all-gather: the reduce-scatter's last step, in which
// member j adds its own chunk summed_at(j) to the partial sum its predecessor holds,
// writes that complete sum into member 0's buffer instead of its own. Nothing else
// reads member 0's chunk summed_at(j) at that step (only member 1 reads member 0's
// buffer, chunk 2, which is member 1's own destination: it adds in place), so the
// steps' ordering holds; each sum is the same two floats added, so member 0 holds
// the all-reduce's bits, and the other members partial sums. n-1 steps of 3 passes
// over a chunk where the all-reduce takes 2(n-1) and 5 buffer lengths: with two
// members, one step and no all-gather. Elsewhere reduce() is the all-reduce.
//
// Bfloat16 contributions (a Ring built with DType::BFloat16, TrainerOptions::
// reduce_dtype): the reduce-scatter above moves partial sums, which bfloat16 would
// round again at every step. Such a ring's reduce-scatter carries contributions
// instead (parallel/ring_contributions.h): every member rounds its range to
// bfloat16 once, and member j receives every member's bfloat16 chunk
// summed_at(j) and sums them in float32, in member order, into its own buffer;
// the all-gather is the one above, of those float32 sums. Every member then holds
//     ((c_0 + c_1) + c_2) + ... + c_{n-1},   c_m = bfloat16(buffers[m]),
// the same bits on every member and run after run; one member rounds its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "ring_schedule.h"

namespace towerlab {

class ThreadTeam;
class Trace;

// How a member reads its sender's chunk in the reduce-scatter (see "Reads" above).
enum class RingReads {
  InPlace,               // in place wherever the two devices allow, else a copy
  ThroughReceiveBuffer,  // always a copy into a receive buffer, then an add
};

// How members that share one GPU reduce (see "Members that share one GPU" above).
enum class RingOnOneGpu {
  OneLaunch,  // one kernel sums every chunk in the ring's order (up to kPeerSumMembers)
  Steps,      // the ring's steps, as between GPUs
};

class Ring {
 public:
  // One member per stream (repeats of a device are fine: virtual devices). Turns on
  // peer access between neighbouring GPUs where the hardware has it.
  // RingReads::ThroughReceiveBuffer makes every member copy before it adds, as
  // members without peer access must: for comparison in tests and benchmarks (it
  // takes the steps on one GPU too).
  // `contributions`: Float32 (the ring above) or BFloat16 (contributions rounded
  // once, see above); another dtype is NotSupported.
  explicit Ring(std::vector<const Stream*> streams, RingReads reads = RingReads::InPlace,
                RingOnOneGpu one_gpu = RingOnOneGpu::OneLaunch,
                DType contributions = DType::Float32);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // buffers[i] (float32, one length, on streams[i]'s device) := sum of all buffers.
  // When `trace` is given each member's steps are recorded on row `first_row + i`,
  // with the step's chunk index and the bytes it moves into member i.
  void allreduce(const std::vector<Tensor>& buffers, Trace* trace = nullptr, int first_row = 0);
  // The same for elements [begin, end) of the buffers only (a gradient bucket,
  // parallel/buckets.h), with the whole buffers' chunks: chunk k of the range is
  // ring_chunk(length, n, k) within [begin, end), so every element is summed in the
  // order, and to the bits, that allreduce() of the whole buffers gives it. The
  // rest of the buffers is neither read nor written (others may use it meanwhile).
  void allreduce_range(const std::vector<Tensor>& buffers, std::int64_t begin, std::int64_t end,
                       Trace* trace = nullptr, int first_row = 0);

  // The ring's two halves alone, for a sharded master (parallel/sharded_master.h):
  // reduce_scatter_range leaves member j with the sum of chunk
  // RingSchedule::summed_at(j) within [begin, end), in the order and to the bits
  // that allreduce() gives it (the other chunks hold partial sums); all_gather
  // copies each member's chunk summed_at(j) to every other member. The same
  // schedule, steps and ordering as the all-reduce's, one half each; at the end
  // every stream waits for every member, as after allreduce(). On one GPU the
  // reduce-scatter is the all-reduce's one launch (every member then holds every
  // sum, which includes its own chunk's).
  void reduce_scatter_range(const std::vector<Tensor>& buffers, std::int64_t begin,
                            std::int64_t end, Trace* trace = nullptr, int first_row = 0);
  void all_gather(const std::vector<Tensor>& buffers, Trace* trace = nullptr, int first_row = 0);
  // The all-gather of elements [begin, end) only, with the whole buffers' chunks.
  void all_gather_range(const std::vector<Tensor>& buffers, std::int64_t begin, std::int64_t end,
                        Trace* trace = nullptr, int first_row = 0);

  // buffers[0] := sum of all buffers, the all-reduce's bits; the other buffers are
  // left with partial sums ("Reduce to member 0" above). Members on the host only,
  // with float32 sums read in place; any other ring runs allreduce().
  void reduce(const std::vector<Tensor>& buffers, Trace* trace = nullptr, int first_row = 0);

  std::size_t size() const { return streams_.size(); }
  // What the reduce-scatter carries between members: Float32 or BFloat16.
  DType contributions() const { return contributions_; }
  // The bytes the members have received from one another since the ring was built,
  // by the schedule: per step of either phase the chunk's float32 (4 bytes an
  // element); with bfloat16 contributions, in the reduce-scatter, each member's
  // chunk from every other member (2 bytes an element). On one GPU, whose one launch
  // reads the members' buffers in place, it counts what the steps would move, so
  // that the count is the same on every path. Per element of a range over n
  // members: a float32 all-reduce 8(n-1), a bfloat16 one 6(n-1); a reduce-scatter
  // 4(n-1) against 2(n-1).
  std::int64_t bytes_received() const { return bytes_received_.load(); }

 private:
  // The steps of `phases` (both, or one of the two) over [begin, end) of buffers;
  // `into_first`: the reduce-scatter's last step writes into member 0 (reduce()).
  void run(const std::vector<Tensor>& buffers, std::int64_t begin, std::int64_t end,
           std::vector<RingPhase> phases, Trace* trace, int first_row, bool into_first = false);
  // The reduce-scatter of bfloat16 contributions (parallel/ring_contributions.cpp).
  void reduce_scatter_contributions(const std::vector<Tensor>& buffers, std::int64_t begin,
                                    std::int64_t end, Trace* trace, int first_row);

  std::vector<const Stream*> streams_;
  std::vector<Event> done_;  // one per member, recorded after each of its steps
  // in_place_[i]: member i reads member i-1's chunks in place (else through a copy).
  std::vector<bool> in_place_;
  bool all_host_ = true;
  bool one_launch_ = false;  // every member on one GPU, summed by peer_sum
  DType contributions_ = DType::Float32;
  std::atomic<std::int64_t> bytes_received_{0};
  std::unique_ptr<ThreadTeam> team_;  // one thread per member when every member is on the host
};

// The reduction of TensorFlow 1.x's multi-GPU tutorial (average_gradients on one
// device), for comparison with the ring (no ring: one member does all the adding):
// every buffer is copied to member `root`, summed there in member order, and the
// sum copied back to every member. buffers[i] (float32, one shape) is on
// streams[i]'s device; every stream may use its buffer when it returns, as after
// Ring::allreduce. A root copies 2(n-1) buffers where a ring member moves 2(n-1)/n
// of one.
void reduce_and_broadcast(const std::vector<const Stream*>& streams,
                          const std::vector<Tensor>& buffers, std::size_t root = 0);

}  // namespace towerlab
