// Winograd F(4x4, 3x3) conv2d on CUDA (internal: the contract is kernels/conv2d.h's,
// the dispatch at the top of kernels/cuda/conv2d.cu's entry points; the algorithm,
// its numerics and its speed in conv2d_winograd.cu).
#pragma once

#include "engine/stream.h"
#include "kernels/cpu/conv2d.h"  // Conv2dShape, Conv2dAlgorithm

namespace towerlab::cuda {

// Whether the float32 forward and backward-data of `s` take Winograd under the
// process-wide Conv2dAlgorithm: Winograd forces it wherever it applies (3x3, stride
// 1, dilation 1, padding 0 or 1, as on the CPU), Im2col never takes it, Auto takes
// it from 64 input and 64 output channels on. The weight gradient follows the same
// choice.
bool winograd_chosen(const Conv2dShape& s);

// y [N,K,P,Q] = bias + conv2d(x, weight): ASSIGNS y. bias [K] may be null.
void winograd_forward(float* y, const float* x, const float* weight, const float* bias,
                      const Conv2dShape& s, const Stream& stream);

// grad_x [N,C,H,W] += the input gradient of conv2d for grad_y [N,K,P,Q] (ACCUMULATES).
void winograd_backward_data(float* grad_x, const float* grad_y, const float* weight,
                            const Conv2dShape& s, const Stream& stream);

// grad_weight [K,C,3,3] += the weight gradient of conv2d for grad_y [N,K,P,Q] and
// x [N,C,H,W] (ACCUMULATES).
void winograd_backward_weight(float* grad_weight, const float* grad_y, const float* x,
                              const Conv2dShape& s, const Stream& stream);

}  // namespace towerlab::cuda
