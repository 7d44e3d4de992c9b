// Slice copy's plain reference (contract in kernels/reference/slice_copy.h).
#include "kernels/reference/slice_copy.h"

#include "engine/half.h"
#include "kernels/move_element.h"

namespace towerlab::reference {

template <typename T>
void slice_copy(T* dst, std::int64_t m, std::int64_t dst_begin, const T* src, std::int64_t n,
                std::int64_t src_begin, std::int64_t length, std::int64_t outer, std::int64_t inner,
                GradWrite write) {
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < length; ++i) {
      for (std::int64_t j = 0; j < inner; ++j) {
        move_element(dst[(o * m + dst_begin + i) * inner + j],
                     src[(o * n + src_begin + i) * inner + j], write == GradWrite::Accumulate);
      }
    }
  }
}

#define TL_SLICE_COPY(T)                                                              \
  template void slice_copy<T>(T*, std::int64_t, std::int64_t, const T*, std::int64_t, \
                              std::int64_t, std::int64_t, std::int64_t, std::int64_t, GradWrite)
TL_SLICE_COPY(float);
TL_SLICE_COPY(double);
TL_SLICE_COPY(bfloat16);
TL_SLICE_COPY(float16);
#undef TL_SLICE_COPY

}  // namespace towerlab::reference
