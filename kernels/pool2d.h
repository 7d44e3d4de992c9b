// Max and average 2-D pooling over NCHW tensors, forward and backward.
//
// Dimensions: N batch, C channels, H x W the input plane, KH x KW the window,
// SH, SW the strides, PH, PW the padding on each side (virtual: no values are
// stored for it; see below for what it means to each pooling), and
//   Ho = (H + 2*PH - KH) / SH + 1,   Wo = (W + 2*PW - KW) / SW + 1   (floor)
// x and grad_x are [N,C,H,W]; y and grad_y are [N,C,Ho,Wo]. Output (ho, wo) covers
// input rows ho*SH - PH .. ho*SH - PH + KH - 1 (and columns likewise), clipped to
// the plane. Padding must be at most half the window (PH <= KH/2, PW <= KW/2, as in
// PyTorch), so every window holds at least one real input value.
//
//   max_pool2d_forward(y, x)          y = max of the window's real values
//   max_pool2d_backward(grad_x, grad_y, x)
//                                     grad_x[argmax(window)] += grad_y
//   max_pool2d_forward_with_argmax(y, argmax, x)
//                                     y as max_pool2d_forward, and argmax [N,C,Ho,Wo]
//                                     = h*W + w, the position in its plane of the
//                                     value y took
//   max_pool2d_backward_from_argmax(grad_x, grad_y, argmax, write)
//                                     grad_x[n,c][argmax[n,c,ho,wo]] += grad_y[n,c,ho,wo];
//                                     with GradWrite::Assign grad_x is overwritten
//                                     instead (every element written, zero where no
//                                     output took it; grad_x not read first)
//   avg_pool2d_forward(y, x)          y = sum of the window's real values / their count
//   avg_pool2d_backward(grad_x, grad_y)
//                                     grad_x[each real value] += grad_y / count
//
// Max pooling: padding never wins (it is -infinity, not zero). Ties go to the
// FIRST maximum in row-major window order (lowest row, then lowest column), and
// only it receives the gradient; a NaN in the window wins (the first NaN), so NaN
// propagates. max_pool2d_backward recomputes each window's argmax from x; the
// pair with_argmax / from_argmax (what training uses) records it in the forward,
// so that the backward never reads x or compares values (on the CPU a scatter; on
// CUDA the same no-atomics gather as max_pool2d_backward, reading the argmax). Both
// pairs give the same y (a NaN either way) and the same grad_x, bit for bit on each
// device: the same argmax, and each grad_x value the same sum in the same (ho, wo)
// order.
// argmax holds integral values in a floating-point dtype (towerlab tensors are
// floating point, as class labels are): x's dtype for float32 and float64 x, and
// float32 for bfloat16 and float16 x (pool2d_argmax_dtype), since bfloat16 holds
// integers exactly only up to 256 and float16 up to 2048. Exact up to 2^24 in
// float32, so planes of more than 2^24 values are refused. An argmax of another
// dtype is a ShapeError naming the op and both dtypes.
//
// Average pooling divides by the number of REAL values in the window: padding is
// not counted, as in TensorFlow's 'SAME' pooling (PyTorch's count_include_pad=False).
// Without padding (the FashionNet case, 2x2 stride 2) both conventions agree.
//
// y is assigned; gradients are accumulated (+=) into grad_x unless a GradWrite
// says Assign (kernels/grad_write.h). No output may alias an input. Every tensor
// lives on the stream's device, and x, y, grad_y and grad_x have one dtype:
// float32, bfloat16 or float16 on every device, float64 on the CPU (gradient
// checks); mixing them is a ShapeError naming the op and the tensors.
//
// 16 bits (bfloat16, float16): the values are widened exactly to float32 and every
// value stored is rounded once, to nearest even (kernels/reference/math_type.h).
// Max pooling compares in float32 and copies the winner: y is exact (a NaN's
// payload too). An average sums its window in float32 from +0 in row-major window
// order, divides by the count and rounds once. A backward sums each grad_x
// element's terms in float32 from +0 (the outputs that took it, or whose window
// covers it, in row-major (ho, wo) order), adds the sum to the widened grad_x
// and rounds once; with Assign it rounds the sum. On every device these are the
// bits of the reference (kernels/reference/pool2d.h), whose 16-bit sums are in
// that order: 16-bit results are compared bit for bit, not within a tolerance.
// (The float32 paths sum in other orders on the CPU and on CUDA: within 1e-5.)
// The CPU runs the reference for 16-bit tensors, on each thread's range of planes;
// CUDA runs its general kernels (the 2x2 stride-2 kernels are float32's). The batch
// norm with a fused max pool (kernels/batchnorm.h) stays float32.
#pragma once

#include <cstdint>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

struct Pool2dParams {
  std::int64_t kernel_h = 2, kernel_w = 2;
  std::int64_t stride_h = 2, stride_w = 2;
  std::int64_t pad_h = 0, pad_w = 0;

  // A square window with equal strides and padding in both directions.
  static Pool2dParams square(std::int64_t kernel, std::int64_t stride, std::int64_t pad = 0) {
    return {kernel, kernel, stride, stride, pad, pad};
  }
};

// The shape of y for x of shape [N,C,H,W]; throws ShapeError for a bad x or window
// (InvalidArgument for a bad window), the message naming `op`.
Shape pool2d_output_shape(const Shape& x, const Pool2dParams& params, const char* op = "pool2d");

// The dtype of max pooling's argmax for x of dtype `x`: x's own for float32 and
// float64, float32 for bfloat16 and float16.
DType pool2d_argmax_dtype(DType x);

void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream);
void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const Pool2dParams& params, const Stream& stream);
void max_pool2d_forward_with_argmax(const Tensor& y, const Tensor& argmax, const Tensor& x,
                                    const Pool2dParams& params, const Stream& stream);
void max_pool2d_backward_from_argmax(const Tensor& grad_x, const Tensor& grad_y,
                                     const Tensor& argmax, const Pool2dParams& params,
                                     const Stream& stream, GradWrite write = GradWrite::Accumulate);
void avg_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream);
void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Pool2dParams& params,
                         const Stream& stream);

}  // namespace towerlab
