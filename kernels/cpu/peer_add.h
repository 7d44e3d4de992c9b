// The CPU peer_add entry point (internal: not installed, not in towerlab.h).
// Public contract and dispatch in kernels/peer_add.h.
#pragma once

#include "engine/tensor.h"
#include "kernels/peer_add.h"

namespace towerlab::cpu {

// Arguments already checked by peer_add.
void peer_add(const Tensor& dst, const Tensor& src);
void peer_sum(const std::vector<Tensor>& buffers, const std::vector<std::int64_t>& first);

}  // namespace towerlab::cpu
