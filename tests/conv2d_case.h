// What the conv2d tests share: a case (shapes, parameters, bias or not), its
// results from the library's plain reference (kernels/reference/conv2d.h) that the
// backends' results and the CPU's own paths are checked against, and the error
// measure of the Winograd paths.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// How near a backend's results must be to the reference's, per result (atol, rtol:
// all_close's order).
struct ConvTolerances {
  double y_atol, y_rtol, grad_x_atol, grad_x_rtol, grad_w_atol, grad_w_rtol, grad_b_atol,
      grad_b_rtol;
};

// The backend tests' shared bodies, for any set of cases (conv2d_test.cpp's odd
// shapes, conv2d_grouped_test.cpp's grouped and depthwise ones).
class ConvBackendTest : public BackendTest {
 protected:
  // y against the reference over a sentinel-filled output (7s), and the three
  // gradients added onto random sentinels: the backward must add, never assign.
  void expect_reference_with_sentinels(const std::vector<ConvCase>& cases, unsigned seed,
                                       const ConvTolerances& tol) {
    for (const ConvCase& k : cases) {
      SCOPED_TRACE(k.name);
      const Shape ys = k.y_shape();
      const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), ++seed);
      const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), ++seed);
      const auto bv = random_values(static_cast<std::size_t>(k.K), ++seed);
      const auto gv = random_values(static_cast<std::size_t>(numel_of(ys)), ++seed);
      const Reference ref = reference(k, widen(xv), widen(wv), widen(bv), widen(gv));

      Tensor x = make(xv, k.x_shape()), w = make(wv, k.w_shape());
      Tensor b = k.bias ? make(bv, {k.K}) : Tensor();
      Tensor y = make(std::vector<float>(static_cast<std::size_t>(numel_of(ys)), 7.0f), ys);
      conv2d_forward(y, x, w, b, k.params, stream());
      EXPECT_TRUE(all_close(host(y), narrow(ref.y), tol.y_atol, tol.y_rtol)) << "y";

      const auto sx = random_values(xv.size(), ++seed), sw = random_values(wv.size(), ++seed);
      const auto sb = random_values(bv.size(), ++seed);
      Tensor grad_x = make(sx, k.x_shape()), grad_w = make(sw, k.w_shape());
      Tensor grad_b = make(sb, {k.K});
      conv2d_backward(grad_x, grad_w, grad_b, make(gv, ys), x, w, k.params, stream());
      EXPECT_TRUE(all_close(host(grad_x), plus(sx, ref.grad_x), tol.grad_x_atol, tol.grad_x_rtol))
          << "grad_x";
      EXPECT_TRUE(all_close(host(grad_w), plus(sw, ref.grad_w), tol.grad_w_atol, tol.grad_w_rtol))
          << "grad_weight";
      EXPECT_TRUE(all_close(host(grad_b), plus(sb, ref.grad_b), tol.grad_b_atol, tol.grad_b_rtol))
          << "grad_bias";
    }
  }

  // GradWrite::Assign: grad_x is written whole without being read, the bits of
  // accumulating onto zeros. NaN-filled buffers show a read or an unwritten pixel
  // (strides and ragged edges leave pixels that no tap reaches: they must be 0).
  void expect_assign_is_accumulating_onto_zeros(const std::vector<ConvCase>& cases, unsigned seed) {
    for (const ConvCase& k : cases) {
      SCOPED_TRACE(k.name);
      const Shape ys = k.y_shape();
      Tensor x =
          make(random_values(static_cast<std::size_t>(numel_of(k.x_shape())), ++seed), k.x_shape());
      Tensor w =
          make(random_values(static_cast<std::size_t>(numel_of(k.w_shape())), ++seed), k.w_shape());
      Tensor gy = make(random_values(static_cast<std::size_t>(numel_of(ys)), ++seed), ys);
      const auto n = static_cast<std::size_t>(numel_of(k.x_shape()));
      Tensor accumulated = make(std::vector<float>(n, 0.0f), k.x_shape());
      conv2d_backward(accumulated, Tensor(), Tensor(), gy, x, w, k.params, stream());
      Tensor assigned = make(std::vector<float>(n, std::nanf("")), k.x_shape());
      conv2d_backward(assigned, Tensor(), Tensor(), gy, x, w, k.params, stream(),
                      GradWrite::Assign);
      const std::vector<float> want = host(accumulated), got = host(assigned);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
      EXPECT_NE(std::count(want.begin(), want.end(), 0.0f), std::ptrdiff_t(n)) << "trivial";
    }
  }
};

}  // namespace towerlab::testing
