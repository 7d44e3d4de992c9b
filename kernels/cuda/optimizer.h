// The CUDA optimizer updates (internal: not installed, not in towerlab.h). Public
// contracts and dispatch in kernels/optimizer.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/cpu/optimizer.h"  // AdamStep, which both backends receive

namespace towerlab::cuda {

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                const SgdParams& params, const Stream& stream);
void rmsprop_update(const Tensor& param, const Tensor& grad, const Tensor& mean_square,
                    const Tensor& moment, const Tensor& mean_grad, const RmspropParams& params,
                    const Stream& stream);
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 const AdamStep& step, const Stream& stream);

}  // namespace towerlab::cuda
