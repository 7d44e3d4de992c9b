// The plain reference of softmax and log-softmax (contracts in kernels/softmax.h),
// in double whatever T is. The CPU backend runs it on each thread's range of rows
// in float64 (kernels/cpu/softmax.cpp); the CPU's float32 lanes and the CUDA
// kernels are tested against it. T is float or double.
//
// The arrays are the whole tensors seen as [R, D]; a call computes rows
// [first_row, last_row), so that a thread's range knows each row's query index
// i = r mod D under the causal mask.
#pragma once

#include <cstdint>

#include "kernels/grad_write.h"
#include "kernels/softmax.h"

namespace towerlab::reference {

// The number of kept values at the start of row r: D, or r mod D + 1 under the
// causal mask (keys j <= i).
inline std::int64_t softmax_kept(std::int64_t r, std::int64_t cols, SoftmaxMask mask) {
  return mask == SoftmaxMask::Causal ? r % cols + 1 : cols;
}

// y = softmax(x) or log_softmax(x) of each row; y, x [R, D]; y may alias x.
template <typename T>
void softmax_forward(T* y, const T* x, std::int64_t first_row, std::int64_t last_row,
                     std::int64_t cols, SoftmaxKind kind, SoftmaxMask mask);

// grad_x += (or =) the backward of kernels/softmax.h from the forward's output y;
// grad_x, grad_y, y [R, D].
template <typename T>
void softmax_backward(T* grad_x, const T* grad_y, const T* y, std::int64_t first_row,
                      std::int64_t last_row, std::int64_t cols, SoftmaxKind kind, SoftmaxMask mask,
                      GradWrite write);

}  // namespace towerlab::reference
