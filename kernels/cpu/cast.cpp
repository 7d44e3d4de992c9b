// CPU cast: the plain reference (kernels/reference/cast.h) on each thread's range,
// for each of the 16 pairs of dtypes.
#include "kernels/cpu/cast.h"

#include <cstdint>

#include "engine/error.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/cast.h"

namespace towerlab::cpu {

namespace {

// fn.template operator()<T>() with T the C++ type of `dtype`: all four dtypes,
// where kernels/cpu/dtype_dispatch.h has the two that ops compute in.
template <typename Fn>
void with_any_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32:
      fn.template operator()<float>();
      return;
    case DType::Float64:
      fn.template operator()<double>();
      return;
    case DType::BFloat16:
      fn.template operator()<bfloat16>();
      return;
    case DType::Float16:
      fn.template operator()<float16>();
      return;
  }
  TL_THROW(InvalidArgument, "cast: unknown dtype " << static_cast<int>(dtype));
}

}  // namespace

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
