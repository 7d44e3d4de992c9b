// CUDA backend entry points of the fused residual add + ReLU (contracts in
// kernels/add_relu.h), called by its dispatch once the arguments are checked.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/add_relu.h"

namespace towerlab::cuda {

void add_relu_forward(const Tensor& y, const Tensor& a, const Tensor& b, const Stream& stream);
void add_relu_backward(const AddReluBackward& args, const Stream& stream);

}  // namespace towerlab::cuda
