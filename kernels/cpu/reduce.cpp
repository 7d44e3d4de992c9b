// CPU reductions: accumulate in double whatever the dtype, the reference the
// CUDA tree reduction is compared with.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/reduce.h"

namespace towerlab::cpu {

void sum(const Tensor& out, const Tensor& x, double scale) {
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();  // [n]
    double total = 0.0;
    for (std::int64_t i = 0; i < x.numel(); ++i) total += static_cast<double>(in[i]);
    out.data<T>()[0] = static_cast<T>(total * scale);
  });
}

std::int64_t first_nonfinite(const Tensor& x) {
  std::int64_t first = -1;
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();  // [n]
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      if (!std::isfinite(in[i])) {
        first = i;
        return;
      }
    }
  });
  return first;
}

}  // namespace towerlab::cpu
