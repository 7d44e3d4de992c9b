// What the conv2d tests share: a case (shapes, parameters, bias or not), its
// results from the library's plain reference (kernels/reference/conv2d.h) that the
// backends' results and the CPU's own paths are checked against, and the error
// measure of the Winograd paths.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "kernels/conv2d.h"
#include "kernels/reference/conv2d.h"
#include "test_util.h"

namespace towerlab::testing {

struct ConvCase {
  std::string name;
  std::int64_t N, C, H, W, K, R, S;
  Conv2dParams params;
  bool bias = true;

  Shape x_shape() const { return {N, C, H, W}; }
  Shape w_shape() const { return {K, C / params.groups, R, S}; }
  Shape y_shape() const { return conv2d_output_shape(x_shape(), w_shape(), params); }
};

inline Conv2dParams make_params(std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_h,
                                std::int64_t pad_w, std::int64_t dilation_h = 1,
                                std::int64_t dilation_w = 1, std::int64_t groups = 1) {
  return {stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups};
}

// The reference's y, and the three gradients of L = sum(grad_y * y) (from zeros).
struct Reference {
  std::vector<double> y, grad_x, grad_w, grad_b;
};

inline Reference reference(const ConvCase& k, const std::vector<double>& x,
                           const std::vector<double>& w, const std::vector<double>& b,
                           const std::vector<double>& grad_y) {
  Reference ref;
  ref.y.assign(static_cast<std::size_t>(numel_of(k.y_shape())), 0.0);
  ref.grad_x.assign(x.size(), 0.0);
  ref.grad_w.assign(w.size(), 0.0);
  ref.grad_b.assign(static_cast<std::size_t>(k.K), 0.0);
  reference::conv2d_forward(ref.y.data(), x.data(), w.data(), k.bias ? b.data() : nullptr,
                            k.x_shape(), k.w_shape(), k.params);
  if (!grad_y.empty()) {
    reference::conv2d_backward(ref.grad_x.data(), ref.grad_w.data(), ref.grad_b.data(),
                               grad_y.data(), x.data(), w.data(), k.x_shape(), k.w_shape(),
                               k.params);
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

// Central differences of L = sum(g * conv2d(x, w, b)) against the backward, in float64.
inline void expect_gradients_match(const ConvCase& k) {
  SCOPED_TRACE(k.name);
  const Stream& cpu = default_stream(Device::cpu());
  const Shape ys = k.y_shape();
  Tensor x = random_double_tensor(k.x_shape(), 21);
  Tensor w = random_double_tensor(k.w_shape(), 22);
  Tensor b = random_double_tensor({k.K}, 23);
  Tensor g = random_double_tensor(ys, 24);
  auto loss = [&](const std::vector<Tensor>& in) {
    Tensor y = Tensor::empty(ys, cpu, DType::Float64);
    conv2d_forward(y, in[0], in[1], in[2], k.params, cpu);
    return weighted_sum(g, y);
  };
  Tensor grad_x = Tensor::zeros(k.x_shape(), cpu, DType::Float64);
  Tensor grad_w = Tensor::zeros(k.w_shape(), cpu, DType::Float64);
  Tensor grad_b = Tensor::zeros({k.K}, cpu, DType::Float64);
  conv2d_backward(grad_x, grad_w, grad_b, g, x, w, k.params, cpu);
  EXPECT_TRUE(check_gradient(loss, {x, w, b}, {grad_x, grad_w, grad_b}));
}

}  // namespace towerlab::testing
