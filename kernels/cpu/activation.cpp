// CPU activations: the plain reference (kernels/reference/activation.h) on each
// thread's range in float32 and float64. In bfloat16 and float16 each value is
// still computed in double and rounded once, as the reference does, but on blocks:
// the inputs widened (exactly) by kernels/cpu/convert16.h into double scratch, the
// reference's float64 loop run on the block (the 16-bit loop's arithmetic, in the
// same order), and the results rounded by convert16.h's two vector steps, to odd
// into float32 and from there to 16 bits (engine/half.h's T(double)): the
// reference's bits. Elementwise, so the loops split over the thread pool at any
// boundary (kernels/cpu/parallel.h). The files an op takes, in order: the top of
// kernels/relu.h.
#include "kernels/cpu/activation.h"

#include <cstdint>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/activation.h"
#include "kernels/reference/math_type.h"

namespace towerlab::cpu {
namespace {

using reference::kIs16Bit;

// The block's 16-bit values x widened into double scratch.
template <typename T>
void widen_to_double(double* dst, const T* x, std::int64_t count) {
  float v[kConvertBlock];
  widen_16bit(v, x, count);
  for (std::int64_t i = 0; i < count; ++i) dst[i] = static_cast<double>(v[i]);
}

// y = T(d) for the block's double results: rounded to odd into float32, then to
// 16 bits, the two steps of engine/half.h's T(double).
template <typename T>
void round_from_double(T* y, const double* d, std::int64_t count) {
  float v[kConvertBlock];
  round_to_odd_float(v, d, count);
  round_to_16bit(y, v, count);
}

template <typename T>
void activation_forward_16bit(T* y, const T* x, std::int64_t n, const ActivationOp& act) {
  for_each_block(n, [&](std::int64_t first, std::int64_t count) {
    double v[kConvertBlock];
    widen_to_double(v, x + first, count);
    reference::activation_forward(v, v, count, act);
    round_from_double(y + first, v, count);
  });
}

template <typename T>
void activation_backward_16bit(T* grad_x, const T* grad_y, const T* x, std::int64_t n,
                               const ActivationOp& act, GradWrite write) {
  for_each_block(n, [&](std::int64_t first, std::int64_t count) {
    double gx[kConvertBlock], gy[kConvertBlock], in[kConvertBlock];
    widen_to_double(gy, grad_y + first, count);
    widen_to_double(in, x + first, count);
    if (write == GradWrite::Accumulate) widen_to_double(gx, grad_x + first, count);
    reference::activation_backward(gx, gy, in, count, act, write);
    round_from_double(grad_x + first, gx, count);
  });
}

}  // namespace

void activation_forward(const Tensor& y, const Tensor& x, const ActivationOp& act) {
  with_any_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      if constexpr (kIs16Bit<T>) {
        activation_forward_16bit(out + lo, in + lo, hi - lo, act);
      } else {
        reference::activation_forward(out + lo, in + lo, hi - lo, act);
      }
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
      if constexpr (kIs16Bit<T>) {
        activation_backward_16bit(gx + lo, gy + lo, in + lo, hi - lo, act, write);
      } else {
        reference::activation_backward(gx + lo, gy + lo, in + lo, hi - lo, act, write);
      }
    });
  });
}

}  // namespace towerlab::cpu
