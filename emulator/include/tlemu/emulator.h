// The emulated GPUs' own controls: what a real GPU has no API for. Tests use them to
// shape the devices (count, memory, peer access) and to inject the faults whose
// error paths towerlab must survive; tools use them to say that the devices are
// emulated.
//
// Environment, read when the first CUDA call is made:
//   TOWERLAB_EMULATED_GPUS=N        devices (1-8; default 2)
//   TOWERLAB_EMULATED_MEMORY=BYTES  memory cap per device (suffix K, M or G; default
//                                   80G, an H100's; what cudaMemGetInfo reports)
//   TOWERLAB_EMULATED_SMS=N         multiprocessors per device (default 132)
//   TOWERLAB_EMULATED_PEER=0        every peer access is refused (the host-staged
//                                   paths run); default 1, every pair may be enabled
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace tlemu {

// How the devices are set up; the environment's values until changed here.
struct Config {
  int devices = 2;
  std::size_t memory_bytes = std::size_t{80} << 30;
  int multiprocessors = 132;
  bool peer_access = true;
};
Config config();

// The memory cap of `device`; lower it to make an out-of-memory happen.
void set_memory_limit(int device, std::size_t bytes);
// Whether cudaDeviceCanAccessPeer says yes and cudaDeviceEnablePeerAccess works.
void set_peer_access_allowed(bool allowed);

// --- fault injection ---------------------------------------------------------------
// The `nth` cudaMalloc from now (1 = the next) on `device` (-1: any) and the
// `times - 1` after it fail with cudaErrorMemoryAllocation; the ones before and
// after succeed. (A caching allocator retries a failed cudaMalloc once its cache is
// released: times = 2 makes the failure reach its caller.)
void fail_allocation(int nth, int device = -1, int times = 1);
// The `nth` kernel launched from now on `device` faults when it runs: the device's
// sticky error becomes cudaErrorIllegalAddress, as an out-of-bounds access would
// make it on hardware.
void fault_kernel(int nth, int device);
// Queues a pause of `delay` on `stream`: what is queued after it runs that much
// later, as after a long kernel. Work that is not properly ordered after it then
// overtakes it and reads stale data (and ThreadSanitizer says so).
void delay_stream(cudaStream_t stream, std::chrono::milliseconds delay);
// Clears every device's sticky error and every pending fault, and puts the memory
// caps back; peer access stays as it is (towerlab enables it once per pair and
// remembers, as a program may on hardware, where nothing disables it behind its back).
void clear_faults();
// clear_faults(), and also disables every peer access and restores the environment's
// peer setting: for the emulator's own tests, not for a process where towerlab ran.
// Hardware has no such thing (a faulted context is lost until the process ends);
// tests use it to stay independent of each other.
void reset();

// --- what ran ------------------------------------------------------------------------
struct Counters {
  std::uint64_t kernels = 0;  // launches run to the end
  std::uint64_t blocks = 0;
  std::uint64_t threads = 0;
  std::uint64_t copies = 0;  // memcpy and memset operations run
};
Counters counters();

// The device's sticky error (cudaSuccess while it has none).
cudaError_t sticky_error(int device);

}  // namespace tlemu

namespace tlemu {

// --- the emulated NCCL (src/nccl.cpp, include/nccl.h) --------------------------------
// How long a collective waits for the ranks that have not reached it, and
// ncclCommInitRank for the ranks that have not joined, before it fails with
// ncclSystemError naming them. TOWERLAB_EMULATED_NCCL_TIMEOUT_S (seconds, default 60)
// until set here; applies to the waits that start afterwards.
void set_nccl_timeout(std::chrono::milliseconds timeout);

}  // namespace tlemu
