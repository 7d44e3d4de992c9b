// with_dtype(dtype, fn): calls fn.template operator()<T>() with T the C++ type of
// `dtype`, so one templated loop serves float32 and float64 (the gradient checks);
// with_any_dtype also bfloat16 and float16.
#pragma once

#include "engine/error.h"
#include "engine/tensor.h"

namespace towerlab::cpu {

// The 16-bit dtypes are not computed in: their ops' checks
// (kernels/checks.h) reject them first, and this throws rather than reading them
// as float32 if a path ever skips the checks.
template <typename Fn>
void with_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float64:
      fn.template operator()<double>();
      return;
    case DType::Float32:
      fn.template operator()<float>();
      return;
    case DType::BFloat16:
    case DType::Float16:
      break;
  }
  TL_THROW(NotSupported,
           "cpu kernel: " << dtype_name(dtype) << " is not supported (float32, float64)");
}

// with_dtype for the ops that move values without computing in them (cast,
// permute, slice copy) and for those that compute on 16-bit values in float32
// (kernels/reference/math_type.h: ReLU, bias add, the activations): all four
// dtypes, bfloat16 and float16 as engine/half.h's types.
template <typename Fn>
void with_any_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::BFloat16:
      fn.template operator()<bfloat16>();
      return;
    case DType::Float16:
      fn.template operator()<float16>();
      return;
    default:
      with_dtype(dtype, fn);
  }
}

}  // namespace towerlab::cpu
