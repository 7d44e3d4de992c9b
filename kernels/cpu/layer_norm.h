// CPU backend entry points of layer normalization (contracts in
// kernels/layer_norm.h), called by their dispatch once the arguments are checked.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "kernels/layer_norm.h"

namespace towerlab::cpu {

void layer_norm_forward(const LayerNormForward& args);
void layer_norm_backward(const LayerNormBackward& args);

}  // namespace towerlab::cpu
