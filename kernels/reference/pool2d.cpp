// 2-D pooling's plain reference (contracts in kernels/reference/pool2d.h): every
// op walks (plane, ho, wo) and visits the window through one helper, so that the
// four read the same clipping. A backward sums each grad_x element's terms in a
// buffer of math_t first and adds the buffer to grad_x at the end, so that a 16-bit
// grad_x is rounded once.
#include "kernels/reference/pool2d.h"

#include <cmath>
#include <cstdint>
#include <vector>

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

// grad_x[i] += sum[i], in math_t and rounded once: grad_x [planes*H*W], sum [same].
template <typename T>
void add_sums(T* grad_x, const std::vector<math_t<T>>& sum) {
  using M = math_t<T>;
  for (std::size_t i = 0; i < sum.size(); ++i) grad_x[i] = T(static_cast<M>(grad_x[i]) + sum[i]);
}

}  // namespace

template <typename T>
void max_pool2d_forward(T* y, math_t<T>* argmax, const T* x, const Shape& x_shape,
                        const Pool2dParams& params) {
  using M = math_t<T>;
  const Sizes z = sizes_of(x_shape, params);
  for_each_output(z, [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, std::int64_t out) {
    std::int64_t best = -1;  // index into x of the winner so far
    for_each_in_window(z, params, plane, ho, wo, [&](std::int64_t i) {
      const M v = static_cast<M>(x[i]);
      if (best >= 0 && std::isnan(static_cast<M>(x[best]))) return;  // the first NaN stays
      if (best < 0 || std::isnan(v) || v > static_cast<M>(x[best])) best = i;
    });
    y[out] = x[best];
    if (argmax != nullptr) argmax[out] = static_cast<M>(best - plane * z.H * z.W);
  });
}

template <typename T>
void max_pool2d_backward(T* grad_x, const T* grad_y, const math_t<T>* argmax, const Shape& x_shape,
                         const Pool2dParams& params) {
  using M = math_t<T>;
  const Sizes z = sizes_of(x_shape, params);
  std::vector<M> sum(static_cast<std::size_t>(z.planes * z.H * z.W), M(0));  // [N,C,H,W]
  for_each_output(z, [&](std::int64_t plane, std::int64_t, std::int64_t, std::int64_t out) {
    const auto i =
        static_cast<std::size_t>(plane * z.H * z.W + static_cast<std::int64_t>(argmax[out]));
    sum[i] += static_cast<M>(grad_y[out]);
  });
  add_sums(grad_x, sum);
}

template <typename T>
void avg_pool2d_forward(T* y, const T* x, const Shape& x_shape, const Pool2dParams& params) {
  using M = math_t<T>;
  const Sizes z = sizes_of(x_shape, params);
  for_each_output(z, [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, std::int64_t out) {
    M sum = 0;
    std::int64_t count = 0;
    for_each_in_window(z, params, plane, ho, wo, [&](std::int64_t i) {
      sum += static_cast<M>(x[i]);
      ++count;
    });
    y[out] = T(sum / static_cast<M>(count));
  });
}

template <typename T>
void avg_pool2d_backward(T* grad_x, const T* grad_y, const Shape& x_shape,
                         const Pool2dParams& params) {
  using M = math_t<T>;
  const Sizes z = sizes_of(x_shape, params);
  std::vector<M> sum(static_cast<std::size_t>(z.planes * z.H * z.W), M(0));  // [N,C,H,W]
  for_each_output(z, [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, std::int64_t out) {
    std::int64_t count = 0;
    for_each_in_window(z, params, plane, ho, wo, [&](std::int64_t) { ++count; });
    const M share = static_cast<M>(grad_y[out]) / static_cast<M>(count);
    for_each_in_window(z, params, plane, ho, wo,
                       [&](std::int64_t i) { sum[static_cast<std::size_t>(i)] += share; });
  });
  add_sums(grad_x, sum);
}

#define TL_INSTANTIATE_POOL2D(T)                                                        \
  template void max_pool2d_forward<T>(T*, math_t<T>*, const T*, const Shape&,           \
                                      const Pool2dParams&);                             \
  template void max_pool2d_backward<T>(T*, const T*, const math_t<T>*, const Shape&,    \
                                       const Pool2dParams&);                            \
  template void avg_pool2d_forward<T>(T*, const T*, const Shape&, const Pool2dParams&); \
  template void avg_pool2d_backward<T>(T*, const T*, const Shape&, const Pool2dParams&);
TL_INSTANTIATE_POOL2D(double)
TL_INSTANTIATE_POOL2D(bfloat16)
TL_INSTANTIATE_POOL2D(float16)
#undef TL_INSTANTIATE_POOL2D

}  // namespace towerlab::reference
