// CPU residual add + ReLU: the plain reference (kernels/reference/add_relu.h) on each
// thread's range. Elementwise, so the loops split over the thread pool at any
// boundary (kernels/cpu/parallel.h); the fusion saves a pass over memory each way and
// the backward's gradient of the sum, not arithmetic.
#include "kernels/cpu/add_relu.h"

#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/add_relu.h"

namespace towerlab::cpu {

void add_relu_forward(const Tensor& y, const Tensor& a, const Tensor& b) {
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();        // [n]
    const T* lhs = a.data<T>();  // [n]
    const T* rhs = b.data<T>();  // [n]
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::add_relu_forward(out + lo, lhs + lo, rhs + lo, hi - lo);
    });
  });
}

void add_relu_backward(const AddReluBackward& args) {
  with_dtype(args.grad_y.dtype(), [&]<typename T>() {
    T* ga = args.grad_a.defined() ? args.grad_a.data<T>() : nullptr;  // [n] or none
    T* gb = args.grad_b.defined() ? args.grad_b.data<T>() : nullptr;  // [n] or none
    const T* gy = args.grad_y.data<T>();                              // [n]
    const T* out = args.y.data<T>();                                  // [n]
    parallel_rows(args.grad_y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::add_relu_backward(ga ? ga + lo : nullptr, args.grad_a_write,
                                   gb ? gb + lo : nullptr, args.grad_b_write, gy + lo, out + lo,
                                   hi - lo);
    });
  });
}

}  // namespace towerlab::cpu
