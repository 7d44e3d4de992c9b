// The processes of one training job, as mpirun started them: towerlab's
// ProcessGroup on MPI.
//
//   Cluster cluster;                      // rank, size and local rank from mpirun
//   options.devices = {cluster.default_device()};
//   options.process_group = &cluster;     // the Trainer's cross-process phase
//
// Started by mpirun (Open MPI's OMPI_COMM_WORLD_SIZE, PMIx's PMIX_RANK or the PMI
// variables of other launchers), a Cluster initializes MPI (MPI_Init_thread,
// MPI_THREAD_SERIALIZED: one thread at a time calls it) unless the program already
// did, and finalizes it when destroyed if it initialized it. Started without
// mpirun, it is a group of one process and never touches MPI, so the same program
// runs as before. A build without MPI (TOWERLAB_MPI=OFF) refuses a launch of more
// than one rank (NotSupported) rather than train N unconnected copies.
//
// The all-reduce is a ring over point-to-point messages, not MPI_Allreduce: MPI
// leaves the order of a reduction to the implementation, and it may differ between
// ranks or message sizes. In the ring's reduce-scatter, chunk c is summed in the
// fixed order rank c, c+1, ..., c-1 (mod size), by one rank, and the allgather then
// copies the finished chunk to the others, so every rank holds the same bits, run
// after run, for a given group size: the schedule of the in-process ring
// (parallel/ring_allreduce.h), one schedule for both (parallel/ring_schedule.h). A call with a
// ReduceFrame cuts its chunks where the whole buffer's chunks end, so a range summed on its own
// gets the same bits. Its traffic is 2(size-1)/size of the buffer per rank, the optimum.
// reduce_scatter_sum and allgather_chunks are its two halves alone (a master sharded across
// processes runs its update between them). Broadcast and allgather carry no arithmetic and use
// MPI's own non-blocking collectives.
//
// No call waits forever. Every call is non-blocking and polled against a deadline
// (ClusterOptions::deadline, 120 s by default; the environment variable
// TOWERLAB_MPI_DEADLINE_S overrides it, in seconds). On entering a call each rank
// tells every other one "I am at call #k, an all-reduce of n floats": so a rank
// that times out names the ranks that never arrived ("step 12: gradients: rank 2
// did not arrive within 120 s"), and a rank whose call differs from the others'
// (another kind, size or count of calls) is named at once instead of corrupting
// the sum or hanging. A rank that fails a call for any reason tells the others,
// which stop with the same cause instead of waiting out their own deadline. The
// group is then broken: every later call throws the first error again, and the
// destructor skips MPI_Finalize (which would wait for the lost rank), so mpirun
// ends the job when this process exits.
//
// A rank that dies: by default mpirun ends the whole job at once and names the
// rank ("process rank 1 ... exited on signal 9"): it sends every other rank SIGTERM,
// then SIGKILL a second later. While a Cluster on MPI is alive it handles SIGTERM
// (unless the program ignores or handles it itself): each surviving rank writes one
// line saying where it was, "towerlab: rank 0 was in 'step 7: gradients' when
// SIGTERM stopped it (...)", and then ends by SIGTERM as it would have. Under
// `mpirun --enable-recovery` the others live on and stop at their next call with
// the message above, after the deadline (MPI on shared memory gives no earlier
// sign of a dead peer).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../engine/device.h"
#include "process_group.h"

namespace towerlab {

struct ClusterOptions {
  // How long one call waits for the other processes before it throws
  // CommunicationError. Generous: ranks also wait for each other's data loading and
  // evaluation. TOWERLAB_MPI_DEADLINE_S (seconds, > 0) overrides it.
  std::chrono::milliseconds deadline{std::chrono::seconds(120)};
};

class Cluster final : public ProcessGroup {
 public:
  // Throws CommunicationError when MPI cannot be initialized, InvalidArgument for a
  // malformed TOWERLAB_MPI_DEADLINE_S, NotSupported for a multi-rank launch of a
  // build without MPI or a second Cluster alive in the process.
  explicit Cluster(ClusterOptions options = {});
  ~Cluster() override;
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const { return local_size_; }
  std::chrono::milliseconds deadline() const override { return deadline_; }
  // True when MPI connects this process to others (started by mpirun).
  bool uses_mpi() const { return mpi_ != nullptr; }

  // The device this rank trains on by default: cuda:(local_rank % GPUs) when there
  // is a GPU, so that the ranks of a host share its GPUs round-robin; else the CPU.
  Device default_device() const;

  void allreduce_sum(std::span<float> values, std::string_view what,
                     ReduceFrame frame = {}) override;
  void allreduce_sum(std::span<double> values, std::string_view what) override;
  void reduce_scatter_sum(std::span<float> values, std::string_view what,
                          ReduceFrame frame = {}) override;
  void allgather_chunks(std::span<float> values, std::string_view what,
                        ReduceFrame frame = {}) override;
  void broadcast(std::span<std::byte> bytes, int root, std::string_view what) override;
  std::vector<std::string> allgather(std::string_view mine, std::string_view what) override;
  // Returns once every rank has called it (or throws as any call does).
  void barrier(std::string_view what);

 private:
  struct Mpi;
  // Which of the ring's two halves a call runs.
  enum class RingHalves { Both, ReduceScatter, AllGather };
  template <typename T>
  void ring_allreduce(std::span<T> values, std::string_view what, ReduceFrame frame,
                      RingHalves halves);

  std::unique_ptr<Mpi> mpi_;  // null: a group of this process alone
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::chrono::milliseconds deadline_;
};

}  // namespace towerlab
