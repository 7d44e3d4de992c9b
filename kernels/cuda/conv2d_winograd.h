// Winograd F(4x4, 3x3) conv2d on CUDA (internal: the contract is kernels/conv2d.h's,
// the dispatch at the top of kernels/cuda/conv2d.cu's entry points; the algorithm,
// its numerics and its speed in conv2d_winograd.cu).
#pragma once

#include "engine/stream.h"
#include "kernels/cpu/conv2d.h"  // Conv2dShape, Conv2dAlgorithm

namespace towerlab::cuda {

// The three passes of a convolution, each chosen on its own.
enum class WinogradPass { Forward, BackwardData, BackwardWeight };

// Whether `pass` of the float32 conv2d `s` takes Winograd under the process-wide
// Conv2dAlgorithm: Winograd forces it wherever it applies (3x3, stride 1, dilation
// 1, padding 0 or 1, as on the CPU), Im2col never takes it. Auto takes it where the
// pass's GEMMs are wide enough to pay for the transforms: forward and backward-data
// where the correlation reduces at least 64 channels into at least 32 (the forward
// C into K, backward-data K into C), the weight gradient where one channel count is
// at least 64 and the other at least 32.
bool winograd_chosen(const Conv2dShape& s, WinogradPass pass);

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
