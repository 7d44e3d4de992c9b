// Bias add's plain reference (contracts in kernels/reference/bias.h).
#include "kernels/reference/bias.h"

namespace towerlab::reference {

template <typename T>
void bias_add_forward(T* y, const T* x, const T* bias, std::int64_t N, std::int64_t C,
                      std::int64_t S) {
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t row = (n * C + c) * S;
      for (std::int64_t s = 0; s < S; ++s) y[row + s] = x[row + s] + bias[c];
    }
  }
}

template <typename T>
void bias_add_backward(T* grad_bias, const T* grad_y, std::int64_t N, std::int64_t C,
                       std::int64_t S) {
  for (std::int64_t c = 0; c < C; ++c) {
    double sum = 0.0;
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t s = 0; s < S; ++s) sum += static_cast<double>(grad_y[(n * C + c) * S + s]);
    }
    grad_bias[c] = static_cast<T>(static_cast<double>(grad_bias[c]) + sum);
  }
}

template void bias_add_forward<float>(float*, const float*, const float*, std::int64_t,
                                      std::int64_t, std::int64_t);
template void bias_add_forward<double>(double*, const double*, const double*, std::int64_t,
                                       std::int64_t, std::int64_t);
template void bias_add_backward<float>(float*, const float*, std::int64_t, std::int64_t,
                                       std::int64_t);
template void bias_add_backward<double>(double*, const double*, std::int64_t, std::int64_t,
                                        std::int64_t);

}  // namespace towerlab::reference
