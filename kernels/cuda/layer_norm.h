// CUDA backend entry points of layer normalization (contracts in
// kernels/layer_norm.h), called by their dispatch once the arguments are checked.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/stream.h"
#include "kernels/layer_norm.h"

namespace towerlab::cuda {

void layer_norm_forward(const LayerNormForward& args, const Stream& stream);
void layer_norm_backward(const LayerNormBackward& args, const Stream& stream);

}  // namespace towerlab::cuda
