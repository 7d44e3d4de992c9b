// CPU activations: the plain reference (kernels/reference/activation.h) on each
// thread's range, in each of the four dtypes. Elementwise, so the loops split over the thread pool
// at any boundary (kernels/cpu/parallel.h). The files an op takes, in order: the top of
// kernels/relu.h.
#include "kernels/cpu/activation.h"

#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/activation.h"

namespace towerlab::cpu {

void activation_forward(const Tensor& y, const Tensor& x, const ActivationOp& act) {
  with_any_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::activation_forward(out + lo, in + lo, hi - lo, act);
    });
  });
}

void activation_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const ActivationOp& act, GradWrite write) {
  with_any_dtype(grad_x.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [n]
    const T* gy = grad_y.data<T>();  // [n]
    const T* in = x.data<T>();       // [n]
    parallel_rows(grad_x.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::activation_backward(gx + lo, gy + lo, in + lo, hi - lo, act, write);
    });
  });
}

}  // namespace towerlab::cpu
