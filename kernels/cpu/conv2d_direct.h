// The CPU's direct convolution for one input channel and a 3x3 kernel, unit stride
// and dilation (a first layer on gray images, FashionNet's conv1): the forward and
// the weight gradient of conv2d without im2col (internal: the contract is
// kernels/conv2d.h's, the dispatch kernels/cpu/conv2d.cpp's). Dimension letters as
// in kernels/conv2d.h; all arrays float32.
//
// Its product has an inner dimension of R*S = 9, far too short for the GEMM's rate,
// and im2col would copy each image nine times to feed it; here each image is copied
// three times instead (one copy per kernel column, kernels/cpu/conv2d_direct.cpp)
// and the taps are summed in registers. The forward writes float32, or a 16-bit
// layer's bfloat16 or float16 y rounded from the sums in the store.
//
// Numerics: each output y[n,k,p,q] is the fused multiply-add chain of its nine taps
// in the order (r, s), from zero, plus the bias: im2col's order. The weight gradient
// of a group of images sums each (k, tap) in sixteen lanes, lane l taking the
// pixels p*Q + q = l (mod 16) of every image in order, and then the lanes in a fixed
// tree; the AVX2 and AVX-512 code give the same bits, and neither depends on threads.
#pragma once

#include <cstdint>

#include "kernels/cpu/conv2d.h"

namespace towerlab::cpu {

// Whether the direct path computes `s` in `dtype` on this CPU: one channel, 3x3,
// unit stride and dilation, float32, and the GEMM's AVX2 or AVX-512 kernel selected.
bool direct_single_channel(const Conv2dShape& s, DType dtype);

// y [images,K,P,Q] = bias + conv2d(x [images,1,H,W], weight [K,1,3,3]): ASSIGNS y.
// bias [K] may be null. Out is float, or bfloat16 or float16 for a 16-bit layer's
// output: each sum rounded once, to nearest even, as it is stored (the bits of the
// float32 y cast; kernels/cpu/convert16.h's store8 and store16). A float16 Out needs
// F16C beside AVX2 (kernels/cpu/conv2d.cpp asks).
template <typename Out>
void direct_forward(Out* y, const float* x, const float* weight, const float* bias,
                    std::int64_t images, const Conv2dShape& s);

// sum [R*S, K] = the weight gradient, transposed, of the images [0, images):
// sum[(r,s), k] = sum_{n,p,q} grad_y[n,k,p,q] * x[n, p + r - pad_h, q + s - pad_w]
// (x zero outside [H, W]). ASSIGNS sum. x [images,1,H,W], grad_y [images,K,P,Q].
void direct_weight_grad(float* sum, const float* x, const float* grad_y, std::int64_t images,
                        const Conv2dShape& s);

}  // namespace towerlab::cpu
