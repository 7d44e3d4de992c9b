// Launch helpers shared by the CUDA kernel files: the stream handle, the grid for
// a grid-stride loop over n elements, and the device guard every launcher takes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

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

}  // namespace towerlab::cuda
