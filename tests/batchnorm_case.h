// What the batch-norm tests share (batchnorm_test.cpp, batchnorm_sixteen_bit_test.cpp):
// the library's plain reference in double that the backends' results are checked
// against, and the synchronized-batch-norm recipe (the split API on towers, row
// ranges of one batch) that the single call and the 16-bit towers are compared with.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/reference/batchnorm.h"
#include "test_util.h"

namespace towerlab::testing {

// x viewed as [N,C,S]: the library's plain reference (kernels/reference/batchnorm.h)
// in double, the gradients from zeros.
struct BatchNormReference {
  std::vector<double> mean, m2, inv_std, y, grad_x, grad_gamma, grad_beta;
};

inline BatchNormReference batchnorm_reference(const std::vector<float>& x,
                                              const std::vector<float>& gamma,
                                              const std::vector<float>& beta,
                                              const std::vector<float>& grad_y, std::int64_t N,
                                              std::int64_t C, std::int64_t S, double eps) {
  const std::vector<double> x64(x.begin(), x.end()), gamma64(gamma.begin(), gamma.end()),
      beta64(beta.begin(), beta.end()), grad_y64(grad_y.begin(), grad_y.end());
  const auto c = static_cast<std::size_t>(C);
  BatchNormReference r{std::vector<double>(c),        std::vector<double>(c),
                       std::vector<double>(c),        std::vector<double>(x.size()),
                       std::vector<double>(x.size()), std::vector<double>(c),
                       std::vector<double>(c)};
  reference::batchnorm_stats(r.mean.data(), r.m2.data(), x64.data(), N, C, S);
  reference::batchnorm_forward_training(r.y.data(), r.mean.data(), r.inv_std.data(), nullptr,
                                        nullptr, x64.data(), gamma64.data(), beta64.data(), N, C, S,
                                        eps, 0.0);
  reference::batchnorm_backward(r.grad_x.data(), r.grad_gamma.data(), r.grad_beta.data(),
                                grad_y64.data(), x64.data(), gamma64.data(), r.mean.data(),
                                r.inv_std.data(), N, C, S);
  return r;
}

inline std::vector<float> to_float(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

inline std::vector<float> plus(const std::vector<double>& v, float offset) {
  std::vector<float> out;
  for (double d : v) out.push_back(static_cast<float>(d + offset));
  return out;
}

// Row ranges [begin, end) of a batch, one a tower.
using Towers = std::vector<std::pair<std::int64_t, std::int64_t>>;

// What the synchronized-batch-norm recipe gives.
struct SplitRun {
  std::int64_t count = 0;              // values per channel over all towers
  Tensor mean, m2, inv_std;            // [C] merged statistics
  Tensor y;                            // x's shape, each tower's rows
  Tensor moving_mean, moving_var;      // [C] updated by the first tower
  Tensor sum_grad_y, sum_grad_y_xhat;  // [C] added over the towers
  Tensor grad_x;                       // the given grad_x, each tower's rows added to
};

// The synchronized-batch-norm recipe on towers (row ranges of x): each tower's
// partial statistics merged in order, every tower normalized with the merged ones
// (only the first updating moving statistics that start at mm0, mv0, with momentum
// 0.9: one policy of DESIGN.md), each tower's backward sums added ("all-reduced"),
// then each tower's grad_x accumulated into grad_x. The per-channel tensors take
// gamma's dtype, x's activations x's.
inline SplitRun run_split(const Tensor& x, const Tensor& grad_y, const Tensor& gamma,
                          const Tensor& beta, const std::vector<float>& mm0,
                          const std::vector<float>& mv0, const Towers& towers, const Tensor& grad_x,
                          const Stream& stream) {
  const std::int64_t C = x.size(1), S = x.numel() / (x.size(0) * C);
  const DType stats = gamma.dtype();
  auto channels = [&] { return Tensor::empty({C}, stream, stats); };
  SplitRun r{.mean = channels(), .m2 = channels(), .inv_std = channels()};
  for (auto [begin, end] : towers) {
    Tensor part_mean = channels(), part_m2 = channels();
    batchnorm_stats({.mean = part_mean, .m2 = part_m2, .x = x.slice(begin, end)}, stream);
    if (r.count == 0) {
      copy(r.mean, part_mean, stream);
      copy(r.m2, part_m2, stream);
    } else {
      batchnorm_merge_stats({.mean_a = r.mean,
                             .m2_a = r.m2,
                             .count_a = r.count,
                             .mean_b = part_mean,
                             .m2_b = part_m2,
                             .count_b = (end - begin) * S},
                            stream);
    }
    r.count += (end - begin) * S;
  }
  r.y = Tensor::empty(x.shape(), stream, x.dtype());
  r.moving_mean = Tensor::from_host<float>(mm0, {C}, stream);
  r.moving_var = Tensor::from_host<float>(mv0, {C}, stream);
  for (auto [begin, end] : towers) {
    const bool first = begin == 0;
    batchnorm_forward_from_stats({.y = r.y.slice(begin, end),
                                  .inv_std = r.inv_std,
                                  .moving_mean = first ? r.moving_mean : Tensor(),
                                  .moving_var = first ? r.moving_var : Tensor(),
                                  .x = x.slice(begin, end),
                                  .gamma = gamma,
                                  .beta = beta,
                                  .mean = r.mean,
                                  .m2 = r.m2,
                                  .count = r.count,
                                  .eps = 1e-3,
                                  .momentum = 0.9},
                                 stream);
  }
  r.sum_grad_y = Tensor::zeros({C}, stream, stats);
  r.sum_grad_y_xhat = Tensor::zeros({C}, stream, stats);
  for (auto [begin, end] : towers) {
    Tensor a = channels(), b = channels();
    batchnorm_backward_reduce({.sum_grad_y = a,
                               .sum_grad_y_xhat = b,
                               .grad_y = grad_y.slice(begin, end),
                               .x = x.slice(begin, end),
                               .mean = r.mean,
                               .inv_std = r.inv_std},
                              stream);
    add(r.sum_grad_y, r.sum_grad_y, a, stream);
    add(r.sum_grad_y_xhat, r.sum_grad_y_xhat, b, stream);
  }
  r.grad_x = grad_x;
  for (auto [begin, end] : towers) {
    batchnorm_backward_apply({.grad_x = grad_x.slice(begin, end),
                              .grad_y = grad_y.slice(begin, end),
                              .x = x.slice(begin, end),
                              .gamma = gamma,
                              .mean = r.mean,
                              .inv_std = r.inv_std,
                              .sum_grad_y = r.sum_grad_y,
                              .sum_grad_y_xhat = r.sum_grad_y_xhat,
                              .count = r.count},
                             stream);
  }
  return r;
}

// Towers of a batch of 7: rows [0, 3), [3, 7) and an empty one.
inline const Towers kUnevenTowers = {{0, 3}, {3, 7}, {7, 7}};

}  // namespace towerlab::testing
