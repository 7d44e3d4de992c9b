// The plain reference of layer normalization (contracts in kernels/layer_norm.h),
// in double whatever T is. The CPU backend runs it for double on each thread's
// range of rows (or of columns, for the weight and bias gradients:
// kernels/cpu/layer_norm.cpp); its float path (the same double arithmetic in vector
// lanes) and the CUDA kernels are tested against it. T is float or double.
//
// The arrays are the whole tensors, x and its kin seen as [R, D]; a null pointer
// is an absent tensor (weight, bias, a gradient not asked for).
#pragma once

#include <cstdint>

#include "kernels/grad_write.h"

namespace towerlab::reference {

template <typename T>
struct LayerNormForwardData {
  T* y;             // [R, D]
  T* mean;          // [R]
  T* rstd;          // [R]
  const T* x;       // [R, D]
  const T* weight;  // [D] or null (1)
  const T* bias;    // [D] or null (0)
  std::int64_t rows = 0, cols = 0;
  double eps = 1e-5;
};

template <typename T>
struct LayerNormBackwardData {
  T* grad_x;        // [R, D] or null
  T* grad_weight;   // [D] or null, accumulated
  T* grad_bias;     // [D] or null, accumulated
  const T* grad_y;  // [R, D]
  const T* x;       // [R, D]
  const T* weight;  // [D] or null (1)
  const T* mean;    // [R]
  const T* rstd;    // [R]
  std::int64_t rows = 0, cols = 0;
  GradWrite grad_x_write = GradWrite::Accumulate;
};

// mean, rstd and y of rows [first_row, last_row).
template <typename T>
void layer_norm_forward(const LayerNormForwardData<T>& d, std::int64_t first_row,
                        std::int64_t last_row);

// grad_x of rows [first_row, last_row) (nothing when grad_x is null).
template <typename T>
void layer_norm_backward_x(const LayerNormBackwardData<T>& d, std::int64_t first_row,
                           std::int64_t last_row);

// grad_weight and grad_bias of columns [first_col, last_col), each the sum over
// every row in row order (nothing for a null one).
template <typename T>
void layer_norm_backward_params(const LayerNormBackwardData<T>& d, std::int64_t first_col,
                                std::int64_t last_col);

}  // namespace towerlab::reference
