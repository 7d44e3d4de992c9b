// ReLU's plain reference (contracts in kernels/reference/relu.h).
#include "kernels/reference/relu.h"

namespace towerlab::reference {

template <typename T>
void relu_forward(T* y, const T* x, std::int64_t n) {
  // "x < 0 ? 0 : x", not "x > 0 ? x : 0": a NaN fails both tests and must come out.
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
}

template <typename T>
void relu_backward(T* grad_x, const T* grad_y, const T* y, std::int64_t n, GradWrite write) {
  if (write == GradWrite::Assign) {
    for (std::int64_t i = 0; i < n; ++i) grad_x[i] = relu_mask(grad_y[i], y[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) grad_x[i] += relu_mask(grad_y[i], y[i]);
  }
}

template void relu_forward<float>(float*, const float*, std::int64_t);
template void relu_forward<double>(double*, const double*, std::int64_t);
template void relu_backward<float>(float*, const float*, const float*, std::int64_t, GradWrite);
template void relu_backward<double>(double*, const double*, const double*, std::int64_t, GradWrite);

}  // namespace towerlab::reference
