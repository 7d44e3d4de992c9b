// The lowering of the CPU conv2d's GEMM path (internal: kernels/cpu/conv2d.cpp
// multiplies, contracts and dimension letters in kernels/conv2d.h): im2col writes an
// image's patch matrix, col2im adds its gradient back onto the input's pixels. With
// h(p,r) = p*stride_h - pad_h + r*dilation_h and w(q,s) likewise,
//   col[(c,r,s), (p,q)] = x[c, h(p,r), w(q,s)]            [C*R*S, P*Q]
// zero where (h, w) falls in the padding. T is float or double (the gradient
// checks), and for im2col also bfloat16 (the bfloat16 GEMM path of
// kernels/cpu/conv2d.cpp); each gives the plain loop's bits on every ISA.
#pragma once

#include <cstdint>

#include "kernels/cpu/conv2d.h"

namespace towerlab::cpu {

// Whether the layer needs lowering: all but a 1x1 kernel with stride 1 and no
// padding, whose col is x[n] itself.
bool needs_lowering(const Conv2dShape& s);

// col [C*R*S, P*Q] = the patch matrix of one image x [C,H,W], its rows ld apart
// (ld >= P*Q: several images' patch matrices side by side, one GEMM's B, take
// ld = images * P*Q, each image's at its own column offset).
template <typename T>
void im2col(T* col, const T* x, const Conv2dShape& s, std::int64_t ld);

// The adjoint of im2col: x[c, h(p,r), w(q,s)] += col[(c,r,s), (p,q)] for every
// patch element that is not padding, onto x [C,H,W] as it is or (assign) onto
// zeros, x then not read; each pixel adds its taps in (r, s) order. col [C*R*S, P*Q]
// is scratch, consumed here: its padding columns may be zeroed.
template <typename T>
void col2im_add(T* x, T* col, const Conv2dShape& s, bool assign);

}  // namespace towerlab::cpu
