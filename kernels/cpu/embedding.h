// CPU backend entry points of embedding (contracts in kernels/embedding.h), called
// by its dispatch once the arguments (the ids included) are checked.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "kernels/grad_write.h"

namespace towerlab::cpu {

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& table);
void embedding_backward(const Tensor& grad_table, const Tensor& grad_y, const Tensor& ids,
                        GradWrite write);
// The first m with ids[m] not a row id of a table of `rows` rows, or -1.
std::int64_t first_invalid_id(const Tensor& ids, std::int64_t rows);

}  // namespace towerlab::cpu
