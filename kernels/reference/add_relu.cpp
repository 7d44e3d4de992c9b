// The fused residual add + ReLU's plain reference (contracts in
// kernels/reference/add_relu.h).
#include "kernels/reference/add_relu.h"

#include "kernels/reference/relu.h"

namespace towerlab::reference {

template <typename T>
void add_relu_forward(T* y, const T* a, const T* b, std::int64_t n) {
  using M = math_t<T>;
  for (std::int64_t i = 0; i < n; ++i) {
    const M sum = static_cast<M>(a[i]) + static_cast<M>(b[i]);
    // ReLU's reference: a NaN fails the test and stays.
    y[i] = static_cast<T>(sum < M(0) ? M(0) : sum);
  }
}

namespace {

template <typename T>
void write(T* grad, GradWrite write, math_t<T> g) {
  *grad = static_cast<T>(write == GradWrite::Assign ? g : static_cast<math_t<T>>(*grad) + g);
}

}  // namespace

template <typename T>
void add_relu_backward(T* grad_a, GradWrite grad_a_write, T* grad_b, GradWrite grad_b_write,
                       const T* grad_y, const T* y, std::int64_t n) {
  using M = math_t<T>;
  for (std::int64_t i = 0; i < n; ++i) {
    const M g = relu_mask(static_cast<M>(grad_y[i]), static_cast<M>(y[i]));
    if (grad_a != nullptr) write(grad_a + i, grad_a_write, g);
    if (grad_b != nullptr) write(grad_b + i, grad_b_write, g);
  }
}

#define TL_ADD_RELU(T)                                                                 \
  template void add_relu_forward<T>(T*, const T*, const T*, std::int64_t);             \
  template void add_relu_backward<T>(T*, GradWrite, T*, GradWrite, const T*, const T*, \
                                     std::int64_t);
TL_ADD_RELU(float)
TL_ADD_RELU(double)
TL_ADD_RELU(bfloat16)
TL_ADD_RELU(float16)
#undef TL_ADD_RELU

}  // namespace towerlab::reference
