// Stands in for CUB's DeviceReduce in scripts/sim_kernels.sh: the launcher's use of
// it (ask for the temporary size, allocate, reduce, free) runs against the real
// contract; the reduction itself is a host loop, since CUB's kernels are not ours
// to check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "sim_cuda.h"

namespace cub {

struct DeviceReduce {
  // *out = sum of in[0..n); with temp == nullptr, only sets temp_bytes.
  template <typename In, typename Out>
  static cudaError_t Sum(void* temp, std::size_t& temp_bytes, In in, Out out, std::int64_t n,
                         cudaStream_t = nullptr) {
    constexpr std::size_t kBytes = 64;  // nonzero, so that a missing allocation shows
    if (temp == nullptr) {
      temp_bytes = kBytes;
      return cudaSuccess;
    }
    if (temp_bytes < kBytes) return sim::fail(cudaErrorInvalidValue);
    std::memset(temp, 0, kBytes);  // AddressSanitizer: the allocation is as large as asked
    double sum = 0.0;
    for (std::int64_t i = 0; i < n; ++i) sum += in[i];
    *out = static_cast<float>(sum);
    return cudaSuccess;
  }
};

}  // namespace cub
