// with_dtype(dtype, fn): calls fn.template operator()<T>() with T the C++ type of
// `dtype`, so one templated loop serves float32 and float64 (the gradient checks).
#pragma once

#include "engine/tensor.h"

namespace towerlab::cpu {

template <typename Fn>
void with_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::Float64) {
    fn.template operator()<double>();
  } else {
    fn.template operator()<float>();
  }
}

}  // namespace towerlab::cpu
