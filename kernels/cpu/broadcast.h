// CPU backend entry points of broadcasting add and mul and of sum_to_shape
// (contracts in kernels/broadcast.h), called by their dispatch once the arguments
// are checked. Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/tensor.h"
#include "kernels/broadcast.h"
#include "kernels/grad_write.h"

namespace towerlab::cpu {

void broadcast_binary(const Tensor& out, const Tensor& a, const Tensor& b, BroadcastOp op);
void sum_to_shape(const Tensor& out, const Tensor& x, GradWrite write);

}  // namespace towerlab::cpu
