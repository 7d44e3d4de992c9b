// The CUDA vocabulary the kernel files use, on the host, for scripts/sim_kernels.sh.
//
// Execution model. A launch runs its blocks one after another; a block's threads
// are real threads (a pool that grows to the largest block), so that the
// sanitizers see what the threads of a block do to each other: AddressSanitizer an
// access outside an array, ThreadSanitizer two threads touching the same shared or
// global word with no barrier between them. Blocks never overlap, so a
// function-static array is the block's shared memory, and races between blocks
// are not seen.
//
// Synchronization, each with CUDA's rules checked rather than assumed:
//   - __syncthreads: a counting barrier over the block's live threads (a thread
//     that returned no longer counts, as on sm_70 and later). Every thread of one
//     phase must arrive from the same call site; a wait longer than
//     SIM_WAIT_LIMIT_S seconds (a thread that never arrives) is reported.
//   - shuffles, votes, __syncwarp: warp-synchronous. The lanes named in the mask
//     meet at a per-warp barrier, each leaves its value, each takes its source
//     lane's value. A lane calling with a mask that leaves it out, lanes of one
//     warp disagreeing on the mask, a mask naming a lane that has exited or does
//     not exist, reading a lane outside the mask: each is reported as an error.
//     (Two disjoint groups of one warp shuffling at once, legal on sm_70+, is
//     reported as a mask disagreement: no kernel here does it.)
//   - atomics: std::atomic_ref with relaxed order, as CUDA's atomics: they order
//     nothing else, so they give ThreadSanitizer no happens-before edge to hide a
//     missing barrier behind.
// Every error prints "sim error:" and exits with status 86.
//
// The runtime API acts on host memory and is synchronous (a launch has finished
// when it returns), so stream order holds trivially. The SM count the launchers
// plan for is sim_sms (the driver sets it).
#pragma once

#include <math.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <source_location>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

// --- types ------------------------------------------------------------------------

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct float2 {
  float x, y;
};
struct float3 {
  float x, y, z;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct int2 {
  int x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
inline float2 make_float2(float x, float y) {
  return {x, y};
}
inline float3 make_float3(float x, float y, float z) {
  return {x, y, z};
}
inline float4 make_float4(float x, float y, float z, float w) {
  return {x, y, z, w};
}
inline int2 make_int2(int x, int y) {
  return {x, y};
}
inline int4 make_int4(int x, int y, int z, int w) {
  return {x, y, z, w};
}

inline thread_local uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
constexpr int warpSize = 32;

// --- math -------------------------------------------------------------------------

template <typename A, typename B>
constexpr std::common_type_t<A, B> min(A a, B b) {
  using T = std::common_type_t<A, B>;
  return T(b) < T(a) ? T(b) : T(a);
}
template <typename A, typename B>
constexpr std::common_type_t<A, B> max(A a, B b) {
  using T = std::common_type_t<A, B>;
  return T(a) < T(b) ? T(b) : T(a);
}
inline float __expf(float x) {
  return expf(x);
}
inline float __logf(float x) {
  return logf(x);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmaf_rn(float a, float b, float c) {
  return fmaf(a, b, c);
}
inline float __frcp_rn(float a) {
  return 1.0f / a;
}
inline float rsqrtf(float x) {
  return 1.0f / sqrtf(x);
}
inline double rsqrt(double x) {
  return 1.0 / sqrt(x);
}
inline float __saturatef(float x) {
  return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((std::uint64_t{a} * b) >> 32);
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
inline int __ffs(unsigned x) {
  return __builtin_ffs(static_cast<int>(x));
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}

// --- sim state and errors ------------------------------------------------------------

inline int sim_sms = 132;        // the SM count cudaDeviceGetAttribute answers
inline long sim_blocks_run = 0;  // blocks simulated, for the driver's summary

[[noreturn]] __attribute__((format(printf, 1, 2))) inline void sim_error(const char* format, ...) {
  std::fputs("sim error: ", stderr);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::_Exit(86);
}

namespace sim {

inline int wait_limit_s() {
  static const int limit = [] {
    const char* s = std::getenv("SIM_WAIT_LIMIT_S");
    return s != nullptr ? std::atoi(s) : 120;
  }();
  return limit;
}

inline unsigned linear_tid() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// One warp's meeting point. Values go through slot[generation parity]: a lane can
// write the next round's value only after every lane has arrived at this round,
// so the other buffer is never overwritten while a slow lane still reads it.
struct Warp {
  std::mutex m;
  std::condition_variable cv;
  unsigned members = 0;  // lanes that exist (the last warp of a block may be partial)
  unsigned exited = 0;
  unsigned arrived = 0;
  unsigned mask = 0;
  unsigned long generation = 0;
  std::uint64_t slot[2][32] = {};
  unsigned ballot[2] = {};
};

// The block's __syncthreads.
struct Block {
  std::mutex m;
  std::condition_variable cv;
  unsigned expected = 0;
  unsigned arrived = 0;
  unsigned long generation = 0;
  std::source_location site;
  std::vector<Warp> warps;
};

inline Block* current_block = nullptr;

inline const char* short_name(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash != nullptr ? slash + 1 : file;
}

// Waits on cv until done(); reports a wait past the limit as a hang.
template <typename Done, typename Describe>
void wait_or_report(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Done done,
                    Describe describe) {
  if (!cv.wait_for(lock, std::chrono::seconds(wait_limit_s()), done)) describe();
}

inline void block_barrier(const std::source_location& where) {
  Block& b = *current_block;
  std::unique_lock lock(b.m);
  if (b.arrived == 0) {
    b.site = where;
  } else if (b.site.line() != where.line() ||
             std::strcmp(b.site.file_name(), where.file_name()) != 0) {
    sim_error(
        "block (%u,%u,%u): threads of one phase reached different __syncthreads (%s:%u "
        "and %s:%u, thread %u): a barrier in divergent code",
        blockIdx.x, blockIdx.y, blockIdx.z, short_name(b.site.file_name()), b.site.line(),
        short_name(where.file_name()), where.line(), linear_tid());
  }
  const unsigned long generation = b.generation;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
    b.cv.notify_all();
    return;
  }
  wait_or_report(
      lock, b.cv, [&] { return b.generation != generation; },
      [&] {
        sim_error(
            "block (%u,%u,%u): __syncthreads at %s:%u waited %d s with %u of %u live "
            "threads arrived: a barrier some threads never reach",
            blockIdx.x, blockIdx.y, blockIdx.z, short_name(where.file_name()), where.line(),
            wait_limit_s(), b.arrived, b.expected);
      });
}

// A lane's round at its warp's meeting point: leaves `value` (and a vote) and
// returns once every lane in `mask` has left one; `read` then picks from the slots.
template <typename Read>
auto warp_round(unsigned mask, std::uint64_t value, bool vote, const char* what,
                const std::source_location& where, Read read) {
  Block& b = *current_block;
  const unsigned tid = linear_tid();
  const unsigned lane = tid % 32;
  Warp& w = b.warps[tid / 32];
  std::unique_lock lock(w.m);
  auto fail = [&](const char* problem) {
    sim_error("%s at %s:%u, block (%u,%u,%u) warp %u lane %u, mask 0x%08x: %s", what,
              short_name(where.file_name()), where.line(), blockIdx.x, blockIdx.y, blockIdx.z,
              tid / 32, lane, mask, problem);
  };
  if ((mask >> lane & 1u) == 0) fail("the calling lane is not in the mask");
  if ((mask & ~w.members) != 0) fail("the mask names lanes that do not exist in this block");
  if ((mask & w.exited) != 0) fail("the mask names a lane that has already exited");
  if (w.arrived != 0 && w.mask != mask) fail("lanes of the warp disagree on the mask");
  const unsigned long generation = w.generation;
  const int buf = static_cast<int>(generation & 1);
  w.mask = mask;
  w.slot[buf][lane] = value;
  if (w.arrived == 0) w.ballot[buf] = 0;
  if (vote) w.ballot[buf] |= 1u << lane;
  w.arrived |= 1u << lane;
  if (w.arrived == mask) {
    w.arrived = 0;
    ++w.generation;
    w.cv.notify_all();
  } else {
    wait_or_report(
        lock, w.cv, [&] { return w.generation != generation || (w.mask & w.exited) != 0; },
        [&] { fail("some lanes of the mask never arrived (a shuffle in divergent code)"); });
    if (w.generation == generation) fail("a lane of the mask exited instead of arriving");
  }
  return read(w.slot[buf], w.ballot[buf], lane);
}

template <typename T>
std::uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a wide type");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
T from_bits(std::uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

// Source lane `src` (or -1: the caller keeps its own value, a lane past its
// width-group's end).
template <typename T>
T shuffle(unsigned mask, T v, int src, const char* what, const std::source_location& where) {
  return warp_round(mask, to_bits(v), false, what, where,
                    [&](const std::uint64_t* slots, unsigned, unsigned lane) {
                      if (src < 0) return v;
                      if ((mask >> src & 1u) == 0) {
                        sim_error(
                            "%s at %s:%u, block (%u,%u,%u) lane %u reads lane %d, which is "
                            "not in the mask 0x%08x: the value is undefined",
                            what, short_name(where.file_name()), where.line(), blockIdx.x,
                            blockIdx.y, blockIdx.z, lane, src, mask);
                      }
                      return from_bits<T>(slots[src]);
                    });
}

}  // namespace sim

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  sim::block_barrier(where);
}

inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
  sim::warp_round(mask, 0, false, "__syncwarp", where,
                  [](const std::uint64_t*, unsigned, unsigned) { return 0; });
}

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32,
              std::source_location where = std::source_location::current()) {
  const int lane = static_cast<int>(sim::linear_tid() % 32);
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return sim::shuffle(mask, v, src, "__shfl_sync", where);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   std::source_location where = std::source_location::current()) {
  const int lane = static_cast<int>(sim::linear_tid() % 32);
  const int in_group = (lane & (width - 1)) + static_cast<int>(delta);
  return sim::shuffle(mask, v, in_group < width ? lane + static_cast<int>(delta) : -1,
                      "__shfl_down_sync", where);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32,
                 std::source_location where = std::source_location::current()) {
  const int lane = static_cast<int>(sim::linear_tid() % 32);
  const int in_group = (lane & (width - 1)) - static_cast<int>(delta);
  return sim::shuffle(mask, v, in_group >= 0 ? lane - static_cast<int>(delta) : -1,
                      "__shfl_up_sync", where);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  std::source_location where = std::source_location::current()) {
  const int lane = static_cast<int>(sim::linear_tid() % 32);
  const int src = lane ^ lane_mask;
  const bool same_group = (src & ~(width - 1)) == (lane & ~(width - 1));
  return sim::shuffle(mask, v, same_group ? src : -1, "__shfl_xor_sync", where);
}
inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location where = std::source_location::current()) {
  return sim::warp_round(mask, 0, predicate != 0, "__ballot_sync", where,
                         [](const std::uint64_t*, unsigned ballot, unsigned) { return ballot; });
}
inline int __any_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return __ballot_sync(mask, predicate, where) != 0;
}
inline int __all_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return __ballot_sync(mask, predicate, where) == mask;
}

// --- atomics: relaxed, as on the device --------------------------------------------

template <typename T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_relaxed);
}
template <typename T>
T atomicSub(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_sub(v, std::memory_order_relaxed);
}
template <typename T>
T atomicExch(T* p, T v) {
  return std::atomic_ref<T>(*p).exchange(v, std::memory_order_relaxed);
}
template <typename T>
T atomicCAS(T* p, T expected, T desired) {
  std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired, std::memory_order_relaxed);
  return expected;
}
template <typename T>
T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load(std::memory_order_relaxed);
  while (v < old && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load(std::memory_order_relaxed);
  while (old < v && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
  return old;
}

// --- runtime API, on host memory ---------------------------------------------------

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace sim {
inline cudaError_t last_error = cudaSuccess;
inline cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}
}  // namespace sim

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return cudaGetErrorName(e);
}
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = sim::last_error;
  sim::last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() {
  return sim::last_error;
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : sim::fail(cudaErrorInvalidValue);
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (attr != cudaDevAttrMultiProcessorCount || device != 0)
    return sim::fail(cudaErrorInvalidValue);
  *value = sim_sms;
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t = nullptr) {
  if (bytes != 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind,
                                   cudaStream_t = nullptr) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind);
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  return cudaSuccess;
}

// --- launches ----------------------------------------------------------------------

namespace sim {

// Worker threads, reused from block to block (thread creation dominates otherwise,
// and ThreadSanitizer caps the threads a process may have alive). Each worker has
// its own wake-up, so a block of 32 threads wakes 32 workers, not all of them.
class Pool {
 public:
  ~Pool() {
    for (auto& w : workers_) {
      std::lock_guard lock(w->m);
      w->stop = true;
      w->cv.notify_one();
    }
    for (auto& w : workers_) w->thread.join();
  }
  // Runs job(t) for t in [0, threads) on `threads` workers at once; returns when all have.
  void run(unsigned threads, const std::function<void(unsigned)>& job) {
    while (workers_.size() < threads) {
      workers_.push_back(std::make_unique<Worker>());
      Worker* w = workers_.back().get();
      const unsigned id = static_cast<unsigned>(workers_.size() - 1);
      w->thread = std::thread([this, w, id] { work(*w, id); });
    }
    {
      std::lock_guard lock(m_);
      remaining_ = threads;
    }
    for (unsigned t = 0; t < threads; ++t) {
      Worker& w = *workers_[t];
      std::lock_guard lock(w.m);
      w.job = &job;
      w.cv.notify_one();
    }
    std::unique_lock lock(m_);
    done_.wait(lock, [&] { return remaining_ == 0; });
  }

 private:
  struct Worker {
    std::mutex m;
    std::condition_variable cv;
    const std::function<void(unsigned)>* job = nullptr;
    bool stop = false;
    std::thread thread;
  };
  void work(Worker& w, unsigned id) {
    for (;;) {
      const std::function<void(unsigned)>* job = nullptr;
      {
        std::unique_lock lock(w.m);
        w.cv.wait(lock, [&] { return w.stop || w.job != nullptr; });
        if (w.stop) return;
        job = std::exchange(w.job, nullptr);
      }
      (*job)(id);
      std::lock_guard lock(m_);
      if (--remaining_ == 0) done_.notify_one();
    }
  }
  std::mutex m_;
  std::condition_variable done_;
  std::vector<std::unique_ptr<Worker>> workers_;
  unsigned remaining_ = 0;
};

inline Pool& pool() {
  static Pool p;
  return p;
}

// A thread that returned: it no longer counts at the block's barrier, and a
// shuffle that names it fails.
inline void thread_exited() {
  Block& b = *current_block;
  const unsigned tid = linear_tid();
  Warp& w = b.warps[tid / 32];
  {
    std::lock_guard lock(w.m);
    w.exited |= 1u << (tid % 32);
    w.cv.notify_all();
  }
  std::lock_guard lock(b.m);
  if (--b.expected == b.arrived && b.arrived != 0) {
    b.arrived = 0;
    ++b.generation;
    b.cv.notify_all();
  }
}

}  // namespace sim

// kernel<<<grid, block, shared, stream>>>(args...) becomes
// sim_launch(grid, block, [&](auto... a) { kernel(a...); }, args...): the arguments
// are evaluated and copied once, as a launch does, and every thread gets its copy.
template <typename F, typename... Args>
void sim_launch(dim3 grid, dim3 block, F run, Args&&... args) {
  const std::uint64_t threads = std::uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    sim::fail(cudaErrorInvalidConfiguration);  // what the next cudaGetLastError() reports
    return;
  }
  const auto params = std::make_tuple(std::decay_t<Args>(args)...);
  gridDim = grid;
  blockDim = block;
  const unsigned n = static_cast<unsigned>(threads);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        sim::Block b;
        b.expected = n;
        b.warps = std::vector<sim::Warp>((n + 31) / 32);
        for (unsigned w = 0; w < b.warps.size(); ++w) {
          const unsigned lanes = std::min(32u, n - 32 * w);
          b.warps[w].members = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        }
        sim::current_block = &b;
        sim::pool().run(n, [&](unsigned t) {
          threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
          blockIdx = {x, y, z};
          std::apply(run, params);
          sim::thread_exited();
        });
        sim::current_block = nullptr;
        ++sim_blocks_run;
      }
    }
  }
}
