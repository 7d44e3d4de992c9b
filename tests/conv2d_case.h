// What the conv2d tests share: a case (shapes, parameters, bias or not), the naive
// seven-loop reference in double that the backends' results and the CPU's own paths
// are checked against, and the error measure of the Winograd paths.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/conv2d.h"
#include "test_util.h"

namespace towerlab::testing {

struct ConvCase {
  std::string name;
  std::int64_t N, C, H, W, K, R, S;
  Conv2dParams params;
  bool bias = true;

  Shape x_shape() const { return {N, C, H, W}; }
  Shape w_shape() const { return {K, C, R, S}; }
  Shape y_shape() const { return conv2d_output_shape(x_shape(), w_shape(), params); }
};

inline Conv2dParams make_params(std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_h,
                                std::int64_t pad_w, std::int64_t dilation_h = 1,
                                std::int64_t dilation_w = 1) {
  return {stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w};
}

// x at (n, c, h, w), zero in the padding.
inline double at(const std::vector<double>& x, const ConvCase& k, std::int64_t n, std::int64_t c,
                 std::int64_t h, std::int64_t w) {
  if (h < 0 || h >= k.H || w < 0 || w >= k.W) return 0.0;
  return x[static_cast<std::size_t>(((n * k.C + c) * k.H + h) * k.W + w)];
}

// The naive seven-loop convolution, in double. Also gives the three gradients of
// L = sum(grad_y * y) by walking the same loops (scattering instead of gathering).
struct Reference {
  std::vector<double> y, grad_x, grad_w, grad_b;
};

inline Reference reference(const ConvCase& k, const std::vector<double>& x,
                           const std::vector<double>& w, const std::vector<double>& b,
                           const std::vector<double>& grad_y) {
  const Shape ys = k.y_shape();
  const std::int64_t P = ys[2], Q = ys[3];
  const Conv2dParams& p = k.params;
  Reference ref;
  ref.y.assign(static_cast<std::size_t>(numel_of(ys)), 0.0);
  ref.grad_x.assign(x.size(), 0.0);
  ref.grad_w.assign(w.size(), 0.0);
  ref.grad_b.assign(static_cast<std::size_t>(k.K), 0.0);
  for (std::int64_t n = 0; n < k.N; ++n) {
    for (std::int64_t o = 0; o < k.K; ++o) {
      for (std::int64_t op = 0; op < P; ++op) {
        for (std::int64_t oq = 0; oq < Q; ++oq) {
          const auto yi = static_cast<std::size_t>(((n * k.K + o) * P + op) * Q + oq);
          double acc = k.bias ? b[static_cast<std::size_t>(o)] : 0.0;
          const double g = grad_y.empty() ? 0.0 : grad_y[yi];
          ref.grad_b[static_cast<std::size_t>(o)] += g;
          for (std::int64_t c = 0; c < k.C; ++c) {
            for (std::int64_t r = 0; r < k.R; ++r) {
              for (std::int64_t s = 0; s < k.S; ++s) {
                const std::int64_t h = op * p.stride_h - p.pad_h + r * p.dilation_h;
                const std::int64_t ww = oq * p.stride_w - p.pad_w + s * p.dilation_w;
                const auto wi = static_cast<std::size_t>(((o * k.C + c) * k.R + r) * k.S + s);
                acc += w[wi] * at(x, k, n, c, h, ww);
                ref.grad_w[wi] += g * at(x, k, n, c, h, ww);
                if (h >= 0 && h < k.H && ww >= 0 && ww < k.W) {
                  ref.grad_x[static_cast<std::size_t>(((n * k.C + c) * k.H + h) * k.W + ww)] +=
                      g * w[wi];
                }
              }
            }
          }
          ref.y[yi] = acc;
        }
      }
    }
  }
  return ref;
}

inline std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}
inline std::vector<float> narrow(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}
inline std::vector<float> plus(std::vector<float> a, const std::vector<double>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += static_cast<float>(b[i]);
  return a;
}

// |v|, in double: the reference run on these gives each result's sum of the
// magnitudes of its terms (sum |w||x|), the scale of the Winograd paths' rounding.
inline std::vector<double> magnitudes(const std::vector<float>& v) {
  std::vector<double> m(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) m[i] = std::fabs(double(v[i]));
  return m;
}

// The largest |actual - expected| / scale.
inline double worst_error(const std::vector<float>& actual, const std::vector<double>& expected,
                          const std::vector<double>& scale) {
  EXPECT_EQ(actual.size(), expected.size());
  double worst = 0;
  for (std::size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    worst = std::max(worst, std::fabs(double(actual[i]) - expected[i]) / scale[i]);
  }
  return worst;
}

}  // namespace towerlab::testing
