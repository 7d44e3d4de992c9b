// CPU dropout: the plain reference (kernels/reference/dropout.h) on each thread's
// range of elements; an element's mask depends on its global index alone, so the
// split changes nothing.
#include "kernels/cpu/dropout.h"

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/dropout.h"

namespace towerlab::cpu {

void dropout_forward(const Tensor& y, const Tensor& x, double p, std::uint64_t seed,
                     std::uint64_t subsequence, std::uint64_t first_element) {
  with_dtype(x.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    parallel_rows(x.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::dropout_forward(out + lo, in + lo, p, seed, subsequence,
                                 first_element + static_cast<std::uint64_t>(lo), hi - lo);
    });
  });
}

void dropout_backward(const Tensor& grad_x, const Tensor& grad_y, double p, std::uint64_t seed,
                      std::uint64_t subsequence, std::uint64_t first_element, GradWrite write) {
  with_dtype(grad_y.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [n]
    const T* gy = grad_y.data<T>();  // [n]
    parallel_rows(grad_y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::dropout_backward(gx + lo, gy + lo, p, seed, subsequence,
                                  first_element + static_cast<std::uint64_t>(lo), hi - lo, write);
    });
  });
}

}  // namespace towerlab::cpu
