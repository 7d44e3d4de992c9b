// The plain reference of 2-D max and average pooling: the specification that the
// CPU's vector paths (the 2x2 windows, the fused batch norm's planes) and the CUDA
// kernels are tested against. One output at a time, its window spelled out.
//
// Dimension letters, as in kernels/pool2d.h: N batch, C channels, H x W the input
// plane, Ho x Wo the output plane (pool2d_output_shape). Output (ho, wo) covers
// rows ho*stride_h - pad_h + i (i < kernel_h) and columns likewise, clipped to the
// plane: padding is never a value (it never wins a max and is not counted in an
// average). x and grad_x are [N,C,H,W]; y, argmax and grad_y are [N,C,Ho,Wo].
//
// T is double, bfloat16 or float16 (the float32 paths are compared with the double
// reference within a tolerance). Every computation is in math_t<T>
// (kernels/reference/math_type.h): double for double, float32 for a 16-bit T, whose
// values are widened exactly and whose results are rounded once, to nearest even,
// when stored. argmax is math_t<T> too: a plane position is exact in float32 up to
// 2^24, in bfloat16 only up to 256.
//
// The order of the sums, which is the bits in 16 bits: an average adds its window's
// values from +0 in row-major window order and divides by the count; a backward sums
// each grad_x element's terms (the outputs that took it, or whose window covers it,
// in row-major (ho, wo) order) from +0, then adds that sum to grad_x once. This is
// the CUDA kernels' gather order, so CUDA gives these bits in 16 bits; the CPU's
// 16-bit paths run this reference.
#pragma once

#include <cstdint>

#include "kernels/pool2d.h"
#include "kernels/reference/math_type.h"

namespace towerlab::reference {

// y = the window's maximum, ASSIGNED; the first maximum in row-major window order
// wins a tie, and the first NaN wins over everything (NaN propagates). When argmax
// is not nullptr it is ASSIGNED the winner's position h*W + w in its plane. y is a
// copy of the winner (exact in every dtype, a NaN's payload included).
template <typename T>
void max_pool2d_forward(T* y, math_t<T>* argmax, const T* x, const Shape& x_shape,
                        const Pool2dParams& params);

// grad_x[n,c][argmax[n,c,ho,wo]] += grad_y[n,c,ho,wo]: ACCUMULATED, argmax from
// max_pool2d_forward (the backward of max pooling); each element's terms summed
// first, then added to grad_x once (above).
template <typename T>
void max_pool2d_backward(T* grad_x, const T* grad_y, const math_t<T>* argmax, const Shape& x_shape,
                         const Pool2dParams& params);

// y = sum of the window's real values / their count, ASSIGNED.
template <typename T>
void avg_pool2d_forward(T* y, const T* x, const Shape& x_shape, const Pool2dParams& params);

// grad_x[each real value of the window] += grad_y / count: ACCUMULATED, each
// element's shares summed first, then added to grad_x once (above).
template <typename T>
void avg_pool2d_backward(T* grad_x, const T* grad_y, const Shape& x_shape,
                         const Pool2dParams& params);

}  // namespace towerlab::reference
