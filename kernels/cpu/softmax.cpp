// CPU softmax and log-softmax: the plain reference (kernels/reference/softmax.h) on
// each thread's range of rows (kernels/cpu/parallel.h). Rows are independent and
// each is computed whole by one thread, so the result is the single-threaded one
// bit for bit.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cpu/softmax.h"

#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/softmax.h"

namespace towerlab::cpu {

void softmax_forward(const Tensor& y, const Tensor& x, SoftmaxKind kind, SoftmaxMask mask) {
  const std::int64_t cols = x.shape().back();
  const std::int64_t rows = x.numel() / cols;
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [R, D]
    const T* in = x.data<T>();  // [R, D]
    parallel_rows(rows, cols, [&](std::int64_t lo, std::int64_t hi) {
      reference::softmax_forward(out, in, lo, hi, cols, kind, mask);
    });
  });
}

void softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, SoftmaxKind kind,
                      SoftmaxMask mask, GradWrite write) {
  const std::int64_t cols = y.shape().back();
  const std::int64_t rows = y.numel() / cols;
  with_dtype(grad_x.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [R, D]
    const T* gy = grad_y.data<T>();  // [R, D]
    const T* out = y.data<T>();      // [R, D]
    parallel_rows(rows, cols, [&](std::int64_t lo, std::int64_t hi) {
      reference::softmax_backward(gx, gy, out, lo, hi, cols, kind, mask, write);
    });
  });
}

}  // namespace towerlab::cpu
