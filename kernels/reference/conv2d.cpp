// conv2d's plain reference (contracts in kernels/reference/conv2d.h): the forward
// gathers each output from its taps, and the backward walks the same taps in the
// same order and scatters each output's gradient back to the values it read. With
// groups, output channel k reads only its group's input channels.
#include "kernels/reference/conv2d.h"

#include <cstdint>

namespace towerlab::reference {

namespace {

// The problem's sizes, read once from the shapes.
struct Sizes {
  std::int64_t N, C, H, W, K, R, S, P, Q;
  std::int64_t Cg, Kg;  // input and output channels per group
};

Sizes sizes_of(const Shape& x_shape, const Shape& weight_shape, const Conv2dParams& params) {
  const Shape y_shape = conv2d_output_shape(x_shape, weight_shape, params);
  return {x_shape[0],
          x_shape[1],
          x_shape[2],
          x_shape[3],
          weight_shape[0],
          weight_shape[2],
          weight_shape[3],
          y_shape[2],
          y_shape[3],
          weight_shape[1],
          weight_shape[0] / params.groups};
}

// Calls tap(yi, wi, xi) for every output y[n,k,p,q] (index yi) and every tap
// (c, r, s) of it that reads x inside the plane (weight index wi, x index xi), in
// order n, k, p, q, then c, r, s: a tap in the zero padding adds nothing. c counts
// the Cg channels of k's group, g = k / Kg, which are x's channels g*Cg + c.
template <typename Tap>
void for_each_tap(const Sizes& z, const Conv2dParams& d, Tap tap) {
  for (std::int64_t n = 0; n < z.N; ++n) {
    for (std::int64_t k = 0; k < z.K; ++k) {
      for (std::int64_t p = 0; p < z.P; ++p) {
        for (std::int64_t q = 0; q < z.Q; ++q) {
          const std::int64_t yi = ((n * z.K + k) * z.P + p) * z.Q + q;
          const std::int64_t first_c = (k / z.Kg) * z.Cg;
          for (std::int64_t c = 0; c < z.Cg; ++c) {
            for (std::int64_t r = 0; r < z.R; ++r) {
              for (std::int64_t s = 0; s < z.S; ++s) {
                const std::int64_t h = p * d.stride_h - d.pad_h + r * d.dilation_h;
                const std::int64_t w = q * d.stride_w - d.pad_w + s * d.dilation_w;
                if (h < 0 || h >= z.H || w < 0 || w >= z.W) continue;
                tap(yi, ((k * z.Cg + c) * z.R + r) * z.S + s,
                    ((n * z.C + first_c + c) * z.H + h) * z.W + w);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

void conv2d_forward(double* y, const double* x, const double* weight, const double* bias,
                    const Shape& x_shape, const Shape& weight_shape, const Conv2dParams& params) {
  const Sizes z = sizes_of(x_shape, weight_shape, params);
  const std::int64_t plane = z.P * z.Q;
  for (std::int64_t i = 0; i < z.N * z.K * plane; ++i) {
    y[i] = bias != nullptr ? bias[(i / plane) % z.K] : 0.0;
  }
  for_each_tap(z, params, [&](std::int64_t yi, std::int64_t wi, std::int64_t xi) {
    y[yi] += weight[wi] * x[xi];
  });
}

void conv2d_backward(double* grad_x, double* grad_weight, double* grad_bias, const double* grad_y,
                     const double* x, const double* weight, const Shape& x_shape,
                     const Shape& weight_shape, const Conv2dParams& params) {
  const Sizes z = sizes_of(x_shape, weight_shape, params);
  const std::int64_t plane = z.P * z.Q;
  if (grad_bias != nullptr) {
    for (std::int64_t i = 0; i < z.N * z.K * plane; ++i) grad_bias[(i / plane) % z.K] += grad_y[i];
  }
  for_each_tap(z, params, [&](std::int64_t yi, std::int64_t wi, std::int64_t xi) {
    if (grad_x != nullptr) grad_x[xi] += grad_y[yi] * weight[wi];
    if (grad_weight != nullptr) grad_weight[wi] += grad_y[yi] * x[xi];
  });
}

}  // namespace towerlab::reference
