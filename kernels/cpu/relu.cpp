// CPU ReLU: the specification for kernels/cuda/relu.cu. Elementwise, so the loops
// split over the thread pool at any boundary (kernels/cpu/parallel.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/relu.h"

namespace towerlab::cpu {

void relu_forward(const Tensor& y, const Tensor& x) {
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      // "x < 0 ? 0 : x", not "x > 0 ? x : 0": a NaN fails both tests and must come out.
      for (std::int64_t i = lo; i < hi; ++i) out[i] = in[i] < T(0) ? T(0) : in[i];
    });
  });
}

void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, GradWrite write) {
  with_dtype(grad_x.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [n]
    const T* gy = grad_y.data<T>();  // [n]
    const T* out = y.data<T>();      // [n]
    const bool assign = write == GradWrite::Assign;
    parallel_rows(grad_x.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      if (assign) {
        for (std::int64_t i = lo; i < hi; ++i) gx[i] = relu_mask(gy[i], out[i]);
      } else {
        for (std::int64_t i = lo; i < hi; ++i) gx[i] += relu_mask(gy[i], out[i]);
      }
    });
  });
}

}  // namespace towerlab::cpu
