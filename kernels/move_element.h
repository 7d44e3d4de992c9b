// How the families that move values (permute, slice copy) write one element, in
// the reference, the CPU backend and the CUDA kernels alike: assigned, or added to
// what is there. float and double add in their own type; bfloat16 and float16 add
// in float32 and round once (engine/half.h), as a cast of the sum would. Host and
// device code; internal: not installed.
#pragma once

#include <type_traits>

#include "../engine/half.h"

namespace towerlab {

// out = value, or out + value (out is read only then).
template <typename T>
TL_HOST_DEVICE inline void move_element(T& out, T value, bool accumulate) {
  if (!accumulate) {
    out = value;
  } else if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
    out = T(static_cast<float>(out) + static_cast<float>(value));
  } else {
    out = out + value;
  }
}

}  // namespace towerlab
