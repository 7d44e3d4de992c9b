// math_t<T>: the type an element-wise op computes in when its tensors hold T.
// float and double compute in themselves; bfloat16 and float16 (engine/half.h)
// are widened exactly to float32, computed on in float32 and rounded once, to
// nearest even, when stored (static_cast<T>(value)). One loop written with
//   const math_t<T> v = static_cast<math_t<T>>(x[i]);  ...  y[i] = static_cast<T>(r);
// serves the four dtypes, and for float and double the casts are no-ops, so their
// bits are those of the loop without them.
#pragma once

#include <type_traits>

#include "engine/half.h"

namespace towerlab::reference {

template <typename T>
inline constexpr bool kIs16Bit = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

template <typename T>
using math_t = std::conditional_t<kIs16Bit<T>, float, T>;

}  // namespace towerlab::reference
