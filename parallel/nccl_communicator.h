// NCCL between processes: the device-buffer path of the Trainer's cross-process
// phase (parallel/trainer.h, phase 5).
//
// When every rank trains on GPUs and every rank's tower 0 has a GPU of its own,
// the gradient and the moving statistics need not travel through the host: an
// NcclCommunicator all-reduces them in place on tower 0's device buffers, while the
// small host values (losses, batch sizes) still go through the ProcessGroup.
// Otherwise phase 5 stages everything on the host, as before.
//
//   NcclChoice choice = choose_cross_process_path(group, CrossProcessPath::Auto, towers);
//   if (choice.nccl) comm = std::make_unique<NcclCommunicator>(group, towers[0]);
//   comm->allreduce_sum({grads, state}, stream, "step 12: gradients");
//
// Bootstrap: rank 0 makes NCCL's unique id and broadcasts it over the ProcessGroup;
// every rank then joins on its GPU (ncclCommInitRankConfig).
//
// Determinism. NCCL chooses its algorithm (ring, tree, NVLink SHARP, CollNet) and
// protocol per call from the message size and the topology, and each sums in its
// own order, so the same values in buffers of other sizes could come out different.
// Before its first communicator towerlab sets NCCL_ALGO=Ring and NCCL_PROTO=Simple
// unless the user set them: one known order, the ring's, for every size. What is
// guaranteed: every rank holds the same bits after each call (the ring reduces each
// element once, on one rank, and copies the result to the others); run to run, the
// same bits for a fixed layout (hosts, GPUs, ranks, buffer sizes), NCCL version and
// NCCL environment. What is not: the same bits as the host-staged path for three or
// more ranks (parallel/cluster.h starts each chunk's sum at another rank); with two
// ranks each element is one addition, a + b, and the two paths agree bit for bit. A
// user's own NCCL_ALGO or NCCL_PROTO replaces the ring's order with theirs.
//
// No call waits forever. The communicator is non-blocking (config.blocking = 0):
// initialization, each all-reduce (until its kernels have finished on the stream)
// and finalization are polled against a deadline: the one given, else the
// ProcessGroup's (a Cluster's is ClusterOptions::deadline or
// TOWERLAB_MPI_DEADLINE_S).
// A call past the deadline aborts the communicator (ncclCommAbort) and throws
// CommunicationError naming the call and NCCL's last message; so does an error
// NCCL reports (a peer's connection lost, a CUDA error). NCCL cannot always say
// which rank stalled (a kernel waiting on a dead peer just waits): the Trainer
// makes its host collective first, so that a rank that never reached the step is
// named there by the ProcessGroup. After a failure every later call throws the
// first error again.
//
// Built when the CUDA toolkit ships NCCL (TOWERLAB_NCCL, the release preset);
// otherwise available() is false and constructing one throws NotSupported.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../engine/device.h"
#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "cross_process_path.h"

namespace towerlab {

class ProcessGroup;

// What one rank contributes to the decision.
struct NcclRankPlacement {
  CrossProcessPath request = CrossProcessPath::Auto;
  bool all_towers_on_gpus = false;
  std::string host;    // the host name
  std::string device;  // tower 0's device: "cuda:1" or "cpu"
  std::string gpu;     // tower 0's GPU, unique across hosts (its UUID); "" on the CPU
};

struct NcclChoice {
  bool nccl = false;
  std::string reason;  // for the placement log: why this path
};

// The decision from every rank's placement (in rank order), the same on every rank:
// NCCL when the build has it (`nccl_built`), the request is not HostStaged, there
// are two or more ranks (or Nccl was asked for explicitly), every tower of every
// rank is on a GPU and no two ranks' tower 0 share a GPU (NCCL runs one rank per
// GPU). Throws InvalidArgument when the ranks' requests differ, NotSupported when
// Nccl was requested and cannot be used (naming the rank and the reason).
NcclChoice choose_cross_process_path(const std::vector<NcclRankPlacement>& ranks, bool nccl_built);

// Collective over `group`: gathers every rank's placement of `towers` (the
// devices as placed) and decides as above.
NcclChoice choose_cross_process_path(ProcessGroup& group, CrossProcessPath request,
                                     const std::vector<Device>& towers);

// The text one rank contributes to the gather, and back.
std::string encode_rank_placement(const NcclRankPlacement& placement);
NcclRankPlacement decode_rank_placement(std::string_view text);

class NcclCommunicator {
 public:
  // Collective over `group`: every rank calls it, each with its own GPU `device`.
  // `deadline`: see the top (nullopt: group.deadline()).
  // Throws NotSupported without NCCL, DeviceError for a device that is not a GPU,
  // CommunicationError when NCCL fails or does not finish in time.
  NcclCommunicator(ProcessGroup& group, Device device,
                   std::optional<std::chrono::milliseconds> deadline = std::nullopt);
  // Finalizes (polled against the deadline) and destroys the communicator; aborts
  // it instead after a failure or past the deadline. Never throws.
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // buffers[i] (float32 on this communicator's device) := its sum over the ranks,
  // in place, on `stream` (of that device); one NCCL group for all of them. Every
  // rank passes the same number of buffers with the same sizes. Returns once the
  // sums are on the device (the stream may be used at once; the host has waited).
  void allreduce_sum(const std::vector<Tensor>& buffers, const Stream& stream,
                     std::string_view what);

  // The all-reduce's halves, in place on `blocks` (float32 on this communicator's
  // device, size() blocks of one length, block r rank r's), on `stream`, returning as
  // allreduce_sum does. Every rank passes the same length.
  //   reduce_scatter_sum: this rank's block := the sum over the ranks of that block
  //     (the others are unspecified afterwards);
  //   all_gather: every rank's block, as that rank holds it, into every rank's
  //     `blocks` (copies, no arithmetic; bfloat16 blocks too, which is how the
  //     processes' bfloat16 contributions travel: parallel/ring_contributions.h).
  // Their sums' order is NCCL's (see the top): with two ranks one addition, a + b,
  // which is every order's bits.
  void reduce_scatter_sum(const Tensor& blocks, const Stream& stream, std::string_view what);
  void all_gather(const Tensor& blocks, const Stream& stream, std::string_view what);

  Device device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  static bool available();  // built with NCCL

 private:
  struct Comm;
  // The constructor's collective part, once the members are set: makes the NCCL
  // communicator with the other ranks (throws NotSupported in a build without NCCL).
  void connect(ProcessGroup& group);
  // Throws ShapeError naming `call` unless `buffer` is float32 (or, for a call that
  // only `copies`, bfloat16) on device_; the blocks' length, once `blocks` is also
  // size_ blocks of one length.
  void check_buffer(const Tensor& buffer, const char* call, std::string_view what,
                    bool copies = false) const;
  std::int64_t check_blocks(const Tensor& blocks, const char* call, std::string_view what,
                            bool copies = false) const;

  Device device_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds deadline_;
  std::unique_ptr<Comm> comm_;
};

}  // namespace towerlab
