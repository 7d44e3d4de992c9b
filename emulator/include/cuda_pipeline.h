// CUDA's pipeline primitives (cuda_pipeline_primitives.h) on the emulated GPUs:
// asynchronous copies of 4, 8 or 16 bytes from global to shared memory, committed
// in batches and waited for batch by batch (what cp.async does on sm_80 and later).
//
// How the emulator honours them (src/block.cpp). A copy reads its source when it
// is issued and writes its destination only when the thread waits for its batch:
// __pipeline_wait_prior(n) completes every committed batch but the n newest. At
// issue the destination is filled with 0xff bytes (NaN as floats), as undefined as
// it is on hardware until the wait. So a kernel that reads a destination before
// its own thread waited, or before the __syncthreads that follows the waits of the
// threads that wrote it, reads NaN, and its results show it. Reported at once
// (exit status 86): a size other than 4, 8 or 16, zfill above the size, a source
// or destination not aligned to the size, a destination outside the block's
// __shared__ memory. Copies still pending when their thread returns are dropped
// (a kernel that never waits sees only the NaN fill).
#pragma once

#include <cstddef>

namespace tlemu::detail {
void pipeline_copy(void* dst_shared, const void* src_global, std::size_t size_and_align,
                   std::size_t zfill);
void pipeline_commit();
void pipeline_wait_prior(std::size_t prior);
}  // namespace tlemu::detail

// Copies size_and_align - zfill bytes from src_global and zeros the last zfill bytes
// of the size_and_align at dst_shared.
inline void __pipeline_memcpy_async(void* __restrict dst_shared, const void* __restrict src_global,
                                    std::size_t size_and_align, std::size_t zfill = 0) {
  tlemu::detail::pipeline_copy(dst_shared, src_global, size_and_align, zfill);
}
inline void __pipeline_commit() {
  tlemu::detail::pipeline_commit();
}
inline void __pipeline_wait_prior(std::size_t prior) {
  tlemu::detail::pipeline_wait_prior(prior);
}
