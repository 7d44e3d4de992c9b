// CUDA backend entry points of batch normalization (contracts in
// kernels/batchnorm.h), called by its dispatch with the BatchNormArgs of
// kernels/cpu/batchnorm.h; each reads the fields its CPU namesake lists.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include <cstdint>

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/cpu/batchnorm.h"

namespace towerlab::cuda {

void batchnorm_stats(const BatchNormArgs& a, const Stream& stream);
void batchnorm_merge_stats(const BatchNormMergeStats& a, const Stream& stream);
void batchnorm_forward_from_stats(const BatchNormArgs& a, const Stream& stream);
void batchnorm_forward_inference(const BatchNormArgs& a, const Stream& stream);
void batchnorm_backward_reduce(const BatchNormArgs& a, const Stream& stream);
void batchnorm_backward_apply(const BatchNormArgs& a, const Stream& stream);

}  // namespace towerlab::cuda
