// CPU bias add (contracts in kernels/bias.h, the plain reference in
// kernels/reference/bias.h, which the forward runs). Tensors viewed as [N,C,S].
// Every loop splits over the thread pool (kernels/cpu/parallel.h): the forwards over
// the N images, the backwards over the channels, each channel summing its rows in
// order n = 0, 1, ... whichever thread runs it. Every loop serves the four dtypes:
// a 16-bit x, y, grad_y or grad_x is computed on in float32 and rounded once, with
// bias and grad_bias in float32 (kernels/reference/math_type.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/bias.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/per_channel.h"
#include "kernels/cpu/relu.h"
#include "kernels/reference/bias.h"
#include "kernels/reference/math_type.h"

namespace towerlab::cpu {

using reference::math_t;

void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                      std::int64_t C, std::int64_t S) {
  with_any_dtype(x.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    T* out = y.data<T>();         // [N,C,S]
    const T* in = x.data<T>();    // [N,C,S]
    const M* b = bias.data<M>();  // [C]
    parallel_rows(N, C * S, [&](std::int64_t first, std::int64_t last) {
      reference::bias_add_forward(out + first * C * S, in + first * C * S, b, last - first, C, S);
    });
  });
}

// Sums in double whatever the dtype, a row's S values in sum_over's four running
// sums (the reference's one running sum within a rounding), then adds once. With
// S = 1 (a linear layer's [N,C]) a channel's values lie a row apart: the channels
// are then summed sixteen at a time (a cache line of float32), row after row, each
// in its own running sum in order n = 0, 1, ...: the same additions, read along the
// rows instead of down the columns.
void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, std::int64_t N,
                       std::int64_t C, std::int64_t S) {
  with_any_dtype(grad_y.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    const T* gy = grad_y.data<T>();  // [N,C,S]
    M* gb = grad_bias.data<M>();     // [C]
    if (S == 1) {
      constexpr std::int64_t kLanes = 16;
      parallel_rows((C + kLanes - 1) / kLanes, kLanes * N,
                    [&](std::int64_t first, std::int64_t last) {
                      const std::int64_t c0 = first * kLanes, c1 = std::min(C, last * kLanes);
                      std::vector<double> sums(static_cast<std::size_t>(c1 - c0), 0.0);
                      for (std::int64_t n = 0; n < N; ++n) {
                        const T* row = gy + n * C;
                        for (std::int64_t c = c0; c < c1; ++c)
                          sums[c - c0] += static_cast<double>(row[c]);
                      }
                      for (std::int64_t c = c0; c < c1; ++c) {
                        gb[c] = static_cast<M>(static_cast<double>(gb[c]) + sums[c - c0]);
                      }
                    });
      return;
    }
    parallel_rows(C, N * S, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t c = first; c < last; ++c) {
        double sum = 0.0;
        for (std::int64_t n = 0; n < N; ++n) {
          const T* row = gy + (n * C + c) * S;
          sum += sum_over(S, [&](std::int64_t s) { return static_cast<double>(row[s]); });
        }
        gb[c] = static_cast<M>(static_cast<double>(gb[c]) + sum);
      }
    });
  });
}

// y = x + bias[c], rounded, then ReLU's NaN rule (kernels/reference/relu.h), in one
// pass: rounding before the ReLU keeps a 16-bit sum that rounds to -0 a -0, as the
// unfused pair does.
void bias_add_relu_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                           std::int64_t C, std::int64_t S) {
  with_any_dtype(x.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    T* out = y.data<T>();         // [N,C,S]
    const T* in = x.data<T>();    // [N,C,S]
    const M* b = bias.data<M>();  // [C]
    parallel_rows(N, C * S, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t n = first; n < last; ++n) {
        for (std::int64_t c = 0; c < C; ++c) {
          const std::int64_t base = (n * C + c) * S;
          for (std::int64_t s = 0; s < S; ++s) {
            const T v = static_cast<T>(static_cast<M>(in[base + s]) + b[c]);
            out[base + s] = static_cast<M>(v) < M(0) ? T(M(0)) : v;
          }
        }
      }
    });
  });
}

// One pass: each masked gradient value is added to grad_x (when it is wanted) and
// to its channel's sum, which goes into grad_bias once; each channel sums its
// values in order n = 0, 1, ... (then s), as bias_add_backward does.
void bias_add_relu_backward(const Tensor& grad_x, const Tensor& grad_bias, const Tensor& grad_y,
                            const Tensor& y, std::int64_t N, std::int64_t C, std::int64_t S) {
  with_any_dtype(grad_y.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    const T* gy = grad_y.data<T>();                         // [N,C,S]
    const T* out = y.data<T>();                             // [N,C,S]
    T* gx = grad_x.defined() ? grad_x.data<T>() : nullptr;  // [N,C,S]
    M* gb = grad_bias.data<M>();                            // [C]
    // The masked gradient in M; a 16-bit grad_x is added to in float32 and rounded once.
    const auto masked = [&](std::int64_t i) {
      return relu_mask(static_cast<M>(gy[i]), static_cast<M>(out[i]));
    };
    const auto add_to_grad_x = [&](std::int64_t i, M g) {
      gx[i] = static_cast<T>(static_cast<M>(gx[i]) + g);
    };
    if (S == 1) {
      // [N,C], a fully connected layer: a channel's values are C apart, so a thread
      // walks the rows for its block of channels, keeping one sum per channel.
      parallel_rows(C, N, [&](std::int64_t first, std::int64_t last) {
        std::vector<double> sum(static_cast<std::size_t>(last - first), 0.0);
        for (std::int64_t n = 0; n < N; ++n) {
          for (std::int64_t c = first; c < last; ++c) {
            const M g = masked(n * C + c);
            if (gx != nullptr) add_to_grad_x(n * C + c, g);
            sum[static_cast<std::size_t>(c - first)] += static_cast<double>(g);
          }
        }
        for (std::int64_t c = first; c < last; ++c) {
          gb[c] =
              static_cast<M>(static_cast<double>(gb[c]) + sum[static_cast<std::size_t>(c - first)]);
        }
      });
      return;
    }
    parallel_rows(C, N * S, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t c = first; c < last; ++c) {
        double sum = 0.0;
        for (std::int64_t n = 0; n < N; ++n) {
          const std::int64_t base = (n * C + c) * S;
          sum += sum_over(S, [&](std::int64_t s) {
            const M g = masked(base + s);
            if (gx != nullptr) add_to_grad_x(base + s, g);
            return static_cast<double>(g);
          });
        }
        gb[c] = static_cast<M>(static_cast<double>(gb[c]) + sum);
      }
    });
  });
}

}  // namespace towerlab::cpu
