// The CUDA peer_add entry point (internal: not installed, not in towerlab.h).
// Public contract and dispatch in kernels/peer_add.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/peer_add.h"

namespace towerlab::cuda {

// Arguments already checked by peer_add.
void peer_add(const Tensor& dst, const Tensor& src, const Stream& stream);
void peer_sum(const std::vector<Tensor>& buffers, const std::vector<std::int64_t>& first,
              const Stream& stream);

}  // namespace towerlab::cuda
