// A pooling window clipped to its plane, and the two walks over windows that both
// halves of the CPU pooling use: the whole-tensor ops (kernels/cpu/pool2d.cpp) and
// the plane-at-a-time max pool (kernels/cpu/pool2d_plane.cpp). Internal to them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/pool2d.h"

namespace towerlab::cpu {

// In an unnamed namespace, as they were in the one pooling file: each file's copies
// keep internal linkage, so the compiler inlines them into their callers as before
// (a weak symbol of external linkage is not inlined where it is called once).
namespace {

// The window of output (ho, wo), clipped to the H x W plane: rows [h0, h1), columns [w0, w1).
struct Window {
  std::int64_t h0, h1, w0, w1;
  std::int64_t count() const { return (h1 - h0) * (w1 - w0); }
};

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

// Calls fn(output index within the plane, window) for every output of one plane,
// in order (ho, wo).
template <typename Fn>
void for_each_window(const PoolPlane& z, const Pool2dParams& p, const Fn& fn) {
  for (std::int64_t ho = 0; ho < z.Ho; ++ho) {
    const std::int64_t h = ho * p.stride_h - p.pad_h;
    const std::int64_t h0 = std::max<std::int64_t>(h, 0), h1 = std::min(h + p.kernel_h, z.H);
    for (std::int64_t wo = 0; wo < z.Wo; ++wo) {
      const std::int64_t w = wo * p.stride_w - p.pad_w;
      fn(ho * z.Wo + wo,
         Window{h0, h1, std::max<std::int64_t>(w, 0), std::min(w + p.kernel_w, z.W)});
    }
  }
}

}  // namespace

}  // namespace towerlab::cpu
