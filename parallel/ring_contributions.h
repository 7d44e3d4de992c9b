// A reduction that carries contributions, not partial sums: how gradients are
// summed under TrainerOptions::reduce_dtype = BFloat16 (docs/precision.md), with
// half the bytes of float32 in what the members send one another.
//
// The specification. Members 0..n-1 (the towers of a process, or the processes of
// a job) hold float32 buffers g_0 .. g_{n-1}; each element's result is
//     sum[i] = ((c_0[i] + c_1[i]) + c_2[i]) + ... + c_{n-1}[i],    c_m[i] = bf16(g_m[i]):
// every contribution rounded to bfloat16 once (to nearest, ties to even; a NaN stays
// a NaN, a value past bfloat16's range an infinity: engine/half.h), then added in
// float32 in member order, starting from member 0's value (so a lone -0 stays -0).
// contribution_sum_reference() below is that, in plain loops; every path is tested
// against it bit for bit (tests/reduce_dtype_test.cpp).
//
// What it costs against the float32 reduction. bfloat16 keeps 8 significant bits,
// so each term's relative error is at most 2^-8 (half an ulp of a value's binade,
// for values in bfloat16's normal range), and
//     |sum - float32 sum| <= (2^-8 + 3 (n-1) 2^-24) sum_m |g_m[i]|,
// the second term being the two float32 sums' own rounding. Where the terms share a
// sign that is 2^-8 of the result; where they cancel it can be all of a small one.
// A float32 sum of a few contributions of similar magnitude is exact (8 significant
// bits each against float32's 24; two within 2^15 of each other, for instance), so
// the order of the sum matters only where the terms lie far apart.
//
// Why the ring's reduce-scatter cannot simply carry bfloat16: it moves partial
// sums (member k's, then k's + k+1's, ...), and each would be rounded again at
// every step: n-1 roundings of growing partial sums, in an order that depends on
// the chunk. Here nothing but a contribution crosses between members, rounded
// once by its own member.
//
// Inside a process (a Ring built with DType::BFloat16, parallel/ring_allreduce.h):
//   1. round: every member casts its range of its buffer to a bfloat16 copy, on its
//      own stream (or host thread);
//   2. reduce-scatter: member j owns chunk RingSchedule::summed_at(j), the chunk the
//      float32 ring leaves summed at j (so a sharded master's slices and the ring's
//      all-gather need nothing else). It reads every member's bfloat16 chunk, in
//      place where it is in its own device's memory (the host, one GPU), else
//      copied into a receive buffer (2 bytes an element where the float32 steps
//      move 4), widens it (exact) and adds it in member order into its own chunk;
//   3. all-gather: the ring's own, of the float32 sums (Ring::all_gather_range).
// The all-gather carries float32, not bfloat16: the only rounding is then each
// contribution's, every member holds the sum the owner computed (a sharded master,
// which updates from the owner's sum and all-gathers new values, sees the same
// gradient as a master on one device), and the contract is the one line above.
// Rounding the sums to bfloat16 too would halve that half's bytes at the price of
// a second rounding of every result. Bytes per member and element of the range:
// the float32 all-reduce 8(n-1)/n, this one 2(n-1)/n + 4(n-1)/n = 6(n-1)/n (3/4);
// a reduce-scatter alone (a sharded master) 4(n-1)/n against 2(n-1)/n (1/2).
// On GPUs the three steps are kernels and copies on the members' streams: each
// member records an event after its rounding, each owner waits for every member's
// before it reads, and at the end every stream waits for every member (no
// member's bfloat16 copy is freed while another reads it). On the host, in one
// memory, owner j rounds every member's values as it reads them and adds them, one
// pass over its chunk and no bfloat16 copies (the same bits: rounding is a function
// of the value), each owner on its own thread of the ring (small ranges: all on
// the caller's thread); the bytes counted are still what the schedule carries.
//
// Across processes (allreduce_contributions): each process's contribution is its
// towers' float32 sum (above), rounded to bfloat16 once; every process receives
// every process's contribution (ProcessGroup::allgather: a copy, no arithmetic)
// and sums them in float32 in rank order, so every process computes the same bits.
// A job of P processes of M towers then sums
//     sum_r bf16( sum_t bf16(g_{r,t}) )      (both sums in float32, in order),
// two roundings per value, not one; P processes of one tower each give the bits
// of one process with P towers. Each process sends 2 bytes an element and
// receives 2(P-1), where the float32 ring sends and receives 8(P-1)/P: half for
// two processes, 3/4 for three, the same for four, and more beyond (a
// reduce-scatter of contributions, as inside a process, would keep it 3/4).
// On NCCL the same exchange runs on the device: each process rounds its sum into
// its block of a bfloat16 buffer, ncclAllGather copies every block to every
// process, and each adds the widened blocks in rank order (the cast and add
// kernels): the host exchange's bits. NCCL's own reductions of bfloat16 would add
// partial sums in bfloat16, in an order of their own: another result.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace towerlab {

class NcclCommunicator;
class ProcessGroup;
class Stream;
class Tensor;

// The specification above: sum[i] over the members' values, in member order, each
// rounded to bfloat16 once. Every span has sum's length; at least one member.
void contribution_sum_reference(std::span<float> sum,
                                const std::vector<std::span<const float>>& members);

// values := the float32 sum, in rank order, of every process's `values` rounded to
// bfloat16 once: the same bits on every process. Every process passes the same
// length; `what` names the call ("step 12: gradient (bfloat16 contributions)").
void allreduce_contributions(ProcessGroup& group, std::span<float> values, std::string_view what);

// The same on NCCL: `values` (float32, on the communicator's device) := the float32
// sum, in rank order, of every process's `values` rounded to bfloat16 once, on
// `stream` (of that device), with the host exchange's bits; the sums are queued on
// `stream` when it returns.
void allreduce_contributions(NcclCommunicator& nccl, const Tensor& values, const Stream& stream,
                             std::string_view what);

}  // namespace towerlab
