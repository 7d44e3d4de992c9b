// The plain reference of slice copy (contract in kernels/slice_copy.h): three loops
// over the block, each element found from its index. The CPU's memcpy runs and the
// CUDA kernel are tested against it. T is float, double, bfloat16 or float16.
#pragma once

#include <cstdint>

#include "kernels/grad_write.h"

namespace towerlab::reference {

// dst [outer, m, inner], src [outer, n, inner]:
//   dst[o, dst_begin + i, j] = (or +=) src[o, src_begin + i, j], i < length.
template <typename T>
void slice_copy(T* dst, std::int64_t m, std::int64_t dst_begin, const T* src, std::int64_t n,
                std::int64_t src_begin, std::int64_t length, std::int64_t outer, std::int64_t inner,
                GradWrite write);

}  // namespace towerlab::reference
