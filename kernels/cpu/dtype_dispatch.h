// with_dtype(dtype, fn): calls fn.template operator()<T>() with T the C++ type of
// `dtype`, so one templated loop serves float32 and float64 (the gradient checks).
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

}  // namespace towerlab::cpu
