// Bias add's plain reference (contracts in kernels/reference/bias.h).
#include "kernels/reference/bias.h"

namespace towerlab::reference {

template <typename T>
void bias_add_forward(T* y, const T* x, const math_t<T>* bias, std::int64_t N, std::int64_t C,
                      std::int64_t S) {
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t row = (n * C + c) * S;
      for (std::int64_t s = 0; s < S; ++s) {
        y[row + s] = static_cast<T>(static_cast<math_t<T>>(x[row + s]) + bias[c]);
      }
    }
  }
}

template <typename T>
void bias_add_backward(math_t<T>* grad_bias, const T* grad_y, std::int64_t N, std::int64_t C,
                       std::int64_t S) {
  for (std::int64_t c = 0; c < C; ++c) {
    double sum = 0.0;
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t s = 0; s < S; ++s) sum += static_cast<double>(grad_y[(n * C + c) * S + s]);
    }
    grad_bias[c] = static_cast<math_t<T>>(static_cast<double>(grad_bias[c]) + sum);
  }
}

#define TL_INSTANTIATE_BIAS(T)                                                                  \
  template void bias_add_forward<T>(T*, const T*, const math_t<T>*, std::int64_t, std::int64_t, \
                                    std::int64_t);                                              \
  template void bias_add_backward<T>(math_t<T>*, const T*, std::int64_t, std::int64_t,          \
                                     std::int64_t);
TL_INSTANTIATE_BIAS(float)
TL_INSTANTIATE_BIAS(double)
TL_INSTANTIATE_BIAS(bfloat16)
TL_INSTANTIATE_BIAS(float16)
#undef TL_INSTANTIATE_BIAS

}  // namespace towerlab::reference
