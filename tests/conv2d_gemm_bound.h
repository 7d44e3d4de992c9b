// The bound a conv2d whose products are exact and summed in float32 is held to
// (kernels/conv2d.h: 16-bit operands on CUDA's tensor cores and on the CPU's
// bfloat16 GEMM path, TF32 on CUDA), and the pieces its tests share: a case's
// random operands, the three passes' results as host vectors, and
//   |got - want| <= 2 (n + 2) 2^-24 (sum of |terms| + |the sentinel|)
// with n the pass's reduction length (C*R*S forward, K*R*S input gradient, N*P*Q
// weight gradient).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "conv2d_case.h"
#include "test_util.h"

namespace towerlab::testing {

// A case's float32 operands, unrounded: x, weight, bias and grad_y from seed,
// seed + 1, seed + 2 and seed + 3.
struct ConvOperands {
  std::vector<float> x, w, b, g;
};

inline ConvOperands operands(const ConvCase& k, unsigned seed) {
  return {random_values(std::size_t(numel_of(k.x_shape())), seed),
          random_values(std::size_t(numel_of(k.w_shape())), seed + 1),
          random_values(std::size_t(k.K), seed + 2),
          random_values(std::size_t(numel_of(k.y_shape())), seed + 3)};
}

// The reference's grad_bias alone: the sum of g over (n, p, q) per channel.
inline std::vector<double> bias_gradient(const ConvCase& k, const std::vector<double>& g) {
  std::vector<double> grad_b(std::size_t(k.K), 0.0);
  reference::conv2d_backward(nullptr, nullptr, grad_b.data(), g.data(), nullptr, nullptr,
                             k.x_shape(), k.w_shape(), k.params);
  return grad_b;
}

// The pass's results, as host vectors.
struct ConvResults {
  std::vector<float> y, grad_x, grad_w, grad_b;
};

// The reduction lengths n of the bound, per pass.
struct ConvLengths {
  std::int64_t forward, data, weight;
};

inline ConvLengths lengths(const ConvCase& k) {
  const Shape ys = k.y_shape();
  return {k.C / k.params.groups * k.R * k.S, k.K / k.params.groups * k.R * k.S,
          k.N * ys[2] * ys[3]};
}

// |got - (want + sentinel)| <= 2 (n + 2) 2^-24 (scale + |sentinel|), element by element.
inline ::testing::AssertionResult within_bound(const std::vector<float>& got,
                                               const std::vector<double>& want,
                                               const std::vector<double>& scale, std::int64_t n,
                                               double sentinel) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  const double unit = 2.0 * double(n + 2) * std::ldexp(1.0, -24);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double expected = want[i] + sentinel;
    const double bound = unit * (scale[i] + std::fabs(sentinel));
    if (!(std::fabs(double(got[i]) - expected) <= bound)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << " against " << expected << ", off by "
             << std::fabs(double(got[i]) - expected) << " > " << bound;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace towerlab::testing
