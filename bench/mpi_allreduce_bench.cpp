// The cross-process all-reduce of towerlab (Cluster::allreduce_sum, a ring over
// point-to-point messages with a fixed summation order, parallel/cluster.h)
// against a bare MPI_Allreduce(MPI_SUM) on the same buffers, float32, 4 KiB to
// 64 MiB. Run it under mpirun (it is a collective program, not a Google Benchmark:
// every rank must run the same iterations):
//
//   mpirun -np 2 build/cpu/bench/mpi_allreduce_bench                        # shared memory
//   mpirun -np 2 --mca btl tcp,self --mca pml ob1 build/cpu/bench/mpi_allreduce_bench
//
// Time is the mean per call over the timed iterations, the slowest rank's. Bus
// bandwidth is bytes * 2(size-1)/size / time: the traffic per rank of a
// bandwidth-optimal all-reduce, so numbers compare across group sizes (the
// convention of nccl-tests).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "parallel/cluster.h"

namespace {

using Clock = std::chrono::steady_clock;

// Mean seconds per call of `call`, the slowest rank's, after `warmup` untimed calls.
template <typename Call>
double time_per_call(int iterations, int warmup, Call&& call) {
  for (int i = 0; i < warmup; ++i) call();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) call();
  double mine = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
  double slowest = 0.0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

}  // namespace

int main() {
  towerlab::Cluster cluster;  // initializes MPI when started by mpirun
  if (!cluster.uses_mpi()) {
    std::fprintf(stderr, "mpi_allreduce_bench: run it under mpirun with 2 or more ranks\n");
    return 2;
  }
  const int size = cluster.size();
  if (cluster.rank() == 0) {
    std::printf("%d ranks; float32 sum; time per call (us) and bus bandwidth (GB/s)\n", size);
    std::printf("%10s %12s %10s %12s %10s %8s\n", "bytes", "towerlab us", "GB/s", "MPI us", "GB/s",
                "ratio");
  }
  for (std::size_t bytes = 4096; bytes <= (std::size_t(64) << 20); bytes *= 4) {
    const std::size_t n = bytes / sizeof(float);
    // Repeated sums double the values until they reach infinity, which adds at
    // full speed; they never become subnormal (which would not).
    std::vector<float> ours(n, 1.0f / 1024), theirs(n, 1.0f / 1024);
    const int iterations = int(std::clamp<std::size_t>((std::size_t(256) << 20) / bytes, 5, 500));
    const double t_ours = time_per_call(
        iterations, 3, [&] { cluster.allreduce_sum(std::span<float>(ours), "bench"); });
    const double t_mpi = time_per_call(iterations, 3, [&] {
      MPI_Allreduce(MPI_IN_PLACE, theirs.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    const double traffic = double(bytes) * 2.0 * (size - 1) / size;
    if (cluster.rank() == 0) {
      std::printf("%10zu %12.1f %10.2f %12.1f %10.2f %8.2f\n", bytes, t_ours * 1e6,
                  traffic / t_ours / 1e9, t_mpi * 1e6, traffic / t_mpi / 1e9, t_ours / t_mpi);
      std::fflush(stdout);
    }
  }
  return 0;
}
