// The plain reference of conv2d: the specification that the CPU's fast paths
// (im2col + GEMM, the direct and implicit-GEMM kernels, Winograd) and the CUDA
// kernels are tested against. Seven loops in double, read in a minute; nothing here
// is fast, and nothing in the library calls it.
//
// Dimension letters, as in kernels/conv2d.h: N images, C input channels, H x W input
// size, K output channels, R x S kernel size, P x Q output size
// (conv2d_output_shape). h(p,r) = p*stride_h - pad_h + r*dilation_h, w(q,s) likewise;
// x is zero outside [0,H) x [0,W). G = params.groups splits the channels: output
// channel k is in group g(k) = k / (K/G) and reads x's channels g(k)*C/G + c, c < C/G.
#pragma once

#include "kernels/conv2d.h"

namespace towerlab::reference {

// y[n,k,p,q] = bias[k] + sum_{c<C/G,r,s} weight[k,c,r,s] * x[n,g(k)*C/G+c,h(p,r),w(q,s)]
//   ASSIGNS y. y [N,K,P,Q], x [N,C,H,W], weight [K,C/G,R,S], bias [K] or nullptr (no bias).
void conv2d_forward(double* y, const double* x, const double* weight, const double* bias,
                    const Shape& x_shape, const Shape& weight_shape, const Conv2dParams& params);

// The three gradients of L = sum grad_y * y, ACCUMULATED (+=); any may be nullptr:
//   grad_x[n,g(k)*C/G+c,h(p,r),w(q,s)] += grad_y[n,k,p,q] * weight[k,c,r,s]
//                                          (taps in the padding dropped)
//   grad_weight[k,c,r,s] += grad_y[n,k,p,q] * x[n,g(k)*C/G+c,h(p,r),w(q,s)]
//   grad_bias[k]              += grad_y[n,k,p,q]
// summed over every (n, k, p, q, c < C/G, r, s). Shapes as conv2d_forward's, grad_* like
// the tensor they are the gradient of.
void conv2d_backward(double* grad_x, double* grad_weight, double* grad_bias, const double* grad_y,
                     const double* x, const double* weight, const Shape& x_shape,
                     const Shape& weight_shape, const Conv2dParams& params);

}  // namespace towerlab::reference
