// The CPU conv2d entry points, and the problem description both backends receive
// (internal: not installed, not in towerlab.h). Public contract and dispatch in
// kernels/conv2d.h.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "kernels/conv2d.h"

namespace towerlab {

// The problem's sizes, worked out once by the checks and handed to the backends.
struct Conv2dShape {
  std::int64_t N, C, H, W;  // input
  std::int64_t K, R, S;     // weight [K,C,R,S]
  std::int64_t P, Q;        // output
  Conv2dParams params;
};

namespace cpu {
// Arguments already checked, work not empty.
void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dShape& shape);
void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dShape& shape);
}  // namespace cpu

}  // namespace towerlab
