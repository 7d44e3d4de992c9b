// CPU 2-D pooling: the specification for kernels/cuda/pool2d.cu. One loop nest per
// op over (plane, ho, wo); each output visits its window clipped to the plane.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool2d.h"

namespace towerlab::cpu {

namespace {

// The window of output (ho, wo), clipped to the H x W plane: rows [h0, h1), columns [w0, w1).
struct Window {
  std::int64_t h0, h1, w0, w1;
  std::int64_t count() const { return (h1 - h0) * (w1 - w0); }
};

// Sizes of x [N,C,H,W] and y [N,C,Ho,Wo], read once (Tensor::size is not free
// inside the innermost loops).
struct Sizes {
  std::int64_t planes, H, W, Ho, Wo;
};

Sizes sizes_of(const Tensor& x, const Tensor& y) {
  return {x.size(0) * x.size(1), x.size(2), x.size(3), y.size(2), y.size(3)};
}

// The window's maximum, or NaN if it holds one: the value at window_argmax, for
// the forward, which needs no index. Branch-free (a max instruction and an or),
// for the reason given below.
template <typename T>
T window_max(const T* plane, std::int64_t W, const Window& win) {
  T b = plane[win.h0 * W + win.w0];
  bool nan = false;
  for (std::int64_t h = win.h0; h < win.h1; ++h) {
    for (std::int64_t w = win.w0; w < win.w1; ++w) {
      const T v = plane[h * W + w];
      b = v > b ? v : b;
      nan |= std::isnan(v);
    }
  }
  return nan ? std::numeric_limits<T>::quiet_NaN() : b;
}

// Index (h*W + w) in the plane of the window's first maximum, or of its first NaN
// if it holds one. The choice is made with arithmetic, not branches: on real data
// "v > b" is a coin toss, and a mispredicted branch per value costs more than the
// whole comparison.
template <typename T>
std::int64_t window_argmax(const T* plane, std::int64_t W, const Window& win) {
  std::int64_t best = win.h0 * W + win.w0, first_nan = -1;
  T b = plane[best];
  for (std::int64_t h = win.h0; h < win.h1; ++h) {
    for (std::int64_t w = win.w0; w < win.w1; ++w) {
      const std::int64_t i = h * W + w;
      const T v = plane[i];
      const std::int64_t greater = v > b;  // 0 or 1; false for NaN on either side
      best += greater * (i - best);
      b = greater ? v : b;
      const std::int64_t new_nan = std::isnan(v) & (first_nan < 0);
      first_nan += new_nan * (i - first_nan);
    }
  }
  return first_nan >= 0 ? first_nan : best;
}

// Calls fn(plane, output index within the plane, window) for every output. The
// planes split over the thread pool (kernels/cpu/parallel.h): every op reads and
// writes inside one plane of x and y, in the same order on whichever thread.
template <typename Fn>
void for_each_output(const Sizes& z, const Pool2dParams& p, const Fn& fn) {
  parallel_rows(z.planes, z.H * z.W, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t plane = first; plane < last; ++plane) {
      for (std::int64_t ho = 0; ho < z.Ho; ++ho) {
        const std::int64_t h = ho * p.stride_h - p.pad_h;
        const std::int64_t h0 = std::max<std::int64_t>(h, 0), h1 = std::min(h + p.kernel_h, z.H);
        for (std::int64_t wo = 0; wo < z.Wo; ++wo) {
          const std::int64_t w = wo * p.stride_w - p.pad_w;
          fn(plane, ho * z.Wo + wo,
             Window{h0, h1, std::max<std::int64_t>(w, 0), std::min(w + p.kernel_w, z.W)});
        }
      }
    }
  });
}

}  // namespace

void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params) {
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();  // [N,C,H,W]
    T* out = y.data<T>();       // [N,C,Ho,Wo]
    const Sizes z = sizes_of(x, y);
    for_each_output(z, params, [&](std::int64_t plane, std::int64_t o, const Window& win) {
      const T* p = in + plane * z.H * z.W;
      out[plane * z.Ho * z.Wo + o] = window_max(p, z.W, win);
    });
  });
}

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const Pool2dParams& params) {
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();       // [N,C,H,W]
    const T* gy = grad_y.data<T>();  // [N,C,Ho,Wo]
    T* gx = grad_x.data<T>();        // [N,C,H,W]
    const Sizes z = sizes_of(x, grad_y);
    for_each_output(z, params, [&](std::int64_t plane, std::int64_t o, const Window& win) {
      const std::int64_t offset = plane * z.H * z.W;
      gx[offset + window_argmax(in + offset, z.W, win)] += gy[plane * z.Ho * z.Wo + o];
    });
  });
}

void max_pool2d_forward_with_argmax(const Tensor& y, const Tensor& argmax, const Tensor& x,
                                    const Pool2dParams& params) {
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();    // [N,C,H,W]
    T* out = y.data<T>();         // [N,C,Ho,Wo]
    T* where = argmax.data<T>();  // [N,C,Ho,Wo]
    const Sizes z = sizes_of(x, y);
    for_each_output(z, params, [&](std::int64_t plane, std::int64_t o, const Window& win) {
      const T* p = in + plane * z.H * z.W;
      const std::int64_t i = window_argmax(p, z.W, win);
      out[plane * z.Ho * z.Wo + o] = p[i];
      where[plane * z.Ho * z.Wo + o] = static_cast<T>(i);
    });
  });
}

// Each plane's outputs in order (ho, wo), as max_pool2d_backward adds them.
void max_pool2d_backward_from_argmax(const Tensor& grad_x, const Tensor& grad_y,
                                     const Tensor& argmax) {
  with_dtype(grad_x.dtype(), [&]<typename T>() {
    const T* gy = grad_y.data<T>();     // [N,C,Ho,Wo]
    const T* where = argmax.data<T>();  // [N,C,Ho,Wo]
    T* gx = grad_x.data<T>();           // [N,C,H,W]
    const std::int64_t planes = grad_x.size(0) * grad_x.size(1);
    const std::int64_t in_plane = grad_x.size(2) * grad_x.size(3);
    const std::int64_t out_plane = grad_y.size(2) * grad_y.size(3);
    parallel_rows(planes, in_plane, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t plane = first; plane < last; ++plane) {
        T* p = gx + plane * in_plane;
        for (std::int64_t o = plane * out_plane; o < (plane + 1) * out_plane; ++o) {
          p[static_cast<std::int64_t>(where[o])] += gy[o];
        }
      }
    });
  });
}

void avg_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params) {
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();  // [N,C,H,W]
    T* out = y.data<T>();       // [N,C,Ho,Wo]
    const Sizes z = sizes_of(x, y);
    for_each_output(z, params, [&](std::int64_t plane, std::int64_t o, const Window& win) {
      const T* p = in + plane * z.H * z.W;
      T sum = 0;
      for (std::int64_t h = win.h0; h < win.h1; ++h) {
        for (std::int64_t w = win.w0; w < win.w1; ++w) sum += p[h * z.W + w];
      }
      out[plane * z.Ho * z.Wo + o] = sum / static_cast<T>(win.count());
    });
  });
}

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Pool2dParams& params) {
  with_dtype(grad_x.dtype(), [&]<typename T>() {
    const T* gy = grad_y.data<T>();  // [N,C,Ho,Wo]
    T* gx = grad_x.data<T>();        // [N,C,H,W]
    const Sizes z = sizes_of(grad_x, grad_y);
    for_each_output(z, params, [&](std::int64_t plane, std::int64_t o, const Window& win) {
      const T share = gy[plane * z.Ho * z.Wo + o] / static_cast<T>(win.count());
      T* p = gx + plane * z.H * z.W;
      for (std::int64_t h = win.h0; h < win.h1; ++h) {
        for (std::int64_t w = win.w0; w < win.w1; ++w) p[h * z.W + w] += share;
      }
    });
  });
}

}  // namespace towerlab::cpu
