// CPU ReLU: the plain reference (kernels/reference/relu.h) on each thread's range
// in float32 and float64. In bfloat16 and float16 the forward is a copy or a +0,
// so it runs on the 16-bit patterns with no conversion; the backward widens blocks
// of its operands to float32 (kernels/cpu/convert16.h), masks and adds there, and
// rounds once: the reference's bits in every case.
// Elementwise, so the loops split over the thread pool at any boundary
// (kernels/cpu/parallel.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/relu.h"

namespace towerlab::cpu {
namespace {

using reference::kIs16Bit;

// grad_x = round(grad_x + mask) or round(mask), mask = relu_mask(grad_y, y) in float32.
template <typename T>
void relu_backward_16bit(T* grad_x, const T* grad_y, const T* y, std::int64_t n, GradWrite write) {
  for_each_block(n, [&](std::int64_t first, std::int64_t count) {
    float gy[kConvertBlock], out[kConvertBlock], gx[kConvertBlock];
    widen_16bit(gy, grad_y + first, count);
    widen_16bit(out, y + first, count);
    if (write == GradWrite::Assign) {
      for (std::int64_t i = 0; i < count; ++i) gx[i] = relu_mask(gy[i], out[i]);
    } else {
      widen_16bit(gx, grad_x + first, count);
      for (std::int64_t i = 0; i < count; ++i) gx[i] += relu_mask(gy[i], out[i]);
    }
    round_to_16bit(grad_x + first, gx, count);
  });
}

}  // namespace

void relu_forward(const Tensor& y, const Tensor& x) {
  with_any_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      if constexpr (kIs16Bit<T>) {
        relu_forward_16bit(out + lo, in + lo, hi - lo);
      } else {
        reference::relu_forward(out + lo, in + lo, hi - lo);
      }
    });
  });
}

void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, GradWrite write) {
  with_any_dtype(grad_x.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [n]
    const T* gy = grad_y.data<T>();  // [n]
    const T* out = y.data<T>();      // [n]
    parallel_rows(grad_x.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      if constexpr (kIs16Bit<T>) {
        relu_backward_16bit(gx + lo, gy + lo, out + lo, hi - lo, write);
      } else {
        reference::relu_backward(gx + lo, gy + lo, out + lo, hi - lo, write);
      }
    });
  });
}

}  // namespace towerlab::cpu
