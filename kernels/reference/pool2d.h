// The plain reference of 2-D max and average pooling: the specification that the
// CPU's vector paths (the 2x2 windows, the fused batch norm's planes) and the CUDA
// kernels are tested against. One output at a time, its window spelled out.
//
// Dimension letters, as in kernels/pool2d.h: N batch, C channels, H x W the input
// plane, Ho x Wo the output plane (pool2d_output_shape). Output (ho, wo) covers
// rows ho*stride_h - pad_h + i (i < kernel_h) and columns likewise, clipped to the
// plane: padding is never a value (it never wins a max and is not counted in an
// average). x and grad_x are [N,C,H,W]; y, argmax and grad_y are [N,C,Ho,Wo].
#pragma once

#include <cstdint>

#include "kernels/pool2d.h"

namespace towerlab::reference {

// y = the window's maximum, ASSIGNED; the first maximum in row-major window order
// wins a tie, and the first NaN wins over everything (NaN propagates). When argmax
// is not nullptr it is ASSIGNED the winner's position h*W + w in its plane.
void max_pool2d_forward(double* y, double* argmax, const double* x, const Shape& x_shape,
                        const Pool2dParams& params);

// grad_x[n,c][argmax[n,c,ho,wo]] += grad_y[n,c,ho,wo]: ACCUMULATED, argmax from
// max_pool2d_forward (the backward of max pooling).
void max_pool2d_backward(double* grad_x, const double* grad_y, const double* argmax,
                         const Shape& x_shape, const Pool2dParams& params);

// y = sum of the window's real values / their count, ASSIGNED.
void avg_pool2d_forward(double* y, const double* x, const Shape& x_shape,
                        const Pool2dParams& params);

// grad_x[each real value of the window] += grad_y / count: ACCUMULATED.
void avg_pool2d_backward(double* grad_x, const double* grad_y, const Shape& x_shape,
                         const Pool2dParams& params);

}  // namespace towerlab::reference
