// What the emulator's parts share: the devices' state, the memory registry, the
// streams' queues and the sanitizer annotations. Internal: neither towerlab nor
// the kernels include it; the emulated libraries (cuBLAS, CUB, NCCL) do.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <string>
#include <thread>
#include <vector>

#include "tlemu/emulator.h"

// Which sanitizer this build runs under (GCC's macros, clang's __has_feature).
#if defined(__SANITIZE_THREAD__)
#define TLEMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TLEMU_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TLEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TLEMU_ASAN 1
#endif
#endif

namespace tlemu::detail {

constexpr int kMaxDevices = 8;

// --- ThreadSanitizer --------------------------------------------------------------------
// The emulator's own bookkeeping (the registry, the list of streams, the block
// scheduler's state) is shared by threads that CUDA does not order. Its locks would
// tell ThreadSanitizer that those threads are ordered, and hide exactly the missing
// events the emulated build exists to find; so inside a Hidden scope TSan neither
// checks accesses nor learns ordering. Outside TSan builds it costs nothing.
class Hidden {
 public:
  Hidden();
  ~Hidden();
  Hidden(const Hidden&) = delete;
  Hidden& operator=(const Hidden&) = delete;
};
// Ordering CUDA does guarantee, made visible to TSan where no lock carries it.
void tsan_release(const void* token);
void tsan_acquire(const void* token);

// --- errors and devices ----------------------------------------------------------------
// Keeps `error` as the calling thread's last error (unless it is cudaSuccess) and
// returns it.
cudaError_t fail(cudaError_t error);
// The same, with a line on stderr that says what was wrong: the emulator's errors
// carry what a real GPU's cannot.
cudaError_t fail(cudaError_t error, const std::string& why);
const Config& settings();  // the configuration, read from the environment once
int device_count();
bool valid_device(int device);
int current_device();  // of the calling thread
// The device's sticky error; raise_sticky keeps the first and prints why.
cudaError_t sticky(int device);
void raise_sticky(int device, cudaError_t error, const std::string& why);
bool peer_access_allowed();  // the switch; peer_enabled says whether a pair enabled it
std::size_t memory_cap(int device);
void count_kernel(std::uint64_t blocks, std::uint64_t threads);
void count_copy();
// Fault injection: whether this allocation or this launch is the one to fail.
bool take_allocation_fault(int device);
bool take_kernel_fault(int device);

// --- memory ------------------------------------------------------------------------------
struct Allocation {
  const char* base = nullptr;
  std::size_t bytes = 0;
  int device = -1;  // -1: pinned host memory (cudaHostAlloc)
};
// The live allocation that holds [p, p + bytes), if any (bytes 0: p may be one past
// the end, as an empty view's pointer is).
std::optional<Allocation> find_allocation(const void* p, std::size_t bytes = 1);
// "device memory of cuda:1", "pinned host memory", "freed device memory of cuda:0
// (cudaFree'd)", "host memory the emulator did not allocate", for messages.
std::string describe_pointer(const void* p);
bool peer_enabled(int from, int to);
void reset_peer_access();
void set_memory_cap(int device, std::size_t bytes);

// --- streams ------------------------------------------------------------------------------
// One operation queued on a stream. `run` executes on the stream's worker thread;
// it is skipped once the stream's device has a sticky error.
struct Operation {
  std::string what;
  std::function<void()> run;
};
// Queues `op` on `stream` (0 and cudaStreamLegacy: the current device's legacy
// default stream, with its implicit ordering against the blocking streams). Returns
// cudaErrorInvalidResourceHandle for a destroyed or unknown stream, or the device's
// sticky error.
cudaError_t enqueue(cudaStream_t stream, Operation op);
// The device a stream belongs to, or -1 for an unknown handle.
int stream_device(cudaStream_t stream);
// Waits until everything queued on `stream` so far has run.
cudaError_t synchronize(cudaStream_t stream);
// Waits until everything queued on the device's streams so far has run.
cudaError_t synchronize_device(int device);
// tlemu::delay_stream: a pause queued on the stream.
void set_stream_delay(cudaStream_t stream, std::chrono::milliseconds delay);

// --- kernels ------------------------------------------------------------------------------
// Runs every block of `launch` on the calling (worker) thread.
void run_kernel(const KernelLaunch& launch, int device);

// --- warp-collective instructions (src/warp.cpp; used by src/tensor_core.cpp) --------------
// The .sync.aligned instructions (mma.sync, ldmatrix) are executed by the whole warp at
// once: every lane leaves its operand registers, and every lane's results depend on the
// other lanes' operands. warp_collective is that meeting, on the warp's meeting point
// of shuffles and votes (so the same lanes are counted and the same misuse reported):
// all 32 lanes must exist and arrive, none may have exited, and all must arrive from
// the same call site with the same instruction (`combine`); a lane waiting elsewhere
// (a barrier, a shuffle) is reported as divergent code. Once the last lane arrives,
// `combine` runs once, on every lane's input words, and writes every lane's output
// words; each lane then leaves with its own. Like a shuffle it orders no memory.
constexpr unsigned kCollectiveWords = 16;
struct WarpWords {
  std::uint32_t lane[32][kCollectiveWords];
};
using Combine = void (*)(const WarpWords& in, WarpWords& out);
void warp_collective(Combine combine, const std::uint32_t* in, std::uint32_t* out, const char* what,
                     const std::source_location& where);
// Whether [p, p + bytes) lies in one __shared__ array of the running block
// (src/shared_memory.cpp).
bool in_block_shared(const void* p, std::size_t bytes);
// A misuse of a warp instruction by the running thread: printed with the kernel, block,
// warp and lane, and the process exits with status 86.
[[noreturn]] void warp_instruction_bug(const char* what, const std::source_location& where,
                                       const std::string& problem);

}  // namespace tlemu::detail
