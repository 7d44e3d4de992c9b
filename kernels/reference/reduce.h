// The plain reference of the whole-tensor reductions (contracts in
// kernels/reduce.h): the CPU backend's sum, and what CUDA's tree reduction is
// tested against. T is float or double.
#pragma once

#include <cstdint>

namespace towerlab::reference {

// sum_i x[i], one running sum in double in index order (its rounding is the
// specification); x [n]. The caller scales it (mean) and rounds it to T.
template <typename T>
double sum(const T* x, std::int64_t n);

// sum_i x[i]^2, each square and the running sum in double, in index order; x [n].
template <typename T>
double sum_squares(const T* x, std::int64_t n);

}  // namespace towerlab::reference
