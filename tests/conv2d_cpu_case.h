// What the tests of the CPU's own conv2d paths share (conv2d_cpu_paths_test.cpp,
// conv2d_winograd_cpu_test.cpp, the bfloat16 planes' tests): the kernels' problem
// description of a case, and a case run forward and backward on the CPU under
// one algorithm, beside the reference's results and their terms' magnitudes.
#pragma once

#include <cmath>
#include <vector>

#include "conv2d_case.h"
#include "kernels/cpu/conv2d.h"

namespace towerlab::testing {

// The problem description the CPU's kernels receive for a case.
inline Conv2dShape shape_of(const ConvCase& k) {
  const Shape y = k.y_shape();
  return {k.N, k.C, k.H, k.W, k.K, k.R, k.S, y[2], y[3], k.params};
}

// y from the forward, then grad_x and grad_weight from one backward (added to the
// sentinels) on the CPU, under `algorithm`.
struct ConvOutputs {
  std::vector<float> y, grad_x, grad_w;

  std::vector<float> all() const {
    std::vector<float> joined = y;
    joined.insert(joined.end(), grad_x.begin(), grad_x.end());
    joined.insert(joined.end(), grad_w.begin(), grad_w.end());
    return joined;
  }
};
inline ConvOutputs run_cpu(const ConvCase& k, const std::vector<float>& xv,
                           const std::vector<float>& wv, const std::vector<float>& bv,
                           const std::vector<float>& gv, const std::vector<float>& sentinel,
                           const std::vector<float>& w_sentinel, cpu::Conv2dAlgorithm algorithm) {
  const cpu::ScopedConv2dAlgorithm scoped(algorithm);
  auto put = [](const std::vector<float>& v, const Shape& shape) {
    return Tensor::from_host<float>(v, shape, cpu());
  };
  const Shape ys = k.y_shape();
  Tensor y = put(std::vector<float>(std::size_t(numel_of(ys)), 7.0f), ys);
  conv2d_forward(y, put(xv, k.x_shape()), put(wv, k.w_shape()), k.bias ? put(bv, {k.K}) : Tensor(),
                 k.params, cpu());
  Tensor grad_x = put(sentinel, k.x_shape()), grad_w = put(w_sentinel, k.w_shape());
  conv2d_backward(grad_x, grad_w, Tensor(), put(gv, ys), put(xv, k.x_shape()), put(wv, k.w_shape()),
                  k.params, cpu());
  return {y.to_host<float>(cpu()), grad_x.to_host<float>(cpu()), grad_w.to_host<float>(cpu())};
}

// A case's inputs (random, from a seed), the reference's results and the magnitude
// sums that scale the tolerance of each (conv2d_case.h's worst_error); run() computes
// them on the CPU with one algorithm. Copies are the controls' starting point.
struct CpuConvCase {
  ConvCase k;
  std::vector<float> xv, wv, bv, gv, sentinel, w_sentinel;
  std::vector<double> y, grad_x, grad_w, y_scale, grad_x_scale, grad_w_scale;

  CpuConvCase(const ConvCase& c, unsigned seed) : k(c) {
    xv = random_values(std::size_t(numel_of(k.x_shape())), seed);
    wv = random_values(std::size_t(numel_of(k.w_shape())), seed + 1);
    bv = random_values(std::size_t(k.K), seed + 2);
    gv = random_values(std::size_t(numel_of(k.y_shape())), seed + 3);
    sentinel = random_values(xv.size(), seed + 4);
    w_sentinel = random_values(wv.size(), seed + 5);
    const Reference ref = reference(k, widen(xv), widen(wv), widen(bv), widen(gv));
    const Reference abs =
        reference(k, magnitudes(xv), magnitudes(wv), magnitudes(bv), magnitudes(gv));
    y = ref.y;
    y_scale = abs.y;
    for (std::size_t i = 0; i < xv.size(); ++i) {
      grad_x.push_back(double(sentinel[i]) + ref.grad_x[i]);
      grad_x_scale.push_back(std::fabs(double(sentinel[i])) + abs.grad_x[i]);
    }
    for (std::size_t i = 0; i < wv.size(); ++i) {
      grad_w.push_back(double(w_sentinel[i]) + ref.grad_w[i]);
      grad_w_scale.push_back(std::fabs(double(w_sentinel[i])) + abs.grad_w[i]);
    }
  }
  ConvOutputs run(cpu::Conv2dAlgorithm algorithm) const {
    return run_cpu(k, xv, wv, bv, gv, sentinel, w_sentinel, algorithm);
  }
};

}  // namespace towerlab::testing
