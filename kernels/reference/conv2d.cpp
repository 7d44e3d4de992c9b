// conv2d's plain reference (contracts in kernels/reference/conv2d.h): the forward
// gathers each output from its taps, the backward walks the same loops and
// scatters each output's gradient back to the taps it read.
#include "kernels/reference/conv2d.h"

#include <cstdint>

namespace towerlab::reference {

namespace {

// The problem's sizes, read once from the shapes.
struct Sizes {
  std::int64_t N, C, H, W, K, R, S, P, Q;
};

Sizes sizes_of(const Shape& x_shape, const Shape& weight_shape, const Conv2dParams& params) {
  const Shape y_shape = conv2d_output_shape(x_shape, weight_shape, params);
  return {x_shape[0],      x_shape[1],      x_shape[2], x_shape[3], weight_shape[0],
          weight_shape[2], weight_shape[3], y_shape[2], y_shape[3]};
}

}  // namespace

void conv2d_forward(double* y, const double* x, const double* weight, const double* bias,
                    const Shape& x_shape, const Shape& weight_shape, const Conv2dParams& params) {
  const auto [N, C, H, W, K, R, S, P, Q] = sizes_of(x_shape, weight_shape, params);
  const Conv2dParams& d = params;
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t k = 0; k < K; ++k) {
      for (std::int64_t p = 0; p < P; ++p) {
        for (std::int64_t q = 0; q < Q; ++q) {
          double acc = bias != nullptr ? bias[k] : 0.0;
          for (std::int64_t c = 0; c < C; ++c) {
            for (std::int64_t r = 0; r < R; ++r) {
              for (std::int64_t s = 0; s < S; ++s) {
                const std::int64_t h = p * d.stride_h - d.pad_h + r * d.dilation_h;
                const std::int64_t w = q * d.stride_w - d.pad_w + s * d.dilation_w;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;  // zero padding
                acc += weight[((k * C + c) * R + r) * S + s] * x[((n * C + c) * H + h) * W + w];
              }
            }
          }
          y[((n * K + k) * P + p) * Q + q] = acc;
        }
      }
    }
  }
}

void conv2d_backward(double* grad_x, double* grad_weight, double* grad_bias, const double* grad_y,
                     const double* x, const double* weight, const Shape& x_shape,
                     const Shape& weight_shape, const Conv2dParams& params) {
  const auto [N, C, H, W, K, R, S, P, Q] = sizes_of(x_shape, weight_shape, params);
  const Conv2dParams& d = params;
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t k = 0; k < K; ++k) {
      for (std::int64_t p = 0; p < P; ++p) {
        for (std::int64_t q = 0; q < Q; ++q) {
          const double g = grad_y[((n * K + k) * P + p) * Q + q];
          if (grad_bias != nullptr) grad_bias[k] += g;
          for (std::int64_t c = 0; c < C; ++c) {
            for (std::int64_t r = 0; r < R; ++r) {
              for (std::int64_t s = 0; s < S; ++s) {
                const std::int64_t h = p * d.stride_h - d.pad_h + r * d.dilation_h;
                const std::int64_t w = q * d.stride_w - d.pad_w + s * d.dilation_w;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;  // a tap in the padding
                const std::int64_t wi = ((k * C + c) * R + r) * S + s;
                const std::int64_t xi = ((n * C + c) * H + h) * W + w;
                if (grad_x != nullptr) grad_x[xi] += g * weight[wi];
                if (grad_weight != nullptr) grad_weight[wi] += g * x[xi];
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace towerlab::reference
