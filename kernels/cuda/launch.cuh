// Launch helpers shared by the CUDA kernel files: the stream handle, the device's
// SM count (asked once), the grid for a grid-stride loop over n elements and the
// launch of such a loop, the warp and block sums every reduction kernel uses,
// scratch memory from the caching allocator, and a search for the first index
// where a condition holds (for the checks that must name an offending element:
// labels out of range, NaN in a gradient). Each of these exists once, here.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "engine/allocator.h"
#include "engine/cuda_check.h"
#include "engine/stream.h"

namespace towerlab::cuda {

inline cudaStream_t native(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}

constexpr int kBlockSize = 256;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Streaming multiprocessors of `device` (132 on an H100 SXM). The attribute query
// costs a driver call, and launchers ask on every launch, so each device's answer
// is kept; a race between two first callers only asks twice.
inline int sm_count(int device) {
  static std::array<std::atomic<int>, 64> cache{};
  TL_CHECK(device >= 0 && device < static_cast<int>(cache.size()), DeviceError,
           "sm_count: CUDA device index " << device << " out of range");
  std::atomic<int>& slot = cache[static_cast<std::size_t>(device)];
  int count = slot.load(std::memory_order_relaxed);
  if (count == 0) {
    TL_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    slot.store(count, std::memory_order_relaxed);
  }
  return count;
}

// Blocks for a grid-stride loop over n items on the stream's device: enough to
// fill every SM several times over (32 blocks of 256 threads per SM), no more
// (extra blocks only add scheduling work), at least one.
inline unsigned grid_for(std::int64_t n, const Stream& stream, int block = kBlockSize) {
  const std::int64_t wanted = (n + block - 1) / block;
  const std::int64_t most = std::int64_t{32} * sm_count(stream.device().index);
  return static_cast<unsigned>(std::clamp<std::int64_t>(wanted, 1, most));
}

// The indices one thread visits in a grid-stride loop over n items: its index in
// the grid, then every (threads in the grid)-th after it, while below n:
//   for (const std::int64_t i : grid_stride(n)) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
// The loop every kernel of launch_grid_stride runs, written once.
class GridStride {
 public:
  struct End {};
  class Iterator {
   public:
    __device__ Iterator(std::int64_t i, std::int64_t stride, std::int64_t n)
        : i_(i), stride_(stride), n_(n) {}
    __device__ std::int64_t operator*() const { return i_; }
    __device__ Iterator& operator++() {
      i_ += stride_;
      return *this;
    }
    __device__ bool operator!=(End) const { return i_ < n_; }

   private:
    std::int64_t i_, stride_, n_;
  };

  __device__ explicit GridStride(std::int64_t n) : n_(n) {}
  __device__ Iterator begin() const {
    return {blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x,
            std::int64_t{gridDim.x} * blockDim.x, n_};
  }
  __device__ End end() const { return {}; }

 private:
  std::int64_t n_;
};

__device__ inline GridStride grid_stride(std::int64_t n) {
  return GridStride(n);
}

// Launches a grid-stride kernel over n items on the stream's device:
//   launch_grid_stride(relu_forward_kernel, y.numel(), stream, y_ptr, x_ptr);
// runs relu_forward_kernel<<<grid_for(n, stream), kBlockSize, 0, s>>>(n, y_ptr, x_ptr).
// The kernel takes the item count first (as tiny-cuda-nn's linear_kernel does), so
// the count that sizes the grid is the one the loop runs to. Nothing is launched
// for n == 0. The arguments convert to the kernel's parameter types here, on the
// host, so a mismatch is a compile error at the call site.
template <typename... Params>
void launch_grid_stride(void (*kernel)(std::int64_t, Params...), std::int64_t n,
                        const Stream& stream, std::type_identity_t<Params>... args) {
  if (n == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  kernel<<<grid_for(n, stream), kBlockSize, 0, native(stream)>>>(n, args...);
  TL_CUDA_CHECK_LAUNCH();
}

// Sum of v over the 32 lanes of a warp, in every lane. The butterfly (xor) order
// is fixed, so the result is the same every run. All 32 lanes must call it.
template <typename V>
__device__ V warp_sum(V v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Sum of v over a block of kBlock threads (a multiple of 32, at most 1024); the
// result is valid in thread 0. Warp sums first, then warp 0 sums the warps' sums:
// a fixed tree, so the same bits every run. Every thread of the block must call
// it (it holds barriers); it may be called again right after (the last barrier
// protects its shared memory from the next call's writes).
template <int kBlock, typename V>
__device__ V block_sum(V v) {
  static_assert(kBlock % kWarpSize == 0 && kBlock <= 1024,
                "block_sum: kBlock must be 32..1024, a multiple of 32");
  constexpr int kWarps = kBlock / kWarpSize;
  __shared__ V warp_sums[kWarps];
  v = warp_sum(v);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) v = warp_sum(lane < kWarps ? warp_sums[lane] : V(0));
  __syncthreads();
  return v;
}

// Scratch device memory from the device's caching allocator, ordered on one stream
// and given back when the launcher returns or throws: the allocator hands it out
// again only to later work on that stream, so the kernels already queued keep it.
class Scratch {
 public:
  Scratch(const Stream& stream, std::size_t bytes)
      : allocator_(device_allocator(stream.device())),
        ptr_(allocator_.allocate(bytes, native(stream))) {}
  ~Scratch() { allocator_.deallocate(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  Allocator& allocator_;
  void* ptr_;
};

// *first = min(*first, every i < n with found(i)). The minimum does not depend on
// the order the atomics land in, so the answer is the same every run.
template <typename Predicate>
__global__ void first_index_kernel(std::int64_t n, unsigned long long* first, Predicate found) {
  for (const std::int64_t i : grid_stride(n)) {
    if (found(i)) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;  // this thread's later indices are larger
    }
  }
}

// The smallest i < n with found(i), or -1. Waits for the stream: the answer is
// needed on the host (to name the element in an error message or to decide a step).
template <typename Predicate>
std::int64_t first_index_where(std::int64_t n, Predicate found, const Stream& stream) {
  if (n == 0) return -1;
  CudaDeviceGuard guard(stream.device().index);
  cudaStream_t s = native(stream);
  Scratch first(stream, sizeof(unsigned long long));
  TL_CUDA_CHECK(cudaMemsetAsync(first.as<void>(), 0xff, sizeof(unsigned long long), s));
  launch_grid_stride(first_index_kernel<Predicate>, n, stream, first.as<unsigned long long>(),
                     found);
  unsigned long long host_first = 0;
  TL_CUDA_CHECK(cudaMemcpyAsync(&host_first, first.as<void>(), sizeof(host_first),
                                cudaMemcpyDeviceToHost, s));
  TL_CUDA_CHECK(cudaStreamSynchronize(s));
  return host_first == ~0ull ? -1 : static_cast<std::int64_t>(host_first);
}

}  // namespace towerlab::cuda
