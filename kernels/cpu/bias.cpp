// CPU bias add: the specification for kernels/cuda/bias.cu. Tensors viewed as [N,C,S].
#include <cstdint>
#include <vector>

#include "kernels/bias.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/per_channel.h"

namespace towerlab::cpu {

void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                      std::int64_t C, std::int64_t S) {
  with_dtype(x.dtype(), [&]<typename T>() {
    T* out = y.data<T>();         // [N,C,S]
    const T* in = x.data<T>();    // [N,C,S]
    const T* b = bias.data<T>();  // [C]
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t base = (n * C + c) * S;
        for (std::int64_t s = 0; s < S; ++s) out[base + s] = in[base + s] + b[c];
      }
    }
  });
}

// Sums in double whatever the dtype, then adds once into grad_bias.
void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, std::int64_t N,
                       std::int64_t C, std::int64_t S) {
  with_dtype(grad_y.dtype(), [&]<typename T>() {
    const T* gy = grad_y.data<T>();   // [N,C,S]
    T* gb = grad_bias.data<T>();      // [C]
    std::vector<double> sum(C, 0.0);  // [C]
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t c = 0; c < C; ++c) {
        const T* row = gy + (n * C + c) * S;
        sum[c] += sum_over(S, [&](std::int64_t s) { return static_cast<double>(row[s]); });
      }
    }
    for (std::int64_t c = 0; c < C; ++c)
      gb[c] = static_cast<T>(static_cast<double>(gb[c]) + sum[c]);
  });
}

}  // namespace towerlab::cpu
