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
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

void cast(const Tensor& dst, const Tensor& src, const Stream& stream);
Tensor cast(const Tensor& src, DType dtype, const Stream& stream);

}  // namespace towerlab
