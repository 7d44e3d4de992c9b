// Launch helpers shared by the CUDA kernel files: the stream handle, the grid for
// a grid-stride loop over n elements, scratch memory from the caching allocator,
// and a search for the first index where a condition holds (for the checks that
// must name an offending element: labels out of range, NaN in a gradient).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "engine/allocator.h"
#include "engine/cuda_check.h"
#include "engine/stream.h"

namespace towerlab::cuda {

inline cudaStream_t native(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}

constexpr int kBlockSize = 256;

// Blocks for a grid-stride loop over n items: enough to fill every SM several
// times over, no more (extra blocks only add scheduling work), at least one.
inline unsigned grid_for(std::int64_t n, int block = kBlockSize) {
  const std::int64_t wanted = (n + block - 1) / block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(wanted, 1, 132 * 32));
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
__global__ void first_index_kernel(unsigned long long* first, std::int64_t n, Predicate found) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
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
  first_index_kernel<<<grid_for(n), kBlockSize, 0, s>>>(first.as<unsigned long long>(), n, found);
  TL_CUDA_CHECK_LAUNCH();
  unsigned long long host_first = 0;
  TL_CUDA_CHECK(cudaMemcpyAsync(&host_first, first.as<void>(), sizeof(host_first),
                                cudaMemcpyDeviceToHost, s));
  TL_CUDA_CHECK(cudaStreamSynchronize(s));
  return host_first == ~0ull ? -1 : static_cast<std::int64_t>(host_first);
}

}  // namespace towerlab::cuda
