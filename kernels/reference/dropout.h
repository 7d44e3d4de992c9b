// The plain reference of dropout (contract in kernels/dropout.h): the CPU backend
// runs it on each thread's range, and the CUDA kernels are tested against it.
// Element i of a range has the global index first_element + i, where
// first_element = key.first_row * D + the range's start.
#pragma once

#include <cstdint>

#include "kernels/grad_write.h"

namespace towerlab::reference {

// 1 / (1 - p) rounded once to T: what a kept element is multiplied by.
template <typename T>
T dropout_scale(double p);

// y[i] = x[i] * m(first_element + i)  (ASSIGNED); x, y [n].
template <typename T>
void dropout_forward(T* y, const T* x, double p, std::uint64_t seed, std::uint64_t subsequence,
                     std::uint64_t first_element, std::int64_t n);

// grad_x[i] += grad_y[i] * m(first_element + i)  (ACCUMULATED; = with GradWrite::Assign);
// grad_x, grad_y [n].
template <typename T>
void dropout_backward(T* grad_x, const T* grad_y, double p, std::uint64_t seed,
                      std::uint64_t subsequence, std::uint64_t first_element, std::int64_t n,
                      GradWrite write);

}  // namespace towerlab::reference
