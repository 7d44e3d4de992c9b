// Batch normalization on every backend: hand-computed numbers, a plain reference
// on odd shapes, the split (synchronized) API against the single call, large-mean
// stability, accumulation, errors, bfloat16 and float16 activations (the float32
// path's bits on the widened values, rounded once), and gradients in float64.
#include <cmath>

#include "batchnorm_args.h"
#include "gradcheck.h"
#include "kernels/batchnorm.h"
#include "kernels/reference/batchnorm.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class BatchNormTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(BatchNormTest);

// x viewed as [N,C,S]: the library's plain reference (kernels/reference/batchnorm.h)
// in double, the gradients from zeros.
struct Reference {
  std::vector<double> mean, m2, inv_std, y, grad_x, grad_gamma, grad_beta;
};

Reference reference(const std::vector<float>& x, const std::vector<float>& gamma,
                    const std::vector<float>& beta, const std::vector<float>& grad_y,
                    std::int64_t N, std::int64_t C, std::int64_t S, double eps) {
  const std::vector<double> x64(x.begin(), x.end()), gamma64(gamma.begin(), gamma.end()),
      beta64(beta.begin(), beta.end()), grad_y64(grad_y.begin(), grad_y.end());
  const auto c = static_cast<std::size_t>(C);
  Reference r{std::vector<double>(c),        std::vector<double>(c),        std::vector<double>(c),
              std::vector<double>(x.size()), std::vector<double>(x.size()), std::vector<double>(c),
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

std::vector<float> to_float(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

std::vector<float> plus(const std::vector<double>& v, float offset) {
  std::vector<float> out;
  for (double d : v) out.push_back(static_cast<float>(d + offset));
  return out;
}

// x [N=2, C=2, H=1, W=2]: channel 0 holds {1, 2, 3, 6}, channel 1 holds {0, 0, 4, 4}.
TEST_P(BatchNormTest, TrainingForwardByHand) {
  Tensor x = make({1, 2, 0, 0, 3, 6, 4, 4}, {2, 2, 1, 2});
  Tensor gamma = make({2, 1}, {2}), beta = make({0, 10}, {2});
  Tensor moving_mean = make({1, -1}, {2}), moving_var = make({1, 2}, {2});
  Tensor y = Tensor::empty({2, 2, 1, 2}, stream());
  Tensor mean = Tensor::empty({2}, stream()), inv_std = Tensor::empty({2}, stream());
  batchnorm_forward_training({.y = y,
                              .save_mean = mean,
                              .save_inv_std = inv_std,
                              .moving_mean = moving_mean,
                              .moving_var = moving_var,
                              .x = x,
                              .gamma = gamma,
                              .beta = beta,
                              .eps = 0.0,
                              .momentum = 0.9},
                             stream());
  // Channel 0: mean 3, m2 = 4+1+0+9 = 14, biased var 3.5, unbiased 14/3.
  // Channel 1: mean 2, m2 = 16, biased var 4 (inv_std 0.5), unbiased 16/3.
  const float k0 = 2.0f / std::sqrt(3.5f);
  EXPECT_TRUE(all_close(host(mean), {3.0f, 2.0f}));
  EXPECT_TRUE(all_close(host(inv_std), {1.0f / std::sqrt(3.5f), 0.5f}));
  EXPECT_TRUE(all_close(host(y), {-2 * k0, -1 * k0, 9.0f, 9.0f, 0.0f, 3 * k0, 11.0f, 11.0f}));
  // TF convention: new = 0.9 * old + 0.1 * batch, with the unbiased variance.
  EXPECT_TRUE(all_close(host(moving_mean), {0.9f * 1 + 0.1f * 3, 0.9f * -1 + 0.1f * 2}));
  EXPECT_TRUE(all_close(host(moving_var), {0.9f + 0.1f * 14 / 3.0f, 1.8f + 0.1f * 16 / 3.0f}));
}

TEST_P(BatchNormTest, MomentumOneKeepsAndZeroReplacesMovingStatistics) {
  Tensor x = make({1, 2, 0, 0, 3, 6, 4, 4}, {2, 2, 1, 2});
  Tensor gamma = make({1, 1}, {2}), beta = make({0, 0}, {2});
  BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
  f.moving_mean = make({7, 8}, {2});
  f.moving_var = make({9, 10}, {2});
  f.momentum = 1.0;
  batchnorm_forward_training(f, stream());
  EXPECT_EQ(host(f.moving_mean), (std::vector<float>{7, 8}));
  EXPECT_EQ(host(f.moving_var), (std::vector<float>{9, 10}));
  f.momentum = 0.0;
  batchnorm_forward_training(f, stream());
  EXPECT_TRUE(all_close(host(f.moving_mean), {3.0f, 2.0f}));
  EXPECT_TRUE(all_close(host(f.moving_var), {14 / 3.0f, 16 / 3.0f}));
}

TEST_P(BatchNormTest, InferenceUsesMovingStatistics) {
  Tensor x = make({1, 2, 3, 4, 5, 6}, {3, 2});  // [N=3, C=2]
  Tensor gamma = make({2, -1}, {2}), beta = make({1, 0}, {2});
  Tensor mm = make({3, 4}, {2}), mv = make({3, 15}, {2});
  Tensor y = Tensor::empty({3, 2}, stream());
  batchnorm_forward_inference({.y = y,
                               .x = x,
                               .gamma = gamma,
                               .beta = beta,
                               .moving_mean = mm,
                               .moving_var = mv,
                               .eps = 1.0},
                              stream());
  // Channel 0: 2 * (x - 3) / 2 + 1; channel 1: -(x - 4) / 4.
  EXPECT_TRUE(all_close(host(y), {-1.0f, 0.5f, 1.0f, 0.0f, 3.0f, -0.5f}));
  EXPECT_EQ(host(mm), (std::vector<float>{3, 4}));  // untouched
}

TEST_P(BatchNormTest, MatchesReferenceOnOddShapes) {
  const std::vector<Shape> shapes = {{3, 5, 7, 11},  {5, 7},         {1, 3, 1, 2}, {2, 1, 1, 1},
                                     {17, 3, 13, 1}, {4, 2, 64, 65}, {129, 33}};
  for (const Shape& shape : shapes) {
    const std::int64_t N = shape[0], C = shape[1], S = numel_of(shape) / (N * C);
    const auto n = static_cast<std::size_t>(numel_of(shape));
    auto xv = random_values(n, 1, -2.0f, 3.0f), gyv = random_values(n, 2);
    auto gv = random_values(C, 3, 0.5f, 1.5f), bv = random_values(C, 4);
    const Reference r = reference(xv, gv, bv, gyv, N, C, S, 1e-3);
    Tensor x = make(xv, shape), grad_y = make(gyv, shape);
    Tensor gamma = make(gv, {C}), beta = make(bv, {C});
    const BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
    batchnorm_forward_training(f, stream());
    EXPECT_TRUE(all_close(host(f.y), to_float(r.y), 1e-5, 1e-4)) << to_string(shape);
    EXPECT_TRUE(all_close(host(f.save_mean), to_float(r.mean), 1e-6, 1e-5)) << to_string(shape);
    EXPECT_TRUE(all_close(host(f.save_inv_std), to_float(r.inv_std), 1e-6, 1e-5))
        << to_string(shape);
    // Sentinel-filled gradients: the backward must add to them.
    Tensor grad_x = make(std::vector<float>(n, 0.5f), shape);
    Tensor grad_gamma = make(std::vector<float>(C, -1.0f), {C});
    Tensor grad_beta = make(std::vector<float>(C, 2.0f), {C});
    batchnorm_backward(backward_of(f, grad_y, grad_x, grad_gamma, grad_beta), stream());
    EXPECT_TRUE(all_close(host(grad_x), plus(r.grad_x, 0.5f), 1e-5, 1e-3)) << to_string(shape);
    EXPECT_TRUE(all_close(host(grad_gamma), plus(r.grad_gamma, -1.0f), 1e-4, 1e-4))
        << to_string(shape);
    EXPECT_TRUE(all_close(host(grad_beta), plus(r.grad_beta, 2.0f), 1e-4, 1e-4))
        << to_string(shape);
  }
}

TEST_P(BatchNormTest, StableForLargeMean) {
  // Values around 1e4 with a spread of about 1: E[x^2] - E[x]^2 in float would
  // subtract two numbers near 1e8, whose float spacing (8) exceeds the variance.
  const Shape shape = {16, 3, 9, 9};
  const std::int64_t C = 3, S = 81, N = 16;
  auto xv = random_values(static_cast<std::size_t>(numel_of(shape)), 5, -1.7f, 1.7f);
  for (std::size_t i = 0; i < xv.size(); ++i)
    xv[i] += 1e4f + 100.0f * static_cast<float>((i / S) % C);
  std::vector<float> ones(C, 1.0f), zeros(C, 0.0f);
  const Reference r = reference(xv, ones, zeros, xv, N, C, S, 0.0);

  // The naive float formula really is wrong here (so this test can fail).
  float sum = 0.0f, sq = 0.0f;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t s = 0; s < S; ++s) {
      const float v = xv[(n * C) * S + s];
      sum += v;
      sq += v * v;
    }
  const float naive_var = sq / (N * S) - (sum / (N * S)) * (sum / (N * S));
  EXPECT_GT(std::abs(naive_var - r.m2[0] / (N * S)), 0.1 * r.m2[0] / (N * S));

  Tensor x = make(xv, shape);
  Tensor mean = Tensor::empty({C}, stream()), m2 = Tensor::empty({C}, stream());
  batchnorm_stats({.mean = mean, .m2 = m2, .x = x}, stream());
  EXPECT_TRUE(all_close(host(mean), to_float(r.mean), 0.0, 1e-7));
  EXPECT_TRUE(all_close(host(m2), to_float(r.m2), 0.0, 1e-4));
  BatchNormForwardTraining f = training_forward(x, make(ones, {C}), make(zeros, {C}), stream());
  f.eps = 0.0;
  batchnorm_forward_training(f, stream());
  EXPECT_TRUE(all_close(host(f.save_inv_std), to_float(r.inv_std), 0.0, 1e-4));
  // Normalized values of order 1 keep about 3 decimals (x itself is only stored
  // to 1e-3 near 1e4).
  EXPECT_TRUE(all_close(host(f.y), to_float(r.y), 2e-3, 0.0));
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
SplitRun run_split(const Tensor& x, const Tensor& grad_y, const Tensor& gamma, const Tensor& beta,
                   const std::vector<float>& mm0, const std::vector<float>& mv0,
                   const Towers& towers, const Tensor& grad_x, const Stream& stream) {
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
const Towers kUnevenTowers = {{0, 3}, {3, 7}, {7, 7}};

// The synchronized-batch-norm recipe on two "towers" (uneven halves of a batch,
// plus an empty one) gives exactly what the single call gives on the whole batch.
TEST_P(BatchNormTest, SplitApiOnHalvesMatchesSingleCall) {
  // Planes of 20 floats (the flat elementwise grid) and of 32 float4s (the
  // reduction's split, walked backwards; an empty tower's block still writes).
  for (const std::int64_t W : {5, 32}) {
    const std::int64_t N = 7, C = 3, S = 4 * W;
    const Shape shape = {N, C, 4, W};
    const auto n = static_cast<std::size_t>(numel_of(shape));
    Tensor x = make(random_values(n, 6, 1.0f, 4.0f), shape);
    Tensor grad_y = make(random_values(n, 7), shape);
    Tensor gamma = make(random_values(C, 8, 0.5f, 1.5f), {C}),
           beta = make(random_values(C, 9), {C});
    const std::vector<float> mm0 = {0.5f, -0.5f, 1.0f}, mv0 = {1.0f, 2.0f, 0.5f};

    // Single call.
    BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
    f.moving_mean = make(mm0, {C});
    f.moving_var = make(mv0, {C});
    f.momentum = 0.9;
    batchnorm_forward_training(f, stream());
    Tensor grad_x = Tensor::zeros(shape, stream());
    Tensor grad_gamma = Tensor::zeros({C}, stream()), grad_beta = Tensor::zeros({C}, stream());
    batchnorm_backward(backward_of(f, grad_y, grad_x, grad_gamma, grad_beta), stream());

    const SplitRun t = run_split(x, grad_y, gamma, beta, mm0, mv0, kUnevenTowers,
                                 Tensor::zeros(shape, stream()), stream());
    ASSERT_EQ(t.count, N * S);
    EXPECT_TRUE(all_close(host(t.mean), host(f.save_mean), 1e-6, 1e-5));
    EXPECT_TRUE(all_close(host(t.inv_std), host(f.save_inv_std), 1e-6, 1e-5));
    EXPECT_TRUE(all_close(host(t.y), host(f.y), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(host(t.moving_mean), host(f.moving_mean), 1e-6, 1e-5));
    EXPECT_TRUE(all_close(host(t.moving_var), host(f.moving_var), 1e-6, 1e-5));
    EXPECT_TRUE(all_close(host(t.grad_x), host(grad_x), 1e-5, 1e-4));
    EXPECT_TRUE(all_close(host(t.sum_grad_y_xhat), host(grad_gamma), 1e-5, 1e-4));
    EXPECT_TRUE(all_close(host(t.sum_grad_y), host(grad_beta), 1e-5, 1e-4));
  }
}

TEST_P(BatchNormTest, ForwardMayRunInPlace) {
  const Shape shape = {3, 4, 5, 6};
  const auto values = random_values(static_cast<std::size_t>(numel_of(shape)), 12);
  Tensor gamma = make({1, 2, 3, 4}, {4}), beta = make({0, 1, 0, 1}, {4});
  BatchNormForwardTraining f = training_forward(make(values, shape), gamma, beta, stream());
  batchnorm_forward_training(f, stream());
  const Tensor y = f.y;
  f.y = f.x = make(values, shape);  // in place
  batchnorm_forward_training(f, stream());
  EXPECT_EQ(host(f.y), host(y));
  // Inference, with the statistics standing in for the moving ones.
  BatchNormForwardInference g{.y = y,
                              .x = make(values, shape),
                              .gamma = gamma,
                              .beta = beta,
                              .moving_mean = f.save_mean,
                              .moving_var = f.save_inv_std};
  batchnorm_forward_inference(g, stream());
  g.y = g.x = make(values, shape);  // in place
  batchnorm_forward_inference(g, stream());
  EXPECT_EQ(host(g.y), host(y));
}

// Views may start at any element: x and y one float past an aligned start take
// CUDA's float path on planes that would go in float4s, with the same results.
TEST_P(BatchNormTest, MisalignedViewsMatchAligned) {
  const Shape shape = {3, 4, 2, 6};  // S = 12
  const std::int64_t n = numel_of(shape);
  const auto values = random_values(static_cast<std::size_t>(n), 13);
  std::vector<float> padded(values);
  padded.insert(padded.begin(), 0.0f);
  Tensor gamma = make({1, 2, 3, 4}, {4}), beta = make({0, 1, 0, 1}, {4});
  BatchNormForwardTraining f = training_forward(make(values, shape), gamma, beta, stream());
  batchnorm_forward_training(f, stream());
  BatchNormForwardTraining g =
      training_forward(make(padded, {n + 1}).view(1, shape), gamma, beta, stream());
  g.y = Tensor::zeros({n + 1}, stream()).view(1, shape);
  batchnorm_forward_training(g, stream());
  EXPECT_TRUE(all_close(host(g.y), host(f.y), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(host(g.save_mean), host(f.save_mean), 1e-5, 1e-6));
  const auto gy = random_values(static_cast<std::size_t>(n), 14);
  std::vector<float> gy_padded(gy);
  gy_padded.insert(gy_padded.begin(), 0.0f);
  Tensor grad_x = Tensor::zeros(shape, stream());
  Tensor grad_x_view = Tensor::zeros({n + 1}, stream()).view(1, shape);
  batchnorm_backward(backward_of(f, make(gy, shape), grad_x), stream());
  batchnorm_backward(backward_of(g, make(gy_padded, {n + 1}).view(1, shape), grad_x_view),
                     stream());
  EXPECT_TRUE(all_close(host(grad_x_view), host(grad_x), 1e-4, 1e-5));
}

TEST_P(BatchNormTest, MergeStatsByHand) {
  // a = {1, 3} (mean 2, m2 2), b = {5, 7, 9} (mean 7, m2 8); all = mean 5, m2 = 16+4+0+4+16 = 40.
  Tensor mean_a = make({2}, {1}), m2_a = make({2}, {1});
  batchnorm_merge_stats({.mean_a = mean_a,
                         .m2_a = m2_a,
                         .count_a = 2,
                         .mean_b = make({7}, {1}),
                         .m2_b = make({8}, {1}),
                         .count_b = 3},
                        stream());
  EXPECT_TRUE(all_close(host(mean_a), {5.0f}));
  EXPECT_TRUE(all_close(host(m2_a), {40.0f}));
}

TEST_P(BatchNormTest, OnlyRequestedGradientsAreComputed) {
  const Shape shape = {4, 2, 3, 3};
  const auto n = static_cast<std::size_t>(numel_of(shape));
  Tensor x = make(random_values(n, 10), shape), grad_y = make(random_values(n, 11), shape);
  Tensor gamma = make({1.5f, 0.5f}, {2}), beta = make({0, 0}, {2});
  BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
  f.eps = 1e-5;
  batchnorm_forward_training(f, stream());
  Tensor all_x = Tensor::zeros(shape, stream()), all_gamma = Tensor::zeros({2}, stream()),
         all_beta = Tensor::zeros({2}, stream());
  batchnorm_backward(backward_of(f, grad_y, all_x, all_gamma, all_beta), stream());
  Tensor only_x = Tensor::zeros(shape, stream());
  batchnorm_backward(backward_of(f, grad_y, only_x), stream());
  EXPECT_EQ(host(only_x), host(all_x));
  Tensor only_gamma = Tensor::zeros({2}, stream());
  batchnorm_backward(backward_of(f, grad_y, Tensor(), only_gamma), stream());
  EXPECT_EQ(host(only_gamma), host(all_gamma));
  EXPECT_NE(host(all_gamma), (std::vector<float>{0, 0}));
}

TEST_P(BatchNormTest, EmptyTensors) {
  // An empty tower's partial statistics: mean 0, m2 0 (count 0).
  Tensor x = Tensor::zeros({0, 3, 4, 4}, stream());
  Tensor mean = make({9, 9, 9}, {3}), m2 = make({9, 9, 9}, {3});
  batchnorm_stats({.mean = mean, .m2 = m2, .x = x}, stream());
  EXPECT_EQ(host(mean), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(host(m2), (std::vector<float>{0, 0, 0}));
  Tensor gamma = make({1, 1, 1}, {3}), beta = make({0, 0, 0}, {3});
  Tensor y = Tensor::empty({0, 3, 4, 4}, stream());
  batchnorm_forward_inference({.y = y,
                               .x = x,
                               .gamma = gamma,
                               .beta = beta,
                               .moving_mean = mean,
                               .moving_var = m2,
                               .eps = 1e-3},
                              stream());  // no-op
  // Backward on an empty batch adds nothing.
  Tensor grad_gamma = make({5, 5, 5}, {3});
  batchnorm_backward({.grad_x = Tensor::zeros({0, 3, 4, 4}, stream()),
                      .grad_gamma = grad_gamma,
                      .grad_y = Tensor::zeros({0, 3, 4, 4}, stream()),
                      .x = x,
                      .gamma = gamma,
                      .save_mean = mean,
                      .save_inv_std = m2},
                     stream());
  EXPECT_EQ(host(grad_gamma), (std::vector<float>{5, 5, 5}));
  // Zero channels: nothing at all to do.
  Tensor x0 = Tensor::zeros({4, 0}, stream()), c0 = Tensor::zeros({0}, stream());
  batchnorm_forward_training({.y = Tensor::zeros({4, 0}, stream()),
                              .save_mean = c0,
                              .save_inv_std = c0,
                              .moving_mean = c0,
                              .moving_var = c0,
                              .x = x0,
                              .gamma = c0,
                              .beta = c0,
                              .eps = 1e-3,
                              .momentum = 0.9},
                             stream());
  // Training on an empty batch has no statistics.
  EXPECT_THROW_WITH((batchnorm_forward_training({.y = y,
                                                 .save_mean = mean,
                                                 .save_inv_std = m2,
                                                 .x = x,
                                                 .gamma = gamma,
                                                 .beta = beta,
                                                 .eps = 1e-3,
                                                 .momentum = 0.9},
                                                stream())),
                    InvalidArgument, "at least 2 values per channel");
}

TEST_P(BatchNormTest, RejectsBadArguments) {
  Tensor x = Tensor::zeros({2, 3, 4, 4}, stream()), y = Tensor::zeros({2, 3, 4, 4}, stream());
  Tensor c3 = Tensor::zeros({3}, stream()), c4 = Tensor::zeros({4}, stream());
  // A valid call of each entry point, then one field wrong at a time. Each entry
  // point checks its whole struct itself, so the message names the function the
  // caller called, never a step inside it.
  const BatchNormForwardTraining forward{
      .y = y, .save_mean = c3, .save_inv_std = c3, .x = x, .gamma = c3, .beta = c3};
  batchnorm_forward_training(forward, stream());
  auto training = [&](auto change) {
    BatchNormForwardTraining args = forward;
    change(args);
    batchnorm_forward_training(args, stream());
  };
  EXPECT_THROW_WITH(training([&](auto& a) { a.gamma = c4; }), ShapeError,
                    "batchnorm_forward_training: gamma is float32[4]");
  EXPECT_THROW_WITH(training([&](auto& a) { a.gamma = c4; }), ShapeError,
                    "has 3 channels (expected [3])");
  EXPECT_THROW_WITH(training([&](auto& a) { a.moving_mean = c3; }), InvalidArgument,
                    "batchnorm_forward_training: give both moving_mean and moving_var, or neither");
  EXPECT_THROW_WITH(training([&](auto& a) {
                      a.y = Tensor::zeros({2, 3, 4, 5}, stream());
                    }),
                    ShapeError, "y is float32[2,3,4,5]");
  EXPECT_THROW_WITH(training([&](auto& a) {
                      a.moving_mean = a.moving_var = c3;
                      a.momentum = 1.5;
                    }),
                    InvalidArgument, "batchnorm_forward_training: momentum must be in [0, 1]");
  EXPECT_THROW_WITH(training([&](auto& a) { a.beta = Tensor(); }), InvalidArgument,
                    "batchnorm_forward_training: beta is undefined");

  Tensor x3 = Tensor::zeros({2, 3, 4}, stream());
  EXPECT_THROW_WITH((batchnorm_stats({.mean = c3, .m2 = c3, .x = x3}, stream())), ShapeError,
                    "batchnorm_stats: x must be [N,C] or [N,C,H,W], got float32[2,3,4]");
  const BatchNormForwardFromStats from_stats{
      .y = y, .inv_std = c3, .x = x, .gamma = c3, .beta = c3, .mean = c3, .m2 = c3, .count = 1};
  EXPECT_THROW_WITH(batchnorm_forward_from_stats(from_stats, stream()), InvalidArgument,
                    "got count 1");
  const BatchNormMergeStats merge{
      .mean_a = c3, .m2_a = c3, .count_a = 2, .mean_b = c4, .m2_b = c3, .count_b = 2};
  EXPECT_THROW_WITH(batchnorm_merge_stats(merge, stream()), ShapeError,
                    "batchnorm_merge_stats: mean_b is float32[4]");

  const BatchNormBackward backward{
      .grad_y = y, .x = x, .gamma = c3, .save_mean = c3, .save_inv_std = c3};
  auto gradients = [&](auto change) {
    BatchNormBackward args = backward;
    change(args);
    batchnorm_backward(args, stream());
  };
  EXPECT_THROW_WITH(gradients([&](auto& a) { a.grad_gamma = Tensor::zeros({2}, stream()); }),
                    ShapeError, "batchnorm_backward: grad_gamma is float32[2]");
  EXPECT_THROW_WITH(gradients([&](auto& a) {
                      a.grad_beta = c3;
                      a.grad_y = Tensor::zeros({2, 3, 4, 5}, stream());
                    }),
                    ShapeError, "batchnorm_backward: grad_y is float32[2,3,4,5]");
  EXPECT_THROW_WITH(gradients([&](auto& a) {
                      a.grad_beta = c3;
                      a.activation = Activation::ReLU;
                    }),
                    InvalidArgument,
                    "batchnorm_backward: the ReLU backward needs the forward's gamma and beta");
}

// --- bfloat16 and float16 activations --------------------------------------------
//
// kernels/batchnorm.h: a 16-bit call is the float32 call on the widened tensors, bit
// for bit, its 16-bit outputs rounded once; the per-channel tensors are float32.

class BatchNormSixteenBitTest : public SixteenBitTest {
 protected:
  // The 16-bit tensor of `values` (rounded) and the float32 tensor of its widened values.
  std::pair<Tensor, Tensor> pair(const std::vector<float>& values, const Shape& shape) {
    Tensor t16 = make(values, shape);
    return {t16, make32(host(t16), shape)};
  }
  // t's float32 values rounded to dtype() and widened back: a 16-bit output's expected bits.
  std::vector<float> rounded(const Tensor& t) { return host(cast(t, dtype(), stream())); }
  // The largest relative rounding of dtype(): 2^-8 for bfloat16, 2^-11 for float16.
  double u16() const { return dtype() == DType::BFloat16 ? 0x1p-8 : 0x1p-11; }
};
TL_INSTANTIATE_SIXTEEN_BIT(BatchNormSixteenBitTest);

// Odd planes and channel counts, a plane of float4 units ({2,3,4,4}), planes a
// warp of units or more (CUDA's elementwise passes on the reduction's split:
// {7,3,16,20} in float4s, {4,2,64,65} in floats), [N,C] and more channels than a
// CUDA block keeps coefficients for ({6,1100,2,2}).
const std::vector<Shape> kSixteenBitShapes = {{3, 5, 7, 11},  {5, 7},         {2, 3, 4, 4},
                                              {7, 3, 16, 20}, {4, 2, 64, 65}, {129, 33},
                                              {6, 1100, 2, 2}};

// Training forward (moving statistics too), backward into sentinels (grad_x added
// to, then assigned over) and inference (out of place and in place), with and
// without the fused ReLU: the float32 call's bits on the widened x and grad_y, the
// 16-bit outputs rounded once; without ReLU also within the stated tolerance of
// the plain reference. The control: the float32 call with gamma and beta rounded to
// 16 bits (parameters kept in the activations' dtype) gives other y bits.
TEST_P(BatchNormSixteenBitTest, TrainingAndInferenceAreTheFloat32CallRoundedOnce) {
  for (const Shape& shape : kSixteenBitShapes) {
    const std::int64_t N = shape[0], C = shape[1], S = numel_of(shape) / (N * C);
    const auto n = static_cast<std::size_t>(numel_of(shape));
    const auto [x16, x32] = pair(random_values(n, 61, -2.0f, 3.0f), shape);
    const auto [gy16, gy32] = pair(random_values(n, 62), shape);
    const std::vector<float> gv = random_values(C, 63, 0.5f, 1.5f), bv = random_values(C, 64);
    const std::vector<float> mm0 = random_values(C, 65), mv0 = random_values(C, 66, 0.5f, 2.0f);
    const Tensor gamma = make32(gv, {C}), beta = make32(bv, {C});
    for (const Activation activation : {Activation::None, Activation::ReLU}) {
      const std::string where = to_string(shape) + (activation == Activation::ReLU ? " relu" : "");
      // The same calls on the 16-bit tensors (k = 0) and the widened ones (k = 1).
      BatchNormForwardTraining f[2];
      Tensor grad_x[2], grad_gamma[2], grad_beta[2], assigned[2], inferred[2], in_place[2];
      for (int k = 0; k < 2; ++k) {
        const bool half = k == 0;
        const Tensor& x = half ? x16 : x32;
        const Tensor& grad_y = half ? gy16 : gy32;
        auto like_x = [&](float v) {
          return half ? make(std::vector<float>(n, v), shape)
                      : make32(std::vector<float>(n, v), shape);
        };
        f[k] = training_forward(x, gamma, beta, stream());
        f[k].moving_mean = make32(mm0, {C});
        f[k].moving_var = make32(mv0, {C});
        f[k].momentum = 0.9;
        f[k].activation = activation;
        batchnorm_forward_training(f[k], stream());
        // Sentinels: grad_x 0.5 (exact in 16 bits), grad_gamma -1, grad_beta 2 are added to.
        grad_x[k] = like_x(0.5f);
        grad_gamma[k] = make32(std::vector<float>(C, -1.0f), {C});
        grad_beta[k] = make32(std::vector<float>(C, 2.0f), {C});
        batchnorm_backward(backward_of(f[k], grad_y, grad_x[k], grad_gamma[k], grad_beta[k]),
                           stream());
        assigned[k] = like_x(7.0f);  // overwritten
        BatchNormBackward b = backward_of(f[k], grad_y, assigned[k]);
        b.grad_x_write = GradWrite::Assign;
        batchnorm_backward(b, stream());
        BatchNormForwardInference g{.y = Tensor::empty(shape, stream(), x.dtype()),
                                    .x = x,
                                    .gamma = gamma,
                                    .beta = beta,
                                    .moving_mean = f[k].moving_mean,
                                    .moving_var = f[k].moving_var,
                                    .eps = 1e-3,
                                    .activation = activation};
        batchnorm_forward_inference(g, stream());
        inferred[k] = g.y;
        g.y = g.x = x.clone(stream());  // normalized in place
        batchnorm_forward_inference(g, stream());
        in_place[k] = g.y;
      }
      for (const Tensor* t : {&f[0].y, &grad_x[0], &assigned[0], &inferred[0], &in_place[0]}) {
        ASSERT_EQ(t->dtype(), dtype()) << where;
      }
      EXPECT_EQ(bits(host(f[0].y)), bits(rounded(f[1].y))) << where;
      EXPECT_EQ(bits(host(f[0].save_mean)), bits(host(f[1].save_mean))) << where;
      EXPECT_EQ(bits(host(f[0].save_inv_std)), bits(host(f[1].save_inv_std))) << where;
      EXPECT_EQ(bits(host(f[0].moving_mean)), bits(host(f[1].moving_mean))) << where;
      EXPECT_EQ(bits(host(f[0].moving_var)), bits(host(f[1].moving_var))) << where;
      EXPECT_EQ(bits(host(grad_x[0])), bits(rounded(grad_x[1]))) << where;
      EXPECT_EQ(bits(host(grad_gamma[0])), bits(host(grad_gamma[1]))) << where;
      EXPECT_EQ(bits(host(grad_beta[0])), bits(host(grad_beta[1]))) << where;
      EXPECT_EQ(bits(host(assigned[0])), bits(rounded(assigned[1]))) << where;
      EXPECT_EQ(bits(host(inferred[0])), bits(rounded(inferred[1]))) << where;
      EXPECT_EQ(bits(host(in_place[0])), bits(host(inferred[0]))) << where;
      EXPECT_NE(host(grad_gamma[0]), std::vector<float>(C, -1.0f)) << where;
      if (activation == Activation::ReLU) continue;

      // Against the plain reference on the widened values: the float32 tolerances
      // of MatchesReferenceOnOddShapes, plus u16 relative for a 16-bit output.
      const Reference r = reference(host(x16), gv, bv, host(gy16), N, C, S, 1e-3);
      EXPECT_TRUE(all_close(host(f[0].y), to_float(r.y), 1e-4, 1e-4 + u16())) << where;
      EXPECT_TRUE(all_close(host(f[0].save_mean), to_float(r.mean), 1e-6, 1e-5)) << where;
      EXPECT_TRUE(all_close(host(f[0].save_inv_std), to_float(r.inv_std), 1e-6, 1e-5)) << where;
      EXPECT_TRUE(all_close(host(grad_x[0]), plus(r.grad_x, 0.5f), 1e-4, 1e-3 + u16())) << where;
      EXPECT_TRUE(all_close(host(grad_gamma[0]), plus(r.grad_gamma, -1.0f), 1e-4, 1e-4)) << where;
      EXPECT_TRUE(all_close(host(grad_beta[0]), plus(r.grad_beta, 2.0f), 1e-4, 1e-4)) << where;

      // Control: parameters rounded to 16 bits move some y across a rounding.
      BatchNormForwardTraining c = training_forward(x32, make32(host(make(gv, {C})), {C}),
                                                    make32(host(make(bv, {C})), {C}), stream());
      batchnorm_forward_training(c, stream());
      EXPECT_NE(bits(host(f[0].y)), bits(rounded(c.y))) << where;
    }
  }
}

// The split API (synchronized batch norm) on 16-bit towers, views into one batch:
// the float32 recipe's bits on the widened values, 16-bit y and grad_x rounded once.
TEST_P(BatchNormSixteenBitTest, SplitApiIsTheFloat32RecipeRoundedOnce) {
  // Planes of 15 and of 20 values (CUDA's flat grid), of 32 float4 units (its split).
  for (const std::int64_t W : {5, 32}) {
    for (const std::int64_t H : {3, 4}) {
      const std::int64_t N = 7, C = 3;
      const Shape shape = {N, C, H, W};
      const auto n = static_cast<std::size_t>(numel_of(shape));
      const auto [x16, x32] = pair(random_values(n, 71, 1.0f, 4.0f), shape);
      const auto [gy16, gy32] = pair(random_values(n, 72), shape);
      const Tensor gamma = make32(random_values(C, 73, 0.5f, 1.5f), {C});
      const Tensor beta = make32(random_values(C, 74), {C});
      const std::vector<float> mm0 = {0.5f, -0.5f, 1.0f}, mv0 = {1.0f, 2.0f, 0.5f};
      // grad_x starts at a sentinel of 0.25 (exact in 16 bits): the towers add to it.
      const SplitRun t16 = run_split(x16, gy16, gamma, beta, mm0, mv0, kUnevenTowers,
                                     make(std::vector<float>(n, 0.25f), shape), stream());
      const SplitRun t32 = run_split(x32, gy32, gamma, beta, mm0, mv0, kUnevenTowers,
                                     make32(std::vector<float>(n, 0.25f), shape), stream());
      const std::string where = to_string(shape);
      ASSERT_EQ(t16.y.dtype(), dtype());
      for (auto [a, b] : {std::pair{&t16.mean, &t32.mean},
                          {&t16.m2, &t32.m2},
                          {&t16.inv_std, &t32.inv_std},
                          {&t16.moving_mean, &t32.moving_mean},
                          {&t16.moving_var, &t32.moving_var},
                          {&t16.sum_grad_y, &t32.sum_grad_y},
                          {&t16.sum_grad_y_xhat, &t32.sum_grad_y_xhat}}) {
        ASSERT_EQ(a->dtype(), DType::Float32);
        EXPECT_EQ(bits(host(*a)), bits(host(*b))) << where;
      }
      EXPECT_EQ(bits(host(t16.y)), bits(rounded(t32.y))) << where;
      EXPECT_EQ(bits(host(t16.grad_x)), bits(rounded(t32.grad_x))) << where;
      EXPECT_NE(host(t16.grad_x), std::vector<float>(n, 0.25f)) << where;
    }
  }
}

// ag::batchnorm on a 16-bit x, as a bf16 or fp16 tape runs it (docs/precision.md):
// y in x's dtype, the 16-bit forward kernel's bits; every gradient float32 (the
// policy's, Tape::grad_dtype), the float32 backward kernel's bits on the widened x.
TEST_P(BatchNormSixteenBitTest, AutogradOpKeepsTheActivationsDtypeAndFloat32Gradients) {
  const Shape shape = {4, 3, 5, 5};
  const auto n = static_cast<std::size_t>(numel_of(shape));
  const Tensor x = make(random_values(n, 81, -2.0f, 3.0f), shape);
  const Tensor grad_y = make32(random_values(n, 82), shape);
  const Tensor gamma = make32(random_values(3, 83, 0.5f, 1.5f), {3});
  const Tensor beta = make32(random_values(3, 84), {3});
  Tape tape(stream());
  tape.set_compute_dtype(dtype());
  Tensor grad_x = Tensor::zeros(shape, stream());
  Tensor grad_gamma = Tensor::zeros({3}, stream()), grad_beta = Tensor::zeros({3}, stream());
  const Var xv = tape.variable(x, grad_x, "x");
  const Var gv = tape.variable(gamma, grad_gamma, "gamma");
  const Var bv = tape.variable(beta, grad_beta, "beta");
  const Tensor mm = Tensor::zeros({3}, stream()), mv = make32({1, 1, 1}, {3});
  const Var y = ag::batchnorm(xv, gv, bv, mm, mv, true, 0.9, 1e-3, Activation::ReLU);
  ASSERT_EQ(tape.num_records(), 1u) << "one op: no widening or rounding recorded around it";
  tape.backward(y, grad_y);
  ASSERT_EQ(y.value().dtype(), dtype());

  BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
  f.moving_mean = Tensor::zeros({3}, stream());
  f.moving_var = make32({1, 1, 1}, {3});
  f.momentum = 0.9;
  f.activation = Activation::ReLU;
  batchnorm_forward_training(f, stream());
  f.x = cast(x, DType::Float32, stream());  // the backward reads x widened
  Tensor expected_gx = Tensor::zeros(shape, stream());
  Tensor expected_gg = Tensor::zeros({3}, stream()), expected_gb = Tensor::zeros({3}, stream());
  batchnorm_backward(backward_of(f, grad_y, expected_gx, expected_gg, expected_gb), stream());
  EXPECT_EQ(bits(host(y.value())), bits(host(f.y)));
  EXPECT_EQ(bits(host(mm)), bits(host(f.moving_mean)));
  EXPECT_EQ(bits(host(grad_x)), bits(host(expected_gx)));
  EXPECT_NE(host(grad_x), std::vector<float>(n, 0.0f)) << "control: the gradient arrived";
  EXPECT_EQ(bits(host(grad_gamma)), bits(host(expected_gg)));
  EXPECT_EQ(bits(host(grad_beta)), bits(host(expected_gb)));
}

// Mixed dtypes are typed errors naming the op, the tensor and both dtypes.
TEST_P(BatchNormSixteenBitTest, RejectsMixedDtypes) {
  const std::string d = dtype_name(dtype());
  const Shape shape = {2, 3, 4, 4};
  const Tensor x = make(std::vector<float>(96, 1.0f), shape);
  const Tensor c3 = Tensor::zeros({3}, stream()), c3_16 = make({0, 0, 0}, {3});
  const Tensor y32 = Tensor::zeros(shape, stream());
  const BatchNormForwardTraining forward = training_forward(x, c3, c3, stream());
  batchnorm_forward_training(forward, stream());  // valid
  auto training = [&](auto change) {
    BatchNormForwardTraining args = forward;
    change(args);
    batchnorm_forward_training(args, stream());
  };
  EXPECT_THROW_WITH(training([&](auto& a) { a.gamma = c3_16; }), ShapeError,
                    "batchnorm_forward_training: gamma is " + d + "[3]");
  EXPECT_THROW_WITH(training([&](auto& a) { a.save_mean = c3_16; }), ShapeError,
                    "whose per-channel tensors are float32 (beside 16-bit activations");
  EXPECT_THROW_WITH(training([&](auto& a) { a.y = y32; }), ShapeError,
                    "batchnorm_forward_training: y is float32[2,3,4,4]");
  EXPECT_THROW_WITH(training([&](auto& a) { a.y = y32; }), ShapeError,
                    "but x is " + d + "[2,3,4,4]");
  EXPECT_THROW_WITH(batchnorm_backward(backward_of(forward, x, y32), stream()), ShapeError,
                    "batchnorm_backward: grad_x is float32[2,3,4,4]");
  EXPECT_THROW_WITH(batchnorm_backward(backward_of(forward, y32, Tensor(), c3), stream()),
                    ShapeError, "batchnorm_backward: grad_y is float32[2,3,4,4]");
  EXPECT_THROW_WITH((batchnorm_stats({.mean = c3_16, .m2 = c3, .x = x}, stream())), ShapeError,
                    "batchnorm_stats: mean is " + d + "[3]");
  // Statistics are never 16-bit: the merge does not take them.
  EXPECT_THROW_WITH((batchnorm_merge_stats({.mean_a = c3_16,
                                            .m2_a = c3_16,
                                            .count_a = 2,
                                            .mean_b = c3_16,
                                            .m2_b = c3_16,
                                            .count_b = 2},
                                           stream())),
                    NotSupported, "batchnorm_merge_stats: " + d + " is not supported");
}

// --- gradients in float64 ---------------------------------------------------------

struct DoubleProblem {
  Shape shape;
  Tensor x, gamma, beta, g;
};

DoubleProblem double_problem(const Shape& shape, unsigned seed) {
  const std::int64_t C = shape[1];
  return {shape, random_double_tensor(shape, seed, -1.0, 2.0),
          random_double_tensor({C}, seed + 1, 0.5, 1.5), random_double_tensor({C}, seed + 2),
          random_double_tensor(shape, seed + 3)};
}

void check_training_gradient(const Shape& shape, unsigned seed) {
  const Stream& cpu = default_stream(Device::cpu());
  DoubleProblem p = double_problem(shape, seed);
  const std::int64_t C = shape[1];
  auto forward = [&](const std::vector<Tensor>& in) {
    const BatchNormForwardTraining f = training_forward(in[0], in[1], in[2], cpu);
    batchnorm_forward_training(f, cpu);
    return f;
  };
  auto loss = [&](const std::vector<Tensor>& in) { return weighted_sum(p.g, forward(in).y); };
  const BatchNormForwardTraining f = forward({p.x, p.gamma, p.beta});
  Tensor grad_x = Tensor::zeros(shape, cpu, DType::Float64);
  Tensor grad_gamma = Tensor::zeros({C}, cpu, DType::Float64);
  Tensor grad_beta = Tensor::zeros({C}, cpu, DType::Float64);
  batchnorm_backward(backward_of(f, p.g, grad_x, grad_gamma, grad_beta), cpu);
  GradcheckOptions options;
  options.atol = 1e-5;
  options.rtol = 1e-4;
  EXPECT_TRUE(
      check_gradient(loss, {p.x, p.gamma, p.beta}, {grad_x, grad_gamma, grad_beta}, options))
      << to_string(shape);
}

TEST(BatchNormGradient, TrainingMatchesCentralDifferences) {
  check_training_gradient({3, 2, 3, 2}, 20);
  check_training_gradient({5, 3}, 30);  // fully connected
}

TEST(BatchNormGradient, SplitBackwardMatchesCentralDifferences) {
  // The split backward with all-reduced sums is the gradient of the whole batch
  // with respect to one tower's rows.
  const Stream& cpu = default_stream(Device::cpu());
  const Shape shape = {4, 2, 2, 3};
  DoubleProblem p = double_problem(shape, 40);
  Tensor mean = Tensor::empty({2}, cpu, DType::Float64),
         m2 = Tensor::empty({2}, cpu, DType::Float64);
  Tensor inv_std = Tensor::empty({2}, cpu, DType::Float64);
  auto loss = [&](const std::vector<Tensor>& in) {
    Tensor y = Tensor::empty(shape, cpu, DType::Float64);
    batchnorm_stats({.mean = mean, .m2 = m2, .x = in[0]}, cpu);
    batchnorm_forward_from_stats({.y = y,
                                  .inv_std = inv_std,
                                  .x = in[0],
                                  .gamma = p.gamma,
                                  .beta = p.beta,
                                  .mean = mean,
                                  .m2 = m2,
                                  .count = 24,
                                  .eps = 1e-3,
                                  .momentum = 0.9},
                                 cpu);
    return weighted_sum(p.g, y);
  };
  loss({p.x});
  Tensor sum_gy = Tensor::zeros({2}, cpu, DType::Float64);
  Tensor sum_gy_xhat = Tensor::zeros({2}, cpu, DType::Float64);
  for (std::int64_t begin : {0, 1}) {  // towers: row 0, rows 1..3
    const std::int64_t end = begin == 0 ? 1 : 4;
    Tensor a = Tensor::empty({2}, cpu, DType::Float64), b = Tensor::empty({2}, cpu, DType::Float64);
    batchnorm_backward_reduce({.sum_grad_y = a,
                               .sum_grad_y_xhat = b,
                               .grad_y = p.g.slice(begin, end),
                               .x = p.x.slice(begin, end),
                               .mean = mean,
                               .inv_std = inv_std},
                              cpu);
    add(sum_gy, sum_gy, a, cpu);
    add(sum_gy_xhat, sum_gy_xhat, b, cpu);
  }
  Tensor grad_x = Tensor::zeros(shape, cpu, DType::Float64);
  for (auto [begin, end] : {std::pair{1, 4}, std::pair{0, 1}}) {  // the towers in either order
    batchnorm_backward_apply({.grad_x = grad_x.slice(begin, end),
                              .grad_y = p.g.slice(begin, end),
                              .x = p.x.slice(begin, end),
                              .gamma = p.gamma,
                              .mean = mean,
                              .inv_std = inv_std,
                              .sum_grad_y = sum_gy,
                              .sum_grad_y_xhat = sum_gy_xhat,
                              .count = 24},
                             cpu);
  }
  GradcheckOptions options;
  options.atol = 1e-5;
  options.rtol = 1e-4;
  EXPECT_TRUE(check_gradient(loss, {p.x}, {grad_x}, options));
}

// CUDA against the CPU on larger odd shapes (skips without a GPU).
TEST(BatchNormCudaVsCpu, TrainingForwardAndBackward) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // Planes in float4s (S % 4 == 0) and in floats; more channels (1100) than a block
  // of the elementwise kernels keeps coefficients for; planes of a warp's worth of
  // units or more (the elementwise passes on the reduction's split, walked
  // backwards) whose channel ranges end mid-row: 7*320/4 and 5*143 units.
  for (const Shape& shape : std::vector<Shape>{{128, 32, 28, 28},
                                               {9, 5, 4, 6},
                                               {31, 7, 13, 17},
                                               {1000, 37},
                                               {6, 1100, 2, 2},
                                               {7, 3, 16, 20},
                                               {5, 2, 11, 13}}) {
    const std::int64_t C = shape[1];
    const auto n = static_cast<std::size_t>(numel_of(shape));
    auto xv = random_values(n, 50, 100.0f, 104.0f), gyv = random_values(n, 51);
    auto gv = random_values(C, 52, 0.5f, 1.5f), bv = random_values(C, 53);
    std::vector<std::vector<float>> results[2];
    for (int k = 0; k < 2; ++k) {
      Stream stream(k == 0 ? Device::cpu() : Device::cuda(0));
      auto up = [&](const std::vector<float>& v, const Shape& s) {
        return Tensor::from_host<float>(v, s, stream);
      };
      Tensor x = up(xv, shape), grad_y = up(gyv, shape), gamma = up(gv, {C}), beta = up(bv, {C});
      BatchNormForwardTraining f = training_forward(x, gamma, beta, stream);
      f.moving_mean = Tensor::zeros({C}, stream);
      f.moving_var = Tensor::zeros({C}, stream);
      f.eps = 1e-5;
      f.momentum = 0.9;
      batchnorm_forward_training(f, stream);
      Tensor grad_x = Tensor::zeros(shape, stream), grad_gamma = Tensor::zeros({C}, stream),
             grad_beta = Tensor::zeros({C}, stream);
      batchnorm_backward(backward_of(f, grad_y, grad_x, grad_gamma, grad_beta), stream);
      Tensor inferred = Tensor::empty(shape, stream);
      batchnorm_forward_inference({.y = inferred,
                                   .x = x,
                                   .gamma = gamma,
                                   .beta = beta,
                                   .moving_mean = f.moving_mean,
                                   .moving_var = f.moving_var,
                                   .eps = 1e-5},
                                  stream);
      for (const Tensor* t : {&f.y, &f.save_mean, &f.save_inv_std, &f.moving_mean, &f.moving_var,
                              &grad_x, &grad_gamma, &grad_beta, &inferred}) {
        results[k].push_back(t->to_host<float>(stream));
      }
    }
    const char* names[] = {"y",      "mean",       "inv_std",   "moving_mean", "moving_var",
                           "grad_x", "grad_gamma", "grad_beta", "inference y"};
    for (std::size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(all_close(results[1][i], results[0][i], 1e-3, 1e-3))
          << names[i] << " on " << to_string(shape);
    }
  }
}

}  // namespace
}  // namespace towerlab::testing
