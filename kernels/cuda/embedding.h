// CUDA backend entry points of embedding (contracts in kernels/embedding.h), called
// by its dispatch once the arguments are checked.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include <cstdint>

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/grad_write.h"

namespace towerlab::cuda {

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& table,
                       const Stream& stream);
void embedding_backward(const Tensor& grad_table, const Tensor& grad_y, const Tensor& ids,
                        const Stream& stream, GradWrite write);
// The first m with ids[m] not a row id of a table of `rows` rows, or -1 (waits).
std::int64_t first_invalid_id(const Tensor& ids, std::int64_t rows, const Stream& stream);

}  // namespace towerlab::cuda
