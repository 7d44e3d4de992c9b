// The cast's plain reference (contracts in kernels/reference/cast.h).
#include "kernels/reference/cast.h"

namespace towerlab::reference {

template <typename D, typename S>
void cast(D* dst, const S* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = cast_value<D>(src[i]);
}

#define TL_INSTANTIATE_CAST_FROM(S)                                   \
  template void cast<float, S>(float*, const S*, std::int64_t);       \
  template void cast<double, S>(double*, const S*, std::int64_t);     \
  template void cast<bfloat16, S>(bfloat16*, const S*, std::int64_t); \
  template void cast<float16, S>(float16*, const S*, std::int64_t);
TL_INSTANTIATE_CAST_FROM(float)
TL_INSTANTIATE_CAST_FROM(double)
TL_INSTANTIATE_CAST_FROM(bfloat16)
TL_INSTANTIATE_CAST_FROM(float16)
#undef TL_INSTANTIATE_CAST_FROM

}  // namespace towerlab::reference
