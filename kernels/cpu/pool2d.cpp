// CPU 2-D pooling, tested against kernels/reference/pool2d.h as
// kernels/cuda/pool2d.cu is. One loop nest per op over (plane, ho, wo); each output
// visits its window clipped to the plane. bfloat16 and float16 tensors run the
// reference itself on each thread's range of planes (its bits are their contract,
// kernels/pool2d.h); float32 and float64 take the loops below.
// The float32 max-pooling forward with argmax (training's) pools a plane at a time
// (kernels/cpu/pool2d_plane.cpp), with a vector form for the 2x2 stride-2 window.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool2d.h"
#include "kernels/cpu/pool2d_window.h"
#include "kernels/reference/pool2d.h"

namespace towerlab::cpu {

namespace {

// Sizes of x [N,C,H,W] and y [N,C,Ho,Wo], read once (Tensor::size is not free
// inside the innermost loops).
struct Sizes {
  std::int64_t planes, H, W, Ho, Wo;
  PoolPlane plane() const { return {H, W, Ho, Wo}; }
};

Sizes sizes_of(const Tensor& x, const Tensor& y) {
  return {x.size(0) * x.size(1), x.size(2), x.size(3), y.size(2), y.size(3)};
}

// The window's maximum, or NaN if it holds one: the value at window_argmax, for
// the forward, which needs no index. Branch-free (a max instruction and an or),
// for the reason given at window_argmax (kernels/cpu/pool2d_window.h).
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

// Calls fn(plane, output index within the plane, window) for every output. The
// planes split over the thread pool (kernels/cpu/parallel.h): every op reads and
// writes inside one plane of x and y, in the same order on whichever thread.
template <typename Fn>
void for_each_output(const Sizes& z, const Pool2dParams& p, const Fn& fn) {
  parallel_rows(z.planes, z.H * z.W, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t plane = first; plane < last; ++plane) {
      for_each_window(z.plane(), p, [&](std::int64_t o, const Window& win) { fn(plane, o, win); });
    }
  });
}

// Max pooling forward, with the argmax (a plane at a time: max_pool_plane) when
// `argmax` is defined.
template <typename T>
void max_pool2d_forward_impl(const Tensor& y, const Tensor& argmax, const Tensor& x,
                             const Pool2dParams& params) {
  const T* in = x.data<T>();  // [N,C,H,W]
  T* out = y.data<T>();       // [N,C,Ho,Wo]
  const Sizes z = sizes_of(x, y);
  if (argmax.defined()) {
    T* where = argmax.data<T>();  // [N,C,Ho,Wo]
    parallel_rows(z.planes, z.H * z.W, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t plane = first; plane < last; ++plane) {
        const std::int64_t o = plane * z.Ho * z.Wo;
        max_pool_plane(in + plane * z.H * z.W, out + o, where + o, z.plane(), params);
      }
    });
    return;
  }
  for_each_output(z, params, [&](std::int64_t plane, std::int64_t o, const Window& win) {
    out[plane * z.Ho * z.Wo + o] = window_max(in + plane * z.H * z.W, z.W, win);
  });
}

// --- 16 bits: the reference (kernels/reference/pool2d.h) on each thread's planes ---

// Calls fn(first, part) for ranges of whole planes over the thread pool: `first`
// the range's first plane, `part` = [planes in the range, 1, H, W], the shape the
// reference is given for it (its windows never leave a plane).
template <typename Fn>
void for_plane_ranges(const Shape& x_shape, const Fn& fn) {
  const std::int64_t H = x_shape[2], W = x_shape[3];
  parallel_rows(x_shape[0] * x_shape[1], H * W, [&](std::int64_t first, std::int64_t last) {
    fn(first, Shape{last - first, 1, H, W});
  });
}

template <typename T>
void sixteen_bit_max_forward(const Tensor& y, const Tensor& argmax, const Tensor& x,
                             const Pool2dParams& params) {
  for_plane_ranges(x.shape(), [&](std::int64_t first, const Shape& part) {
    const std::int64_t o = first * y.size(2) * y.size(3);
    reference::max_pool2d_forward(y.data<T>() + o,
                                  argmax.defined() ? argmax.data<float>() + o : nullptr,
                                  x.data<T>() + first * part[2] * part[3], part, params);
  });
}

// Without an argmax (inference): each plane widened once, exactly, into float32
// scratch, window_argmax's choice made there (the reference's rule: the first NaN,
// else the first of the largest values), and the 16-bit value it picks copied as it
// is. The reference's bits, without its per-value widening and window walk.
template <typename T>
void sixteen_bit_max_values(const Tensor& y, const Tensor& x, const Pool2dParams& params) {
  const T* in = x.data<T>();  // [N,C,H,W]
  T* out = y.data<T>();       // [N,C,Ho,Wo]
  const Sizes z = sizes_of(x, y);
  parallel_rows(z.planes, z.H * z.W, [&](std::int64_t first, std::int64_t last) {
    std::vector<float> widened(static_cast<std::size_t>(z.H * z.W));  // [H,W]
    for (std::int64_t plane = first; plane < last; ++plane) {
      const T* x_plane = in + plane * z.H * z.W;
      widen_16bit(widened.data(), x_plane, z.H * z.W);
      for_each_window(z.plane(), params, [&](std::int64_t o, const Window& win) {
        out[plane * z.Ho * z.Wo + o] = x_plane[window_argmax(widened.data(), z.W, win)];
      });
    }
  });
}

// The backward from a recorded argmax, or (x given) from the argmax recomputed
// here, a range's planes at a time. Assign: grad_x zeroed first (the reference's
// sums from +0 added to +0 are the sums themselves).
template <typename T>
void sixteen_bit_max_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& argmax,
                              const Tensor* x, const Pool2dParams& params, GradWrite write) {
  for_plane_ranges(grad_x.shape(), [&](std::int64_t first, const Shape& part) {
    const std::int64_t plane = part[2] * part[3], o = first * grad_y.size(2) * grad_y.size(3);
    T* gx = grad_x.data<T>() + first * plane;
    std::vector<float> recomputed;  // [planes, Ho, Wo] where x is given
    const float* where = nullptr;
    if (x != nullptr) {
      recomputed.resize(static_cast<std::size_t>(part[0] * grad_y.size(2) * grad_y.size(3)));
      std::vector<T> y(recomputed.size());
      reference::max_pool2d_forward(y.data(), recomputed.data(), x->data<T>() + first * plane, part,
                                    params);
      where = recomputed.data();
    } else {
      where = argmax.data<float>() + o;
    }
    if (write == GradWrite::Assign) std::fill(gx, gx + part[0] * plane, T(0.0f));
    reference::max_pool2d_backward(gx, grad_y.data<T>() + o, where, part, params);
  });
}

}  // namespace

void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params) {
  with_any_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (reference::kIs16Bit<T>) {
      sixteen_bit_max_values<T>(y, x, params);
    } else {
      max_pool2d_forward_impl<T>(y, Tensor(), x, params);
    }
  });
}

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const Pool2dParams& params) {
  with_any_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (reference::kIs16Bit<T>) {
      sixteen_bit_max_backward<T>(grad_x, grad_y, Tensor(), &x, params, GradWrite::Accumulate);
    } else {
      const T* in = x.data<T>();       // [N,C,H,W]
      const T* gy = grad_y.data<T>();  // [N,C,Ho,Wo]
      T* gx = grad_x.data<T>();        // [N,C,H,W]
      const Sizes z = sizes_of(x, grad_y);
      for_each_output(z, params, [&](std::int64_t plane, std::int64_t o, const Window& win) {
        const std::int64_t offset = plane * z.H * z.W;
        gx[offset + window_argmax(in + offset, z.W, win)] += gy[plane * z.Ho * z.Wo + o];
      });
    }
  });
}

void max_pool2d_forward_with_argmax(const Tensor& y, const Tensor& argmax, const Tensor& x,
                                    const Pool2dParams& params) {
  with_any_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (reference::kIs16Bit<T>) {
      sixteen_bit_max_forward<T>(y, argmax, x, params);
    } else {
      max_pool2d_forward_impl<T>(y, argmax, x, params);
    }
  });
}

// Each plane's outputs in order (ho, wo), as max_pool2d_backward adds them. To
// assign, a plane is zeroed just before its outputs are added in, while it is in
// cache: the same sums as accumulating into a zero-filled grad_x, one pass fewer.
void max_pool2d_backward_from_argmax(const Tensor& grad_x, const Tensor& grad_y,
                                     const Tensor& argmax, const Pool2dParams& params,
                                     GradWrite write) {
  with_any_dtype(grad_x.dtype(), [&]<typename T>() {
    if constexpr (reference::kIs16Bit<T>) {
      sixteen_bit_max_backward<T>(grad_x, grad_y, argmax, nullptr, params, write);
    } else {
      const T* gy = grad_y.data<T>();     // [N,C,Ho,Wo]
      const T* where = argmax.data<T>();  // [N,C,Ho,Wo]
      T* gx = grad_x.data<T>();           // [N,C,H,W]
      const std::int64_t planes = grad_x.size(0) * grad_x.size(1);
      const PoolPlane z{grad_x.size(2), grad_x.size(3), grad_y.size(2), grad_y.size(3)};
      parallel_rows(planes, z.H * z.W, [&](std::int64_t first, std::int64_t last) {
        for (std::int64_t plane = first; plane < last; ++plane) {
          const std::int64_t o = plane * z.Ho * z.Wo;
          T* p = gx + plane * z.H * z.W;
          if (write == GradWrite::Assign) std::fill(p, p + z.H * z.W, T(0));
          for (std::int64_t i = o; i < o + z.Ho * z.Wo; ++i) {
            p[static_cast<std::int64_t>(where[i])] += gy[i];
          }
        }
      });
    }
  });
}

void avg_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params) {
  with_any_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (reference::kIs16Bit<T>) {
      for_plane_ranges(x.shape(), [&](std::int64_t first, const Shape& part) {
        reference::avg_pool2d_forward(y.data<T>() + first * y.size(2) * y.size(3),
                                      x.data<T>() + first * part[2] * part[3], part, params);
      });
    } else {
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
    }
  });
}

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Pool2dParams& params) {
  with_any_dtype(grad_x.dtype(), [&]<typename T>() {
    if constexpr (reference::kIs16Bit<T>) {
      for_plane_ranges(grad_x.shape(), [&](std::int64_t first, const Shape& part) {
        reference::avg_pool2d_backward(grad_x.data<T>() + first * part[2] * part[3],
                                       grad_y.data<T>() + first * grad_y.size(2) * grad_y.size(3),
                                       part, params);
      });
    } else {
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
    }
  });
}

}  // namespace towerlab::cpu
