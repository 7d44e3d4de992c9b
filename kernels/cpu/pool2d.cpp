// CPU 2-D pooling: the specification for kernels/cuda/pool2d.cu. One loop nest per
// op over (plane, ho, wo); each output visits its window clipped to the plane.
// The float32 max-pooling forward with argmax (training's) has a second form for
// the 2x2 stride-2 unpadded window (FashionNet's): the same choice, made for four
// outputs at once in vector lanes over a pair of input rows, instead of walking a
// generic window per output (about three times faster).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool2d.h"
#include "kernels/cpu/simd.h"

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

// The 2x2 stride-2 window without padding: every window lies inside the plane.
bool is_2x2_stride_2(const Pool2dParams& p) {
  return p.kernel_h == 2 && p.kernel_w == 2 && p.stride_h == 2 && p.stride_w == 2 && p.pad_h == 0 &&
         p.pad_w == 0;
}

// window_argmax over the 2x2 windows of one output row, four outputs at a time: the
// same choice (first maximum in the order top-left, top-right, bottom-left,
// bottom-right; else the first NaN) made with lane masks instead of a loop per
// window. `top` is the position of the row pair's first value in the plane; out
// and where [Wo] get the outputs' values and positions. A row of fewer than four
// outputs goes through window_argmax itself.
void max_pool_2x2_row(const float* plane, std::int64_t top, std::int64_t W, std::int64_t Wo,
                      float* out, float* where) {
  const float* r0 = plane + top;  // [W] the window's top row
  const float* r1 = r0 + W;       // [W] its bottom row
  const Vec4 right = splat(1.0f), below = splat(float(W)), below_right = splat(float(W + 1));
  const Vec4 lanes = {0.0f, 2.0f, 4.0f, 6.0f};  // each lane's first column, from 2*wo
  // Groups of four outputs; the last group ends at Wo and may overlap the one
  // before it (its outputs are written twice, with the same values), so that no
  // output falls to a scalar tail once Wo >= 4.
  std::int64_t wo = 0;
  for (std::int64_t next = 0; Wo >= 4 && next < Wo; next = wo + 4) {
    wo = std::min(next, Wo - 4);
    const Vec4 t0 = load4(r0 + 2 * wo), t1 = load4(r0 + 2 * wo + 4);
    const Vec4 b0 = load4(r1 + 2 * wo), b1 = load4(r1 + 2 * wo + 4);
    // The four values of each lane's window, in window order.
    const Vec4 v0 = __builtin_shufflevector(t0, t1, 0, 2, 4, 6);
    const Vec4 v1 = __builtin_shufflevector(t0, t1, 1, 3, 5, 7);
    const Vec4 v2 = __builtin_shufflevector(b0, b1, 0, 2, 4, 6);
    const Vec4 v3 = __builtin_shufflevector(b0, b1, 1, 3, 5, 7);
    // "v > best" is false for NaN on either side, as in window_argmax.
    Vec4 best = v0, offset = splat(0.0f);
    Mask4 greater = v1 > best;
    best = select(greater, v1, best);
    offset = select(greater, right, offset);
    greater = v2 > best;
    best = select(greater, v2, best);
    offset = select(greater, below, offset);
    greater = v3 > best;
    best = select(greater, v3, best);
    offset = select(greater, below_right, offset);
    // The first NaN wins: chosen from the back, so that the earliest one stands.
    const Mask4 n0 = v0 != v0, n1 = v1 != v1, n2 = v2 != v2, n3 = v3 != v3;
    Vec4 nan_offset = select(n3, below_right, splat(0.0f));
    Vec4 nan_value = select(n3, v3, splat(0.0f));
    nan_offset = select(n2, below, nan_offset);
    nan_value = select(n2, v2, nan_value);
    nan_offset = select(n1, right, nan_offset);
    nan_value = select(n1, v1, nan_value);
    nan_offset = select(n0, splat(0.0f), nan_offset);
    nan_value = select(n0, v0, nan_value);
    const Mask4 any_nan = n0 | n1 | n2 | n3;
    const Vec4 y = select(any_nan, nan_value, best);
    // Positions are exact in float32: planes hold at most 2^24 values.
    const Vec4 at = splat(float(top + 2 * wo)) + lanes + select(any_nan, nan_offset, offset);
    store4(out + wo, y);
    store4(where + wo, at);
  }
  if (Wo >= 4) return;
  const std::int64_t h = top / W;
  for (wo = 0; wo < Wo; ++wo) {
    const std::int64_t i = window_argmax(plane, W, Window{h, h + 2, 2 * wo, 2 * wo + 2});
    out[wo] = plane[i];
    where[wo] = static_cast<float>(i);
  }
}

// Max pooling forward, with the argmax when `argmax` is defined.
template <typename T>
void max_pool2d_forward_impl(const Tensor& y, const Tensor& argmax, const Tensor& x,
                             const Pool2dParams& params) {
  const T* in = x.data<T>();                                 // [N,C,H,W]
  T* out = y.data<T>();                                      // [N,C,Ho,Wo]
  T* where = argmax.defined() ? argmax.data<T>() : nullptr;  // [N,C,Ho,Wo]
  const Sizes z = sizes_of(x, y);
  if constexpr (std::is_same_v<T, float>) {
    if (where != nullptr && is_2x2_stride_2(params)) {
      parallel_rows(z.planes, z.H * z.W, [&](std::int64_t first, std::int64_t last) {
        for (std::int64_t plane = first; plane < last; ++plane) {
          for (std::int64_t ho = 0; ho < z.Ho; ++ho) {
            const std::int64_t o = (plane * z.Ho + ho) * z.Wo;
            max_pool_2x2_row(in + plane * z.H * z.W, 2 * ho * z.W, z.W, z.Wo, out + o, where + o);
          }
        }
      });
      return;
    }
  }
  for_each_output(z, params, [&](std::int64_t plane, std::int64_t o, const Window& win) {
    const T* p = in + plane * z.H * z.W;
    const std::int64_t at = plane * z.Ho * z.Wo + o;
    if (where == nullptr) {
      out[at] = window_max(p, z.W, win);
      return;
    }
    const std::int64_t i = window_argmax(p, z.W, win);
    out[at] = p[i];
    where[at] = static_cast<T>(i);
  });
}

}  // namespace

void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params) {
  with_dtype(x.dtype(), [&]<typename T>() { max_pool2d_forward_impl<T>(y, Tensor(), x, params); });
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
  with_dtype(x.dtype(), [&]<typename T>() { max_pool2d_forward_impl<T>(y, argmax, x, params); });
}

// Each plane's outputs in order (ho, wo), as max_pool2d_backward adds them. To
// assign, a plane is zeroed just before its outputs are added in, while it is in
// cache: the same sums as accumulating into a zero-filled grad_x, one pass fewer.
void max_pool2d_backward_from_argmax(const Tensor& grad_x, const Tensor& grad_y,
                                     const Tensor& argmax, GradWrite write) {
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
        if (write == GradWrite::Assign) std::fill(p, p + in_plane, T(0));
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
