// The CUDA conv2d entry points (internal: not installed, not in towerlab.h).
// Public contract and dispatch in kernels/conv2d.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/cpu/conv2d.h"  // Conv2dShape, which both backends receive

namespace towerlab::cuda {

// Arguments already checked, work not empty.
void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dShape& shape, const Stream& stream);
void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dShape& shape, const Stream& stream);

// Depthwise (groups == C), in kernels/cuda/conv2d_depthwise.cu: as cpu::'s of the same
// names (kernels/cpu/conv2d.h), float32.
void conv2d_depthwise_forward(const Tensor& y, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, const Conv2dShape& shape, const Stream& stream);
void conv2d_depthwise_backward(const Tensor& grad_x, const Tensor& grad_weight,
                               const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                               const Conv2dShape& shape, GradWrite grad_x_write,
                               const Stream& stream);

}  // namespace towerlab::cuda
