// The device side of the emulated GPUs: the CUDA vocabulary kernel code uses
// (qualifiers, vector types, threadIdx and friends, math intrinsics, barriers, warp
// shuffles and votes, atomics, __shared__ storage) and the launch that
// emulator/rewrite.py writes in place of kernel<<<grid, block, shared, stream>>>(...).
//
// Execution model (src/block.cpp). A launch is queued on its stream and runs on the
// stream's worker thread, one block after another. The threads of a block are
// fibers on that worker: each runs until it returns or reaches a barrier or a warp
// operation, then the next runnable one runs. So
//   - __syncthreads is a counting barrier over the block's live threads (a thread
//     that returned no longer counts, as on sm_70 and later); every thread of a phase
//     must arrive from the same call site; a block whose live threads all wait where
//     the rest can never come is reported at once;
//   - shuffles, votes and __syncwarp meet the lanes named in the mask; a lane calling
//     with a mask that leaves it out, lanes disagreeing on the mask, a mask naming a
//     lane that exited or does not exist, reading a lane outside the mask: each is
//     reported;
//   - ThreadSanitizer sees each fiber as a thread of its own. __syncthreads and
//     __syncwarp order memory between the threads they join, as CUDA documents;
//     shuffles and votes move values but order no memory; atomics are relaxed. A
//     missing barrier is therefore a data race report, even though the fibers take
//     turns on one host thread. Blocks of one launch run one after another, so races
//     between blocks are not seen.
// A misuse of a barrier or a shuffle is a kernel bug no error code can carry: it is
// printed ("emulated GPU: ...") and the process exits with status 86.
#pragma once

#include <math.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__ __restrict

// --- types ---------------------------------------------------------------------------

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

// The running thread's coordinates. Per host thread, set by the block scheduler each
// time a fiber resumes (the fibers of one block share their worker's copy).
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
constexpr int warpSize = 32;

// --- math ----------------------------------------------------------------------------

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
inline int __clz(unsigned x) {
  return x == 0 ? 32 : __builtin_clz(x);
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline void __threadfence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __threadfence_block() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// --- barriers, warps and shared memory (src/block.cpp) --------------------------------

namespace tlemu::detail {
void block_barrier(const std::source_location& where);
// One round at the warp's meeting point: every lane of `mask` leaves `value` and its
// vote, and gets back the value of lane `source` (its own where source < 0) and the
// ballot of the round. `orders_memory`: the round is a __syncwarp.
struct WarpResult {
  std::uint64_t value;
  unsigned ballot;
};
WarpResult warp_round(unsigned mask, std::uint64_t value, bool vote, int source, bool orders_memory,
                      const char* what, const std::source_location& where);
// Storage of one __shared__ declaration for the running block, keyed by `key`;
// filled with 0xff bytes (NaN as floats) when the block starts, as a reminder that
// shared memory starts out undefined.
void* shared_storage(const void* key, std::size_t bytes, std::size_t alignment);
unsigned lane_id();
}  // namespace tlemu::detail

namespace tlemu {
// What emulator/rewrite.py writes for `__shared__ T name[N];`:
//   struct tlemu_shared_name { T name[N]; };
//   auto& name = ::tlemu::block_shared<tlemu_shared_name>().name;
// The local struct makes each declaration (in each instantiation) its own key.
template <typename Storage>
Storage& block_shared() {
  static_assert(std::is_trivially_default_constructible_v<Storage>,
                "__shared__ variables must be trivially constructible");
  static const char key = 0;
  return *static_cast<Storage*>(detail::shared_storage(&key, sizeof(Storage), alignof(Storage)));
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
}  // namespace tlemu

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  tlemu::detail::block_barrier(where);
}
inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
  tlemu::detail::warp_round(mask, 0, false, -1, true, "__syncwarp", where);
}

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32,
              std::source_location where = std::source_location::current()) {
  const int lane = static_cast<int>(tlemu::detail::lane_id());
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return tlemu::from_bits<T>(
      tlemu::detail::warp_round(mask, tlemu::to_bits(v), false, src, false, "__shfl_sync", where)
          .value);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   std::source_location where = std::source_location::current()) {
  const int lane = static_cast<int>(tlemu::detail::lane_id());
  const int in_group = (lane & (width - 1)) + static_cast<int>(delta);
  const int src = in_group < width ? lane + static_cast<int>(delta) : -1;
  return tlemu::from_bits<T>(tlemu::detail::warp_round(mask, tlemu::to_bits(v), false, src, false,
                                                       "__shfl_down_sync", where)
                                 .value);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32,
                 std::source_location where = std::source_location::current()) {
  const int lane = static_cast<int>(tlemu::detail::lane_id());
  const int in_group = (lane & (width - 1)) - static_cast<int>(delta);
  const int src = in_group >= 0 ? lane - static_cast<int>(delta) : -1;
  return tlemu::from_bits<T>(
      tlemu::detail::warp_round(mask, tlemu::to_bits(v), false, src, false, "__shfl_up_sync", where)
          .value);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  std::source_location where = std::source_location::current()) {
  const int lane = static_cast<int>(tlemu::detail::lane_id());
  const int src = lane ^ lane_mask;
  const bool same_group = (src & ~(width - 1)) == (lane & ~(width - 1));
  return tlemu::from_bits<T>(tlemu::detail::warp_round(mask, tlemu::to_bits(v), false,
                                                       same_group ? src : -1, false,
                                                       "__shfl_xor_sync", where)
                                 .value);
}
inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location where = std::source_location::current()) {
  return tlemu::detail::warp_round(mask, 0, predicate != 0, -1, false, "__ballot_sync", where)
      .ballot;
}
inline int __any_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return __ballot_sync(mask, predicate, where) != 0;
}
inline int __all_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return __ballot_sync(mask, predicate, where) == mask;
}

// --- atomics: relaxed, as on the device (they order nothing else) ---------------------

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

// --- launches ------------------------------------------------------------------------

namespace tlemu {

// One kernel launch as the stream's worker runs it: every thread of every block
// calls `thread_body`. `pointers` are the launch's top-level pointer arguments, which
// the worker checks against the memory registry before the first block runs.
struct KernelLaunch {
  const char* kernel = "";
  dim3 grid, block;
  std::size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  std::vector<const void*> pointers;
  std::function<void()> thread_body;
};

namespace detail {
void submit(KernelLaunch&& launch);
template <typename T>
void collect_pointer(std::vector<const void*>& out, const T& arg) {
  if constexpr (std::is_pointer_v<T>) out.push_back(static_cast<const void*>(arg));
}
}  // namespace detail

// kernel<<<grid, block, shared, stream>>>(args...) becomes
//   ::tlemu::launch("kernel", grid, block, shared, stream,
//                   [=](auto... a) { kernel(a...); }, args...);
// The arguments are evaluated and copied once, here, as a launch does; every thread
// gets its own copies when its body calls the kernel.
template <typename Kernel, typename... Args>
void launch(const char* name, dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
            Kernel kernel, Args&&... args) {
  KernelLaunch l;
  l.kernel = name;
  l.grid = grid;
  l.block = block;
  l.shared_bytes = shared_bytes;
  l.stream = stream;
  auto params = std::make_tuple(std::decay_t<Args>(args)...);
  std::apply([&](const auto&... p) { (detail::collect_pointer(l.pointers, p), ...); }, params);
  l.thread_body = [kernel, params = std::move(params)]() { std::apply(kernel, params); };
  detail::submit(std::move(l));
}

}  // namespace tlemu
