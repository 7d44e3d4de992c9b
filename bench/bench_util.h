// Helpers every bench program shares: skipping CUDA cases where there is no GPU,
// and the copy that memory-bound kernels are measured against.
#pragma once

#include <benchmark/benchmark.h>

#include "towerlab.h"

namespace towerlab::bench {

// True, with the benchmark marked skipped, when `device` is a GPU that is not here.
inline bool skip_without(Device device, benchmark::State& state) {
  if (device.is_cuda() && cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

// The reference of the memory-bound kernels: one copy of src into dst within the
// device (cudaMemcpyAsync device-to-device on a GPU, memmove on the CPU), waited for.
inline void copy_reference(const Tensor& dst, const Tensor& src, const Stream& stream) {
  copy_tensor(dst, src, stream);
  stream.synchronize();
  benchmark::ClobberMemory();
}

}  // namespace towerlab::bench
