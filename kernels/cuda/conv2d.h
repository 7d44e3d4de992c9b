// The CUDA conv2d entry points (internal: not installed, not in towerlab.h).
// Public contract and dispatch in kernels/conv2d.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/cpu/conv2d.h"  // Conv2dShape, which both backends receive

namespace towerlab::cuda {

// Arguments already checked, work not empty; the gradients accumulate. float32, in
// kernels/cuda/conv2d.cu.
void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dShape& shape, const Stream& stream);
void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dShape& shape, const Stream& stream);

// The same on the tensor cores, one group, in kernels/cuda/conv2d_tc.cu: x, weight
// and grad_y all bfloat16, all float16, or all float32 (multiplied in TF32:
// Float32Math::Tf32); y, bias and the gradients float32. The backward computes
// grad_x and grad_weight only (the caller sums grad_bias).
void conv2d_tc_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Conv2dShape& shape, const Stream& stream);
void conv2d_tc_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_y,
                        const Tensor& x, const Tensor& weight, const Conv2dShape& shape,
                        const Stream& stream);

// Depthwise (groups == C), in kernels/cuda/conv2d_depthwise.cu: as cpu::'s of the same
// names (kernels/cpu/conv2d.h), float32.
void conv2d_depthwise_forward(const Tensor& y, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, const Conv2dShape& shape, const Stream& stream);
void conv2d_depthwise_backward(const Tensor& grad_x, const Tensor& grad_weight,
                               const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                               const Conv2dShape& shape, GradWrite grad_x_write,
                               const Stream& stream);

}  // namespace towerlab::cuda
