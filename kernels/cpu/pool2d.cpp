// CPU 2-D pooling: the specification for kernels/cuda/pool2d.cu. One loop nest per
// op over (plane, ho, wo); each output visits its window clipped to the plane.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/pool2d.h"

namespace towerlab::cpu {

namespace {

// The window of output (ho, wo), clipped to the H x W plane: rows [h0, h1), columns [w0, w1).
struct Window {
  std::int64_t h0, h1, w0, w1;
  std::int64_t count() const { return (h1 - h0) * (w1 - w0); }
};

Window window_of(std::int64_t ho, std::int64_t wo, std::int64_t H, std::int64_t W,
                 const Pool2dParams& p) {
  const std::int64_t h = ho * p.stride_h - p.pad_h, w = wo * p.stride_w - p.pad_w;
  return {std::max<std::int64_t>(h, 0), std::min(h + p.kernel_h, H), std::max<std::int64_t>(w, 0),
          std::min(w + p.kernel_w, W)};
}

// Index (h*W + w) in the plane of the window's first maximum; a NaN beats any
// number, and the first NaN wins.
template <typename T>
std::int64_t window_argmax(const T* plane, std::int64_t W, const Window& win) {
  std::int64_t best = win.h0 * W + win.w0;
  for (std::int64_t h = win.h0; h < win.h1; ++h) {
    for (std::int64_t w = win.w0; w < win.w1; ++w) {
      const T v = plane[h * W + w], b = plane[best];
      if (v > b || (std::isnan(v) && !std::isnan(b))) best = h * W + w;
    }
  }
  return best;
}

// Calls fn(plane index, ho, wo, window) for every output position of x [N,C,H,W].
template <typename Fn>
void for_each_output(const Shape& x, const Shape& y, const Pool2dParams& p, Fn&& fn) {
  const std::int64_t planes = x[0] * x[1], H = x[2], W = x[3], Ho = y[2], Wo = y[3];
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    for (std::int64_t ho = 0; ho < Ho; ++ho) {
      for (std::int64_t wo = 0; wo < Wo; ++wo) fn(plane, ho, wo, window_of(ho, wo, H, W, p));
    }
  }
}

}  // namespace

void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params) {
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();  // [N,C,H,W]
    T* out = y.data<T>();       // [N,C,Ho,Wo]
    const std::int64_t HW = x.size(2) * x.size(3), HoWo = y.size(2) * y.size(3), W = x.size(3);
    for_each_output(x.shape(), y.shape(), params,
                    [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, const Window& win) {
                      const T* p = in + plane * HW;
                      out[plane * HoWo + ho * y.size(3) + wo] = p[window_argmax(p, W, win)];
                    });
  });
}

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const Pool2dParams& params) {
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();       // [N,C,H,W]
    const T* gy = grad_y.data<T>();  // [N,C,Ho,Wo]
    T* gx = grad_x.data<T>();        // [N,C,H,W]
    const std::int64_t HW = x.size(2) * x.size(3), HoWo = grad_y.size(2) * grad_y.size(3);
    const std::int64_t W = x.size(3);
    for_each_output(x.shape(), grad_y.shape(), params,
                    [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, const Window& win) {
                      const std::int64_t arg = window_argmax(in + plane * HW, W, win);
                      gx[plane * HW + arg] += gy[plane * HoWo + ho * grad_y.size(3) + wo];
                    });
  });
}

void avg_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params) {
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();  // [N,C,H,W]
    T* out = y.data<T>();       // [N,C,Ho,Wo]
    const std::int64_t HW = x.size(2) * x.size(3), HoWo = y.size(2) * y.size(3), W = x.size(3);
    for_each_output(x.shape(), y.shape(), params,
                    [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, const Window& win) {
                      const T* p = in + plane * HW;
                      T sum = 0;
                      for (std::int64_t h = win.h0; h < win.h1; ++h) {
                        for (std::int64_t w = win.w0; w < win.w1; ++w) sum += p[h * W + w];
                      }
                      out[plane * HoWo + ho * y.size(3) + wo] = sum / static_cast<T>(win.count());
                    });
  });
}

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Pool2dParams& params) {
  with_dtype(grad_x.dtype(), [&]<typename T>() {
    const T* gy = grad_y.data<T>();  // [N,C,Ho,Wo]
    T* gx = grad_x.data<T>();        // [N,C,H,W]
    const std::int64_t HW = grad_x.size(2) * grad_x.size(3);
    const std::int64_t HoWo = grad_y.size(2) * grad_y.size(3), W = grad_x.size(3);
    for_each_output(grad_x.shape(), grad_y.shape(), params,
                    [&](std::int64_t plane, std::int64_t ho, std::int64_t wo, const Window& win) {
                      const T share =
                          gy[plane * HoWo + ho * grad_y.size(3) + wo] / static_cast<T>(win.count());
                      T* p = gx + plane * HW;
                      for (std::int64_t h = win.h0; h < win.h1; ++h) {
                        for (std::int64_t w = win.w0; w < win.w1; ++w) p[h * W + w] += share;
                      }
                    });
  });
}

}  // namespace towerlab::cpu
