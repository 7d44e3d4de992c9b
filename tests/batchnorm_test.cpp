// Batch normalization on every backend: hand-computed numbers, a plain reference
// on odd shapes, the split (synchronized) API against the single call, large-mean
// stability, accumulation, errors, and gradients in float64. The bfloat16 and
// float16 activations are batchnorm_sixteen_bit_test.cpp's.
#include <cmath>

#include "batchnorm_args.h"
#include "batchnorm_case.h"
#include "gradcheck.h"
#include "kernels/batchnorm.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class BatchNormTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(BatchNormTest);

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
    const BatchNormReference r = batchnorm_reference(xv, gv, bv, gyv, N, C, S, 1e-3);
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
  const BatchNormReference r = batchnorm_reference(xv, ones, zeros, xv, N, C, S, 0.0);

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
