// 2-D pooling's plain reference (contracts in kernels/reference/pool2d.h): every
// op walks (plane, ho, wo) and visits the window through one helper, so that the
// four read the same clipping.
#include "kernels/reference/pool2d.h"

#include <cmath>
#include <cstdint>

namespace towerlab::reference {

namespace {

struct Sizes {
  std::int64_t planes, H, W, Ho, Wo;  // planes = N*C
};

Sizes sizes_of(const Shape& x_shape, const Pool2dParams& params) {
  const Shape y_shape = pool2d_output_shape(x_shape, params);
  return {x_shape[0] * x_shape[1], x_shape[2], x_shape[3], y_shape[2], y_shape[3]};
}

// Calls visit(i) for the index i into x (or grad_x) of each real value in the
// window of output (plane, ho, wo), in row-major window order.
template <typename Visit>
void for_each_in_window(const Sizes& z, const Pool2dParams& p, std::int64_t plane, std::int64_t ho,
                        std::int64_t wo, Visit visit) {
  for (std::int64_t i = 0; i < p.kernel_h; ++i) {
    for (std::int64_t j = 0; j < p.kernel_w; ++j) {
      const std::int64_t h = ho * p.stride_h - p.pad_h + i;
      const std::int64_t w = wo * p.stride_w - p.pad_w + j;
      if (h < 0 || h >= z.H || w < 0 || w >= z.W) continue;  // padding
      visit((plane * z.H + h) * z.W + w);
    }
  }
}

// Calls body(plane, ho, wo, out) for every output, out its index into y.
template <typename Body>
void for_each_output(const Sizes& z, Body body) {
  for (std::int64_t plane = 0; plane < z.planes; ++plane)
    for (std::int64_t ho = 0; ho < z.Ho; ++ho)
      for (std::int64_t wo = 0; wo < z.Wo; ++wo)
        body(plane, ho, wo, (plane * z.Ho + ho) * z.Wo + wo);
}

}  // namespace

void max_pool2d_forward(double* y, double* argmax, const double* x, const Shape& x_shape,
                        const Pool2dParams& params) {
  const Sizes z = sizes_of(x_shape, params);
  for_each_output(z, [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, std::int64_t out) {
    std::int64_t best = -1;  // index into x of the winner so far
    for_each_in_window(z, params, plane, ho, wo, [&](std::int64_t i) {
      if (best >= 0 && std::isnan(x[best])) return;  // the first NaN stays
      if (best < 0 || std::isnan(x[i]) || x[i] > x[best]) best = i;
    });
    y[out] = x[best];
    if (argmax != nullptr) argmax[out] = static_cast<double>(best - plane * z.H * z.W);
  });
}

void max_pool2d_backward(double* grad_x, const double* grad_y, const double* argmax,
                         const Shape& x_shape, const Pool2dParams& params) {
  const Sizes z = sizes_of(x_shape, params);
  for_each_output(z, [&](std::int64_t plane, std::int64_t, std::int64_t, std::int64_t out) {
    grad_x[plane * z.H * z.W + static_cast<std::int64_t>(argmax[out])] += grad_y[out];
  });
}

void avg_pool2d_forward(double* y, const double* x, const Shape& x_shape,
                        const Pool2dParams& params) {
  const Sizes z = sizes_of(x_shape, params);
  for_each_output(z, [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, std::int64_t out) {
    double sum = 0.0;
    std::int64_t count = 0;
    for_each_in_window(z, params, plane, ho, wo, [&](std::int64_t i) {
      sum += x[i];
      ++count;
    });
    y[out] = sum / static_cast<double>(count);
  });
}

void avg_pool2d_backward(double* grad_x, const double* grad_y, const Shape& x_shape,
                         const Pool2dParams& params) {
  const Sizes z = sizes_of(x_shape, params);
  for_each_output(z, [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, std::int64_t out) {
    std::int64_t count = 0;
    for_each_in_window(z, params, plane, ho, wo, [&](std::int64_t) { ++count; });
    for_each_in_window(z, params, plane, ho, wo, [&](std::int64_t i) {
      grad_x[i] += grad_y[out] / static_cast<double>(count);
    });
  });
}

}  // namespace towerlab::reference
