// 2-D convolution over NCHW images: forward, and the backward for the input, the
// weight and the bias. As in every deep-learning framework this is a
// cross-correlation (the kernel is not flipped).
//
// Dimension letters, used in every shape comment of the conv2d files:
//   N images, C input channels, H x W input size, K output channels (filters),
//   R x S kernel size, P x Q output size.
// Shapes: x [N,C,H,W], weight [K,C/G,R,S], bias [K], y [N,K,P,Q], where
//   P = (H + 2*pad_h - dilation_h*(R-1) - 1) / stride_h + 1   (and Q likewise with W, S)
// and G = params.groups (1 unless set) divides both C and K.
// Write h(p,r) = p*stride_h - pad_h + r*dilation_h and w(q,s) = q*stride_w - pad_w + s*dilation_w;
// x is zero outside [0,H) x [0,W) (zero padding). The formulas below are those of
// G = 1; with G groups each output channel k sees only the C/G input channels of its
// group g = k / (K/G) (channels g*C/G .. (g+1)*C/G - 1), c in the formulas runs over
// those and weight[k,c,r,s] is indexed by c - g*C/G (kernels/reference/conv2d.h states
// it in full). Depthwise is G = C, each input channel convolved with its own K/C
// filters (the channel multiplier; output channel k reads input channel k / (K/C)).
//
//   conv2d_forward(y, x, weight, bias)          ASSIGNS y:
//     y[n,k,p,q] = bias[k] + sum_{c,r,s} weight[k,c,r,s] * x[n,c,h(p,r),w(q,s)]
//     (bias may be an undefined Tensor: no bias term)
//   conv2d_backward(grad_x, grad_weight, grad_bias, grad_y, x, weight)   ACCUMULATES:
//     grad_x[n,c,h,w]      += sum_{k,r,s,p,q : h(p,r)=h, w(q,s)=w}
//                               grad_y[n,k,p,q] * weight[k,c,r,s]
//     grad_weight[k,c,r,s] += sum_{n,p,q} grad_y[n,k,p,q] * x[n,c,h(p,r),w(q,s)]
//     grad_bias[k]         += sum_{n,p,q} grad_y[n,k,p,q]
//   Each gradient is optional: an undefined Tensor means "not needed" and is not
//   computed. x is needed only for grad_weight and weight only for grad_x; pass
//   them anyway (their shapes define the problem). With grad_x_write =
//   GradWrite::Assign, grad_x is assigned instead (=, never read; a pixel that no
//   tap reaches gets 0): the values of accumulating into zeros, bit for bit.
// No output may alias an input. float32 on every device, float64 on the CPU too.
// Mixed precision, on every device: x and weight (forward), or grad_y, x and weight
// (backward), all bfloat16 or all float16, with bias and the gradients float32, and y
// float32 or of the operands' dtype: the float32 y rounded once, to nearest even, the
// bias added before the rounding (a 16-bit layer's activation; on the CPU with G = 1
// the rounding is in the forward's stores, with no float32 copy of y, but for a
// float16 y of Winograd F(4x4,3x3), rounded from float32 sums in one pass; elsewhere
// one cast of the float32 y).
// The definition, and the reference the tests compare with, is reference::conv2d_*
// in double on the widened (exact) values. On CUDA with G = 1 the forward, input
// gradient and weight gradient are implicit GEMMs on the tensor cores
// (kernels/cuda/conv2d_tc.cuh: mma.sync m16n8k16, the 16-bit values gathered
// straight from x, weight and grad_y, products exact and summed in float32 in
// reduction order, the weight gradient's splits added in a fixed tree); grad_bias
// sums grad_y widened to float32. Their tolerance (and Tf32's, below), element by
// element, with n the pass's reduction length (C*R*S forward, K*R*S input
// gradient, N*P*Q weight gradient) and S the sum of the magnitudes of its terms
// (|bias| included):
//   |result - reference| <= 2 (n + 2) 2^-24 (S + |the value accumulated onto|)
// (tests/conv2d_tc_test.cpp). On the CPU with G = 1, bfloat16 operands, where the
// bfloat16 GEMM runs vdpbf16ps (engine/settings.h: set_bf16_gemm_kernel), the three
// passes lower to that GEMM with bfloat16 patches (im2col, kernels/cpu/conv2d_bf16.cpp),
// or at stride 1 read the same products from padded planes under Auto
// (kernels/cpu/conv2d_planes_bf16.h): products exact, summed in float32 (a pair of k
// at a time), within the same tolerance (tests/conv2d_bf16_cpu_test.cpp,
// tests/conv2d_planes_bf16_test.cpp): every such layer under Auto and a
// forced Im2col, none under a forced Winograd (kernels/cpu/conv2d.h). Everywhere else
// (the CPU otherwise, and G > 1 on CUDA) the 16-bit operands are widened exactly into
// float32 scratch on the stream
// (kernels/cast.h) and the float32 algorithms below run on them, to their tolerance (a few float32
// roundings of sum |weight*x|, relative; F(4x4,3x3) some tens): correct, no faster
// than float32. conv2d_multiplies_16bit says which a call takes. Mixing a 16-bit
// operand with a float32 one, or a 16-bit y of another dtype, throws NotSupported.
// TF32. Each call takes a Float32Math (kernels/matmul.h), as matmul does: Ieee (the
// default) is the float32 paths below, their bits unchanged. Tf32 lets float32
// x, weight and grad_y multiply on the TF32 tensor cores on CUDA with G = 1: the
// same implicit GEMMs as the 16-bit operands' (kernels/cuda/conv2d_tc.cuh, with
// mma.sync m16n8k8), each value rounded to TF32 as it is gathered (to nearest, ties
// away from zero, 10 mantissa bits: cvt.rna.tf32.f32, reference::round_tf32; the
// tensors unchanged), the products (11 x 11 significant bits: exact) summed in
// float32 in reduction order, the weight gradient's splits added in the same fixed
// tree; grad_bias sums grad_y in float32. The definition is reference::conv2d_* in
// double on the operands rounded by reference::round_tf32, and the tolerance the
// 16-bit one's above, S of the rounded values (checked on the emulated GPUs, whose
// mma adds k by k; on a real GPU's mma, to be confirmed as for matmul). On the CPU
// (no TF32 arithmetic), for G > 1 (grouped and depthwise layers stay float32) and
// for float64, Tf32 gives Ieee's results; 16-bit operands ignore it.
// Results are deterministic (no atomics): on CUDA always, on the CPU for a given
// thread count (engine/thread_pool.h), which sets how the batch sums are split.
// Algorithms: the CPU computes the float32 forward, input gradient and weight gradient
// of 3x3 layers with stride 1, dilation 1, padding 0 or 1 and at least 16 input and
// output channels with Winograd (F(4x4,3x3) from 32 channels each side, F(2x2,3x3)
// below, the weight gradient F(3x3,2x2); kernels/cpu/winograd.h), the weight gradient of other 3x3
// layers of stride 1 or 2 (padding 0 or 1, a multiple of 32 output channels) on AVX2 and AVX-512
// with an implicit GEMM (im2col's bits), on AVX2 their forward too, one input channel directly,
// everything else with im2col + GEMM; CUDA with implicit GEMMs, and the forward
// and input gradient of 3x3 stride-1 layers with at least 64 input and output channels with
// Winograd F(4x4,3x3) (kernels/cuda/conv2d_winograd.h; Conv2dAlgorithm forces or forbids it). The
// algorithms round differently (within a few float32 roundings of sum |weight*x|, F(4x4,3x3) within
// some tens), so the CPU specification is met within a tolerance: comparisons of CUDA with the CPU,
// or of the two CPU algorithms, never expect equal bits. An empty batch (N = 0) or K = 0 is a
// no-op. Bad shapes, a kernel larger than the padded input and non-positive strides throw
// ShapeError / InvalidArgument; so do C or K not divisible by G (ShapeError, naming
// both shapes) and G < 1 (InvalidArgument).
// Groups: G = 1 takes the paths above unchanged. Depthwise (G = C > 1) is
// memory-bound, a GEMM per channel would be a waste: a direct kernel on each backend
// (kernels/conv2d_depthwise.h, on the CPU's threads and as CUDA kernels; float32, and
// float64 on the CPU) gathers every output, input gradient and weight gradient from
// its taps, so no value is written twice and nothing needs atomics. Any other G runs
// group by group through the G = 1 paths: x's and grad_y's channel slices are copied
// (kernels/slice_copy.h) into scratch, the weight's rows [g*K/G, (g+1)*K/G) are a
// view, and y's and grad_x's slices are copied (or added) back.
#pragma once

#include <cstdint>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"
#include "matmul.h"  // Float32Math

namespace towerlab {

struct Conv2dParams {
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  std::int64_t dilation_h = 1, dilation_w = 1;
  std::int64_t groups = 1;  // G: channels in G independent groups (see above)
};

// [N,K,P,Q] for input [N,C,H,W] and weight [K,C/G,R,S]; throws as conv2d_forward
// does when the shapes or parameters cannot work.
Shape conv2d_output_shape(const Shape& input, const Shape& weight, const Conv2dParams& params);

// Whether conv2d on `stream` multiplies 16-bit operands of `dtype` (x of shape
// `input`, weight of shape `weight`) as they are: CUDA's tensor cores with G = 1, the
// CPU's bfloat16 GEMM path where it runs (above). Otherwise they are widened to
// float32 first, and a caller holding float32 copies may pass those instead.
bool conv2d_multiplies_16bit(const Shape& input, const Shape& weight, DType dtype,
                             const Conv2dParams& params, const Stream& stream);

void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dParams& params, const Stream& stream,
                    Float32Math math = Float32Math::Ieee);
void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dParams& params, const Stream& stream,
                     GradWrite grad_x_write = GradWrite::Accumulate,
                     Float32Math math = Float32Math::Ieee);

}  // namespace towerlab
