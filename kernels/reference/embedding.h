// The plain reference of embedding (contracts in kernels/embedding.h): the CPU's
// forward runs it on each thread's range of ids, and the CPU's backward and the
// CUDA kernels are tested against it, bit for bit. T is float or double.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/grad_write.h"

namespace towerlab::reference {

// Whether `id` names a row of a table of `rows` rows: integral, in [0, rows).
// NaN and the infinities are not.
template <typename T>
bool is_row_id(T id, std::int64_t rows) {
  return id >= T(0) && id < static_cast<T>(rows) && std::floor(id) == id;
}

// The first m in index order with ids[m] not a row id, or -1; ids [M].
template <typename T>
std::int64_t first_invalid_id(const T* ids, std::int64_t count, std::int64_t rows);

// y[m,:] = table[ids[m],:] for m in [first, last); y [M, D], ids [M], table [V, D].
// Every id in the range is a row id (checked by the caller).
template <typename T>
void embedding_forward(T* y, const T* ids, const T* table, std::int64_t first, std::int64_t last,
                       std::int64_t cols);

// Rows [first_row, last_row) of grad_table: zeroed under GradWrite::Assign, then
// for m = 0, ..., M-1 in order, grad_table[ids[m],:] += grad_y[m,:] where ids[m]
// is in the range; grad_table [V, D], grad_y [M, D], ids [M] (row ids).
template <typename T>
void embedding_backward(T* grad_table, const T* grad_y, const T* ids, std::int64_t count,
                        std::int64_t cols, std::int64_t first_row, std::int64_t last_row,
                        GradWrite write);

}  // namespace towerlab::reference
