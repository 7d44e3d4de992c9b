// Cast: values converted from one dtype to another.
//   cast(dst, src)            dst[i] = round(src[i])      same element count, any shapes
//   cast(src, dtype) -> dst   a new tensor of src's shape in `dtype`
// The dtypes are float32, bfloat16 and float16 on every device, and float64 on the
// CPU. Rounding is engine/half.h's: to nearest, ties to even, once (float64 to a
// 16-bit type does not round through float32 twice); a NaN stays a NaN of its sign,
// infinities stay, a finite value past the target's range becomes an infinity
// (float16: |x| >= 65520), float16 subnormals are exact. Widening (16-bit to
// float32 or float64, float32 to float64) is exact. The same dtype is a copy.
// dst must not overlap src unless they are the same tensor of one dtype. Both are
// on the stream's device; Tensor::to(dtype) does the same on the CPU, and
// copy_tensor moves a 16-bit tensor between devices.
//
//   round_through(src, through) -> dst   float32 dst[i] = float32(round(src[i]))
// A float32 tensor's values rounded once to the 16-bit `through` (bfloat16 or
// float16) and held in float32: the bits of cast(cast(src, through), float32), in
// one pass with no 16-bit copy. The CPU's 16-bit GEMM-class ops that widen their
// operands into float32 scratch (kernels/conv2d.h) take an output gradient rounded
// so (autograd/nn.cpp). On CUDA it is those two casts.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

void cast(const Tensor& dst, const Tensor& src, const Stream& stream);
Tensor cast(const Tensor& src, DType dtype, const Stream& stream);
Tensor round_through(const Tensor& src, DType through, const Stream& stream);

}  // namespace towerlab
