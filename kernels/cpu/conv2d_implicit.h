// The weight gradient of a 3x3 convolution with stride 1 or 2 as an implicit GEMM on
// AVX-512 and AVX2 (internal: kernels/cpu/conv2d.cpp calls it; contracts in kernels/conv2d.h).
//
// im2col + GEMM computes, per image, the partial
//   sum[(c,r,s), k] (+)= Σ_p col[(c,r,s), p] · grad_y[k, p]      p = (h, w), P*Q of them
// by first copying every patch into col [C*9, P*Q] and then packing col into the
// GEMM's panels: two passes over a matrix nine times the image (at stride 2, where
// Winograd never takes the weight gradient, most of its time).
// Here the micro-kernel broadcasts col's elements straight from the zero-padded image
// instead, since col[(c,r,s), (h,w)] = padded[c, h*stride_h + r, w*stride_w + s]: the
// nine taps of channel c at pixel (h, w) are three runs of three floats in three rows
// of the padded plane. A tile is
// one channel's nine taps by 32 filters (18 accumulators) on AVX-512; on AVX2, with
// half the registers, six consecutive rows (c, r, s) by 16 filters (12), as the
// AVX2 GEMM's 6 x 16 tile. grad_y's rows are packed 32 at a time, once per image,
// as the AVX-512 GEMM packs its B ([P*Q][32]).
//
// Bits: each output sums its products in pixel order, kGemmKc pixels at a time in
// registers and the blocks onto the partial in order, with the GEMM micro-kernel's
// fused multiply-adds: the bits of im2col + gemm on either AVX kernel.
#pragma once

#include <cstdint>

#include "kernels/cpu/conv2d.h"

namespace towerlab::cpu {

// Whether the implicit weight gradient runs for this float32 problem: 3x3 kernel,
// stride 1 or 2 each way, unit dilation, padding 0 or 1, K a multiple of 32, the
// AVX2 or AVX-512 kernels.
bool implicit_weight_grad_applies(const Conv2dShape& s);

// The scratch one image needs, in floats: its padded planes and grad_y's panels.
std::int64_t implicit_weight_grad_scratch(const Conv2dShape& s);

// partial [C*9, K] = (first) or += (otherwise) the weight gradient of one image:
// x [C,H,W], grad_y [K,P*Q]; `scratch` holds implicit_weight_grad_scratch(s) floats.
void implicit_weight_grad(const float* x, const float* grad_y, float* partial, bool first,
                          float* scratch, const Conv2dShape& s);

// The forward of the same layers on AVX2 (not where AVX-512 is selected, whose GEMM
// keeps im2col), one image at a time, as an implicit GEMM too: im2col + GEMM computes
//   y[k, p] = (bias[k] +) Σ_(c,r,s) weight[k, (c,r,s)] · col[(c,r,s), p]
// with the weight's rows broadcast and 16 pixels of col a vector. At stride 2 col's
// copies (each a short strided run) were the forward's largest cost. Here the roles
// turn: six pixels broadcast straight from the padded planes, as the weight gradient
// broadcasts them, by 16 filters of the weight's transpose, packed once a call
// (implicit_forward_pack), 12 sums in registers; each kGemmKc block of the sum written
// into y turned back ([K, P*Q]), onto bias + or y as the GEMM's beta does. Each output
// is the same chain of fused multiply-adds (a · b = b · a) in the same blocks: the bits
// of im2col + gemm on any AVX kernel.

// Whether the implicit forward runs for this float32 problem: the weight gradient's
// shapes (implicit_weight_grad_applies), AVX2 selected and not AVX-512.
bool implicit_forward_applies(const Conv2dShape& s);

// The floats of the packed weight, implicit_forward_pack's `panels`.
std::int64_t implicit_forward_panels(const Conv2dShape& s);
// panels [K/32, C*9, 32] <- the weight [K, C*9] transposed in panels of 32 filters.
void implicit_forward_pack(const float* weight, float* panels, const Conv2dShape& s);

// The scratch one image needs, in floats: its padded planes.
std::int64_t implicit_forward_scratch(const Conv2dShape& s);

// y [K, P*Q] = bias (may be null) + the convolution of one image x [C,H,W] by the
// weight packed by implicit_forward_pack: ASSIGNED. `scratch` holds
// implicit_forward_scratch(s) floats.
void implicit_forward(const float* x, const float* panels, const float* bias, float* y,
                      float* scratch, const Conv2dShape& s);

}  // namespace towerlab::cpu
