// with_gpu_dtype(op, t, fn): calls fn.template operator()<T>() with T the C++ type
// of a dtype a GPU holds (float32, bfloat16, float16: engine/half.h's types), so one
// templated kernel serves the three (cast, permute, slice copy). float64 exists on
// the CPU only: NotSupported naming the op and the tensor.
#pragma once

#include "engine/error.h"
#include "engine/half.h"
#include "engine/tensor.h"

namespace towerlab::cuda {

template <typename Fn>
void with_gpu_dtype(const char* op, const Tensor& t, Fn&& fn) {
  switch (t.dtype()) {
    case DType::Float32:
      fn.template operator()<float>();
      return;
    case DType::BFloat16:
      fn.template operator()<bfloat16>();
      return;
    case DType::Float16:
      fn.template operator()<float16>();
      return;
    case DType::Float64:
      break;
  }
  TL_THROW(NotSupported, op << ": " << t.describe() << ": float64 exists on the CPU only");
}

}  // namespace towerlab::cuda
