// CPU cast: the plain reference (kernels/reference/cast.h) on each thread's range,
// for each of the 16 pairs of dtypes.
#include "kernels/cpu/cast.h"

#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/cast.h"

namespace towerlab::cpu {

void cast(const Tensor& dst, const Tensor& src) {
  with_any_dtype(dst.dtype(), [&]<typename D>() {
    with_any_dtype(src.dtype(), [&]<typename S>() {
      D* out = dst.data<D>();       // [n]
      const S* in = src.data<S>();  // [n]
      parallel_rows(dst.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
        reference::cast(out + lo, in + lo, hi - lo);
      });
    });
  });
}

}  // namespace towerlab::cpu
