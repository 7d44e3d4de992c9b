// CPU ReLU: the plain reference (kernels/reference/relu.h) on each thread's range,
// in each of the four dtypes.
// Elementwise, so the loops split over the thread pool at any boundary
// (kernels/cpu/parallel.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/relu.h"

namespace towerlab::cpu {

void relu_forward(const Tensor& y, const Tensor& x) {
  with_any_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::relu_forward(out + lo, in + lo, hi - lo);
    });
  });
}

void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, GradWrite write) {
  with_any_dtype(grad_x.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [n]
    const T* gy = grad_y.data<T>();  // [n]
    const T* out = y.data<T>();      // [n]
    parallel_rows(grad_x.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::relu_backward(gx + lo, gy + lo, out + lo, hi - lo, write);
    });
  });
}

}  // namespace towerlab::cpu
