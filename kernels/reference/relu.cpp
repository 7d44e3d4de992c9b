// ReLU's plain reference (contracts in kernels/reference/relu.h).
#include "kernels/reference/relu.h"

namespace towerlab::reference {

template <typename T>
void relu_forward(T* y, const T* x, std::int64_t n) {
  // "x < 0 ? 0 : x", not "x > 0 ? x : 0": a NaN fails both tests and must come out.
  using M = math_t<T>;
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<M>(x[i]) < M(0) ? T(M(0)) : x[i];
}

template <typename T>
void relu_backward(T* grad_x, const T* grad_y, const T* y, std::int64_t n, GradWrite write) {
  using M = math_t<T>;
  const auto masked = [&](std::int64_t i) {
    return relu_mask(static_cast<M>(grad_y[i]), static_cast<M>(y[i]));
  };
  if (write == GradWrite::Assign) {
    for (std::int64_t i = 0; i < n; ++i) grad_x[i] = static_cast<T>(masked(i));
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      grad_x[i] = static_cast<T>(static_cast<M>(grad_x[i]) + masked(i));
    }
  }
}

#define TL_INSTANTIATE_RELU(T)                               \
  template void relu_forward<T>(T*, const T*, std::int64_t); \
  template void relu_backward<T>(T*, const T*, const T*, std::int64_t, GradWrite);
TL_INSTANTIATE_RELU(float)
TL_INSTANTIATE_RELU(double)
TL_INSTANTIATE_RELU(bfloat16)
TL_INSTANTIATE_RELU(float16)
#undef TL_INSTANTIATE_RELU

}  // namespace towerlab::reference
