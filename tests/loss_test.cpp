// Losses (kernels/loss.h) on every backend: hand-computed values, a double
// reference on odd sizes, large logits, bad labels, bad shapes, empty batches, and
// every backward gradient-checked in float64.
#include <cmath>
#include <limits>

#include "autograd/losses.h"
#include "gradcheck.h"
#include "kernels/loss.h"
#include "kernels/reference/loss.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class LossTest : public BackendTest {
 protected:
  float scalar(const Tensor& t) { return host(t).at(0); }
};
TL_INSTANTIATE_BACKENDS(LossTest);

// --- mean squared error -------------------------------------------------------

TEST_P(LossTest, MseForwardMeanAndSum) {
  Tensor pred = make({1, 2, 3, 4}, {2, 2});
  Tensor target = make({0, 2, 5, 1}, {2, 2});  // differences 1, 0, -2, 3: squares sum to 14
  Tensor loss = make({-7}, {1});
  mse_forward(loss, pred, target, Reduction::Mean, stream());
  EXPECT_FLOAT_EQ(scalar(loss), 3.5f);
  mse_forward(loss, pred, target, Reduction::Sum, stream());
  EXPECT_FLOAT_EQ(scalar(loss), 14.0f);
}

TEST_P(LossTest, MseBackwardAccumulatesScaledByGradLoss) {
  Tensor pred = make({1, 2, 3, 4}, {2, 2});
  Tensor target = make({0, 2, 5, 1}, {2, 2});
  Tensor grad_loss = make({0.5f}, {1});
  Tensor grad_pred = make({1, 1, 1, 1}, {2, 2});    // sentinel: must be added to
  Tensor grad_target = make({1, 1, 1, 1}, {2, 2});  // sentinel
  // Mean: 0.5 * 2 * diff / 4 = 0.25 * {1, 0, -2, 3}.
  mse_backward(grad_pred, grad_target, grad_loss, pred, target, Reduction::Mean, stream());
  EXPECT_EQ(host(grad_pred), (std::vector<float>{1.25f, 1.0f, 0.5f, 1.75f}));
  EXPECT_EQ(host(grad_target), (std::vector<float>{0.75f, 1.0f, 1.5f, 0.25f}));
  // Sum: 0.5 * 2 * diff = {1, 0, -2, 3}; only grad_pred requested.
  mse_backward(grad_pred, Tensor(), grad_loss, pred, target, Reduction::Sum, stream());
  EXPECT_EQ(host(grad_pred), (std::vector<float>{2.25f, 1.0f, -1.5f, 4.75f}));
  EXPECT_EQ(host(grad_target), (std::vector<float>{0.75f, 1.0f, 1.5f, 0.25f}));
  mse_backward(Tensor(), Tensor(), grad_loss, pred, target, Reduction::Sum, stream());  // no-op
}

TEST_P(LossTest, MseMatchesDoubleReferenceOnOddSizes) {
  for (std::int64_t n : {1, 7, 257, 1000003}) {
    auto p = random_values(static_cast<std::size_t>(n), 21);
    auto t = random_values(static_cast<std::size_t>(n), 22);
    const double total = reference::squared_error_sum(p.data(), t.data(), n);
    Tensor pred = make(p, {n}), target = make(t, {n}), loss = make({0}, {1});
    mse_forward(loss, pred, target, Reduction::Mean, stream());
    EXPECT_NEAR(scalar(loss), total / static_cast<double>(n), 1e-5 * total / n) << "n = " << n;
    Tensor grad_pred = Tensor::zeros({n}, stream());
    mse_backward(grad_pred, Tensor(), make({1.0f}, {1}), pred, target, Reduction::Sum, stream());
    std::vector<float> expected(p.size());
    reference::mse_backward(expected.data(), static_cast<float*>(nullptr), p.data(), t.data(), 2.0f,
                            n);
    EXPECT_TRUE(all_close(host(grad_pred), expected)) << "n = " << n;
  }
}

TEST_P(LossTest, MseOfEmptyTensorsIsZero) {
  Tensor pred = Tensor::zeros({0, 3}, stream()), target = Tensor::zeros({0, 3}, stream());
  Tensor loss = make({7}, {1});
  mse_forward(loss, pred, target, Reduction::Mean, stream());
  EXPECT_EQ(scalar(loss), 0.0f);
  Tensor grad_pred = Tensor::zeros({0, 3}, stream());
  mse_backward(grad_pred, Tensor(), make({1}, {1}), pred, target, Reduction::Mean, stream());
}

TEST_P(LossTest, MseRejectsBadShapes) {
  Tensor pred = Tensor::zeros({2, 3}, stream()), target = Tensor::zeros({3, 2}, stream());
  Tensor loss = Tensor::zeros({1}, stream());
  EXPECT_THROW_WITH(mse_forward(loss, pred, target, Reduction::Mean, stream()), ShapeError,
                    "mse_forward: target is float32[3,2]");
  EXPECT_THROW_WITH(
      mse_forward(Tensor::zeros({2}, stream()), pred, pred, Reduction::Mean, stream()), ShapeError,
      "mse_forward: loss must have one element, got float32[2]");
  EXPECT_THROW_WITH(mse_backward(Tensor::zeros({6}, stream()), Tensor(), loss, pred, pred,
                                 Reduction::Mean, stream()),
                    ShapeError, "mse_backward: grad_pred is float32[6]");
  EXPECT_THROW_WITH(mse_backward(Tensor::zeros({2, 3}, stream()), Tensor(), Tensor(), pred, pred,
                                 Reduction::Mean, stream()),
                    InvalidArgument, "mse_backward: grad_loss is undefined");
}

// --- softmax cross-entropy ----------------------------------------------------

// Row 0: logits {1, 2, 3}, label 2: log(e + e^2 + e^3) - 3 = 0.40760596.
// Row 1: logits {0, 0, 0}, label 0: log 3 = 1.09861229.
TEST_P(LossTest, CrossEntropyForwardByHand) {
  Tensor logits = make({1, 2, 3, 0, 0, 0}, {2, 3});
  Tensor labels = make({2, 0}, {2});
  Tensor loss = make({-7}, {1});
  Tensor probs = Tensor::zeros({2, 3}, stream());
  Tensor predictions = Tensor::zeros({2}, stream());
  softmax_cross_entropy_forward(loss, probs, predictions, logits, labels, Reduction::Mean,
                                stream());
  EXPECT_NEAR(scalar(loss), 0.75310913f, 1e-6);
  EXPECT_TRUE(all_close(host(probs),
                        {0.09003057f, 0.24472847f, 0.66524096f, 1.0f / 3, 1.0f / 3, 1.0f / 3}));
  EXPECT_EQ(host(predictions), (std::vector<float>{2, 0}));  // a tie takes the first class
  softmax_cross_entropy_forward(loss, Tensor(), Tensor(), logits, labels, Reduction::Sum, stream());
  EXPECT_NEAR(scalar(loss), 1.50621825f, 2e-6);
}

TEST_P(LossTest, CrossEntropyBackwardAccumulatesSoftmaxMinusOneHot) {
  Tensor logits = make({1, 2, 3, 0, 0, 0}, {2, 3});
  Tensor labels = make({2, 0}, {2});
  Tensor grad = make({1, 1, 1, 1, 1, 1}, {2, 3});  // sentinel
  // grad_loss 2 and the mean over 2 rows: the factor is 1.
  softmax_cross_entropy_backward(grad, make({2}, {1}), logits, labels, Reduction::Mean, stream());
  EXPECT_TRUE(all_close(host(grad), {1.09003057f, 1.24472847f, 1.0f + 0.66524096f - 1.0f,
                                     1.0f + 1.0f / 3 - 1.0f, 1.0f + 1.0f / 3, 1.0f + 1.0f / 3}));
  softmax_cross_entropy_backward(Tensor(), make({2}, {1}), logits, labels, Reduction::Mean,
                                 stream());  // nothing requested: a no-op
}

TEST_P(LossTest, CrossEntropyStaysFiniteForLargeLogits) {
  // Row 0 is row {0, -1, -2} shifted by 1e4; row 1 puts 1e4 on a wrong class.
  Tensor logits = make({1e4f, 1e4f - 1, 1e4f - 2, -1e4f, 0, 1e4f}, {2, 3});
  Tensor labels = make({0, 1}, {2});
  Tensor loss = Tensor::zeros({1}, stream());
  softmax_cross_entropy_forward(loss, Tensor(), Tensor(), logits, labels, Reduction::Sum, stream());
  EXPECT_NEAR(scalar(loss), 0.40760596 + 1e4, 1e-3);
  Tensor grad = Tensor::zeros({2, 3}, stream());
  softmax_cross_entropy_backward(grad, make({1}, {1}), logits, labels, Reduction::Sum, stream());
  EXPECT_TRUE(all_close(host(grad), {0.66524096f - 1, 0.24472847f, 0.09003057f, 0, -1, 1}));
}

TEST_P(LossTest, CrossEntropyMatchesDoubleReferenceOnOddShapes) {
  struct Case {
    std::int64_t rows, classes;
  };
  // CUDA caches rows of K % 4 == 0, K <= 1024 in registers: 4, 1000 and 1024 take
  // that path, 1028 and the others the general one.
  for (Case c : {Case{1, 1}, Case{3, 7}, Case{37, 33}, Case{128, 10}, Case{6, 4}, Case{257, 1000},
                 Case{5, 1024}, Case{9, 1028}}) {
    const std::int64_t N = c.rows, K = c.classes;
    auto x = random_values(static_cast<std::size_t>(N * K), 31, -5.0f, 5.0f);
    auto u = random_values(static_cast<std::size_t>(N), 32, 0.0f, 1.0f);
    std::vector<float> y(u.size());
    for (std::size_t n = 0; n < u.size(); ++n) {
      y[n] = std::min(std::floor(u[n] * static_cast<float>(K)), static_cast<float>(K - 1));
    }
    // The reference (kernels/reference/loss.h), in double: loss, probs, argmax and
    // the gradient for grad_loss 1.5 onto the sentinel 0.5.
    const std::vector<double> x64(x.begin(), x.end()), y64(y.begin(), y.end());
    std::vector<double> probs64(x.size()), argmax64(y.size()), grad64(x.size(), 0.5);
    const double total = reference::softmax_cross_entropy_forward(
        probs64.data(), argmax64.data(), x64.data(), y64.data(), N, K, 0.0);
    reference::softmax_cross_entropy_backward(grad64.data(), x64.data(), y64.data(), 1.5 / N, N, K,
                                              0.0);
    const std::vector<float> probs(probs64.begin(), probs64.end()),
        argmax(argmax64.begin(), argmax64.end()), grad(grad64.begin(), grad64.end());
    Tensor logits = make(x, {N, K}), labels = make(y, {N}), loss = Tensor::zeros({1}, stream());
    Tensor p = Tensor::zeros({N, K}, stream()), pred = Tensor::zeros({N}, stream());
    softmax_cross_entropy_forward(loss, p, pred, logits, labels, Reduction::Mean, stream());
    EXPECT_NEAR(scalar(loss), total / N, 1e-5 * (1 + total / N)) << N << "x" << K;
    EXPECT_TRUE(all_close(host(p), probs)) << N << "x" << K;
    EXPECT_EQ(host(pred), argmax) << N << "x" << K;
    // Without predictions (CUDA's cached rows then take the maximum alone), and
    // with neither output: the same loss and probabilities.
    Tensor loss2 = Tensor::zeros({1}, stream()), p2 = Tensor::zeros({N, K}, stream());
    softmax_cross_entropy_forward(loss2, p2, Tensor(), logits, labels, Reduction::Mean, stream());
    EXPECT_NEAR(scalar(loss2), total / N, 1e-5 * (1 + total / N)) << N << "x" << K;
    EXPECT_TRUE(all_close(host(p2), probs)) << N << "x" << K;
    softmax_cross_entropy_forward(loss2, Tensor(), Tensor(), logits, labels, Reduction::Mean,
                                  stream());
    EXPECT_NEAR(scalar(loss2), total / N, 1e-5 * (1 + total / N)) << N << "x" << K;
    Tensor g = make(std::vector<float>(x.size(), 0.5f), {N, K});
    softmax_cross_entropy_backward(g, make({1.5f}, {1}), logits, labels, Reduction::Mean, stream());
    EXPECT_TRUE(all_close(host(g), grad)) << N << "x" << K;
  }
}

// The backward from given probabilities against a double reference, on rows CUDA
// takes in float4s (K % 4 == 0, aligned), a misaligned view of them, and rows of
// odd K; a bad label makes its row NaN (on CUDA; the CPU throws) and no other.
TEST_P(LossTest, CrossEntropyBackwardFromProbsMatchesReference) {
  for (std::int64_t K : {12, 1000, 10}) {
    for (std::int64_t offset : {0, 1}) {
      const std::int64_t N = 37;
      const auto p = random_values(static_cast<std::size_t>(N * K), 41, 0.0f, 1.0f);
      const auto sentinel = random_values(static_cast<std::size_t>(N * K), 42);
      std::vector<float> y;
      for (std::int64_t n = 0; n < N; ++n) y.push_back(static_cast<float>((n * 7) % K));
      const std::vector<double> p64(p.begin(), p.end()), y64(y.begin(), y.end());
      std::vector<double> expected64(sentinel.begin(), sentinel.end());
      reference::softmax_cross_entropy_backward_from_probs(expected64.data(), p64.data(),
                                                           y64.data(), 1.5 / N, N, K, 0.0);
      const std::vector<float> expected(expected64.begin(), expected64.end());
      std::vector<float> p_padded(static_cast<std::size_t>(offset), 0.0f),
          g_padded(static_cast<std::size_t>(offset), 0.0f);
      p_padded.insert(p_padded.end(), p.begin(), p.end());
      g_padded.insert(g_padded.end(), sentinel.begin(), sentinel.end());
      const std::int64_t size = offset + N * K;
      Tensor probs = make(p_padded, {size}).view(offset, {N, K});
      Tensor grad = make(g_padded, {size}).view(offset, {N, K});
      softmax_cross_entropy_backward_from_probs(grad, make({1.5f}, {1}), probs, make(y, {N}),
                                                Reduction::Mean, stream());
      EXPECT_TRUE(all_close(host(grad), expected)) << "K " << K << ", offset " << offset;
      if (device().is_cpu()) continue;
      y[3] = static_cast<float>(K);  // not a class id: row 3 becomes NaN
      Tensor bad = make(sentinel, {N, K});
      softmax_cross_entropy_backward_from_probs(bad, make({1.5f}, {1}), make(p, {N, K}),
                                                make(y, {N}), Reduction::Mean, stream());
      const auto b = host(bad);
      for (std::int64_t i = 0; i < N * K; ++i) {
        EXPECT_EQ(std::isnan(b[static_cast<std::size_t>(i)]), i / K == 3)
            << "K " << K << ", element " << i;
      }
    }
  }
}

// Label smoothing (kernels/loss.h, eps): the reference against the definition
// sum_k t[n,k] * (logsumexp - x[n,k]) written out here, then every backend's forward
// (with and without predictions), recomputing backward and backward from probs
// against the reference, onto sentinels, on rows CUDA caches (K = 4, 12, 1024) and
// rows it does not (7, 33, 1028). A control: eps moves the loss.
TEST_P(LossTest, LabelSmoothingMatchesReference) {
  struct Case {
    std::int64_t rows, classes;
  };
  for (Case c : {Case{3, 7}, Case{37, 33}, Case{6, 4}, Case{9, 12}, Case{5, 1024}, Case{3, 1028}}) {
    const std::int64_t N = c.rows, K = c.classes;
    const auto x = random_values(static_cast<std::size_t>(N * K), 33, -5.0f, 5.0f);
    std::vector<float> y;
    for (std::int64_t n = 0; n < N; ++n) y.push_back(static_cast<float>((n * 5 + 2) % K));
    const std::vector<double> x64(x.begin(), x.end()), y64(y.begin(), y.end());
    for (const double eps : {0.1, 0.6, 1.0}) {
      SCOPED_TRACE(::testing::Message() << N << "x" << K << " eps " << eps);
      std::vector<double> probs64(x.size());
      const double total = reference::softmax_cross_entropy_forward(
          probs64.data(), static_cast<double*>(nullptr), x64.data(), y64.data(), N, K, eps);
      double defined = 0.0;  // the definition, in long double
      for (std::int64_t n = 0; n < N; ++n) {
        long double max = x64[n * K], sum = 0;
        for (std::int64_t k = 0; k < K; ++k) max = std::max<long double>(max, x64[n * K + k]);
        for (std::int64_t k = 0; k < K; ++k) sum += std::exp(x64[n * K + k] - max);
        for (std::int64_t k = 0; k < K; ++k) {
          const long double t = (k == std::int64_t(y64[n]) ? 1 - eps : 0) + eps / K;
          defined += double(t * (std::log(sum) + max - x64[n * K + k]));
        }
      }
      EXPECT_NEAR(total, defined, 1e-9 * (1 + std::fabs(defined)));
      const double unsmoothed = reference::softmax_cross_entropy_forward(
          static_cast<double*>(nullptr), static_cast<double*>(nullptr), x64.data(), y64.data(), N,
          K, 0.0);
      EXPECT_GT(std::fabs(total - unsmoothed), 1e-3 * N) << "control: eps changes nothing";

      Tensor logits = make(x, {N, K}), labels = make(y, {N});
      for (const bool with_predictions : {true, false}) {
        Tensor loss = Tensor::zeros({1}, stream()), p = Tensor::zeros({N, K}, stream());
        softmax_cross_entropy_forward(loss, p,
                                      with_predictions ? Tensor::zeros({N}, stream()) : Tensor(),
                                      logits, labels, Reduction::Mean, stream(), eps);
        EXPECT_NEAR(scalar(loss), total / N, 1e-5 * (1 + total / N));
        EXPECT_TRUE(all_close(host(p), std::vector<float>(probs64.begin(), probs64.end())));
      }
      std::vector<double> grad64(x.size(), 0.5), from_probs64(x.size(), 0.5);
      reference::softmax_cross_entropy_backward(grad64.data(), x64.data(), y64.data(), 1.5 / N, N,
                                                K, eps);
      reference::softmax_cross_entropy_backward_from_probs(from_probs64.data(), probs64.data(),
                                                           y64.data(), 1.5 / N, N, K, eps);
      Tensor g = make(std::vector<float>(x.size(), 0.5f), {N, K});
      softmax_cross_entropy_backward(g, make({1.5f}, {1}), logits, labels, Reduction::Mean,
                                     stream(), eps);
      EXPECT_TRUE(all_close(host(g), std::vector<float>(grad64.begin(), grad64.end())));
      const std::vector<float> pv(probs64.begin(), probs64.end());
      Tensor g2 = make(std::vector<float>(x.size(), 0.5f), {N, K});
      softmax_cross_entropy_backward_from_probs(g2, make({1.5f}, {1}), make(pv, {N, K}), labels,
                                                Reduction::Mean, stream(), eps);
      EXPECT_TRUE(
          all_close(host(g2), std::vector<float>(from_probs64.begin(), from_probs64.end())));
    }
  }
}

TEST_P(LossTest, LabelSmoothingOutsideZeroToOneIsRefused) {
  Tensor logits = make({1, 2, 3, 4}, {2, 2}), labels = make({0, 1}, {2});
  Tensor loss = Tensor::zeros({1}, stream()), grad = Tensor::zeros({2, 2}, stream());
  for (const double eps : {-0.1, 1.5, std::nan("")}) {
    EXPECT_THROW_WITH(softmax_cross_entropy_forward(loss, Tensor(), Tensor(), logits, labels,
                                                    Reduction::Mean, stream(), eps),
                      InvalidArgument,
                      "softmax_cross_entropy_forward: label_smoothing must be in [0, 1], got");
    EXPECT_THROW_WITH(softmax_cross_entropy_backward(grad, make({1}, {1}), logits, labels,
                                                     Reduction::Mean, stream(), eps),
                      InvalidArgument,
                      "softmax_cross_entropy_backward: label_smoothing must be in [0, 1]");
  }
}

TEST_P(LossTest, CrossEntropyBadLabel) {
  Tensor logits = make({1, 2, 3, 0, 0, 0}, {2, 3});
  Tensor labels = make({0, 3}, {2});
  Tensor loss = Tensor::zeros({1}, stream());
  Tensor grad = Tensor::zeros({2, 3}, stream());
  Tensor one = make({1}, {1});
  if (device().is_cpu()) {
    EXPECT_THROW_WITH(softmax_cross_entropy_forward(loss, Tensor(), Tensor(), logits, labels,
                                                    Reduction::Mean, stream()),
                      InvalidArgument,
                      "softmax_cross_entropy_forward: labels[1] = 3 is not a class id in [0, 3)");
    EXPECT_THROW_WITH(
        softmax_cross_entropy_backward(grad, one, logits, labels, Reduction::Mean, stream()),
        InvalidArgument, "softmax_cross_entropy_backward: labels[1] = 3 is not a class id");
  } else {
    // No host sync on CUDA: the loss and the bad row's gradient are NaN, nothing is read
    // out of bounds, and the good row is untouched.
    softmax_cross_entropy_forward(loss, Tensor(), Tensor(), logits, labels, Reduction::Mean,
                                  stream());
    EXPECT_TRUE(std::isnan(scalar(loss)));
    softmax_cross_entropy_backward(grad, one, logits, labels, Reduction::Mean, stream());
    auto g = host(grad);
    EXPECT_FALSE(std::isnan(g[0]) || std::isnan(g[1]) || std::isnan(g[2]));
    EXPECT_TRUE(std::isnan(g[3]) && std::isnan(g[4]) && std::isnan(g[5]));
  }
  EXPECT_THROW_WITH(validate_labels(labels, 3, stream()), InvalidArgument,
                    "validate_labels: labels[1] = 3 is not a class id in [0, 3)");
  EXPECT_THROW_WITH(validate_labels(make({0, 1, -1, 2}, {4}), 3, stream()), InvalidArgument,
                    "labels[2] = -1 is not a class id");
  EXPECT_THROW_WITH(validate_labels(make({0, 1.5f}, {2}), 3, stream()), InvalidArgument,
                    "labels[1] = 1.5 is not a class id");
  EXPECT_THROW_WITH(
      validate_labels(make({2, std::numeric_limits<float>::quiet_NaN()}, {2}), 3, stream()),
      InvalidArgument, "labels[1] = nan is not a class id");
  validate_labels(make({0, 2, 1}, {3}), 3, stream());  // valid: no throw
}

TEST_P(LossTest, CrossEntropyRejectsBadShapes) {
  Tensor loss = Tensor::zeros({1}, stream());
  Tensor logits = Tensor::zeros({2, 5}, stream());
  auto forward = [&](const Tensor& x, const Tensor& y, const Tensor& probs) {
    softmax_cross_entropy_forward(loss, probs, Tensor(), x, y, Reduction::Mean, stream());
  };
  EXPECT_THROW_WITH(forward(Tensor::zeros({10}, stream()), Tensor::zeros({10}, stream()), Tensor()),
                    ShapeError,
                    "softmax_cross_entropy_forward: logits must be [N,K] (rows, classes), got "
                    "float32[10]");
  EXPECT_THROW_WITH(forward(logits, Tensor::zeros({3}, stream()), Tensor()), ShapeError,
                    "labels is float32[3]");
  EXPECT_THROW_WITH(forward(logits, Tensor::zeros({3}, stream()), Tensor()), ShapeError,
                    "needs labels [2], one class id per row");
  EXPECT_THROW_WITH(forward(logits, Tensor::zeros({2}, stream()), Tensor::zeros({5, 2}, stream())),
                    ShapeError, "probs is float32[5,2]");
  EXPECT_THROW_WITH(
      forward(Tensor::zeros({2, 0}, stream()), Tensor::zeros({2}, stream()), Tensor()), ShapeError,
      "has no classes (K = 0)");
  EXPECT_THROW_WITH(softmax_cross_entropy_backward(
                        Tensor::zeros({5, 2}, stream()), Tensor::zeros({1}, stream()), logits,
                        Tensor::zeros({2}, stream()), Reduction::Mean, stream()),
                    ShapeError, "softmax_cross_entropy_backward: grad_logits is float32[5,2]");
}

TEST_P(LossTest, CrossEntropyOfEmptyBatchIsZero) {
  Tensor logits = Tensor::zeros({0, 10}, stream()), labels = Tensor::zeros({0}, stream());
  Tensor loss = make({7}, {1});
  softmax_cross_entropy_forward(loss, Tensor::zeros({0, 10}, stream()),
                                Tensor::zeros({0}, stream()), logits, labels, Reduction::Mean,
                                stream());
  EXPECT_EQ(scalar(loss), 0.0f);
  softmax_cross_entropy_backward(Tensor::zeros({0, 10}, stream()), make({1}, {1}), logits, labels,
                                 Reduction::Mean, stream());
}

// --- L2 regularization --------------------------------------------------------

TEST_P(LossTest, L2ForwardAndBackwardByHand) {
  Tensor w = make({1, -2, 3}, {3});
  Tensor loss = make({-7}, {1});
  l2_loss_forward(loss, w, 0.1, stream());  // 0.1 * 14 / 2
  EXPECT_FLOAT_EQ(scalar(loss), 0.7f);
  Tensor grad_w = make({1, 1, 1}, {3});  // sentinel
  l2_loss_backward(grad_w, make({2}, {1}), w, 0.1, stream());
  EXPECT_TRUE(all_close(host(grad_w), {1.2f, 0.6f, 1.6f}));
  l2_loss_backward(Tensor(), make({2}, {1}), w, 0.1, stream());  // nothing requested
}

TEST_P(LossTest, L2MatchesDoubleReferenceOnOddSizes) {
  for (std::int64_t n : {0, 1, 7, 1000003}) {
    auto v = random_values(static_cast<std::size_t>(n), 41);
    const double total = reference::square_sum(v.data(), n);
    Tensor loss = make({7}, {1});
    l2_loss_forward(loss, make(v, {n}), 2.0, stream());
    EXPECT_NEAR(scalar(loss), total, 1e-5 * total) << "n = " << n;
  }
}

TEST_P(LossTest, L2RejectsBadArguments) {
  Tensor w = Tensor::zeros({3}, stream()), loss = Tensor::zeros({1}, stream());
  EXPECT_THROW_WITH(l2_loss_forward(loss, w, std::nan(""), stream()), InvalidArgument,
                    "l2_loss_forward: coeff must be finite, got nan");
  EXPECT_THROW_WITH(l2_loss_backward(Tensor::zeros({4}, stream()), loss, w, 1.0, stream()),
                    ShapeError, "l2_loss_backward: grad_w is float32[4]");
  EXPECT_THROW_WITH(l2_loss_forward(Tensor::zeros({1, 2}, stream()), w, 1.0, stream()), ShapeError,
                    "l2_loss_forward: loss must have one element, got float32[1,2]");
}

// --- gradients in float64 -----------------------------------------------------

const Stream& cpu_stream() {
  return default_stream(Device::cpu());
}

Tensor double_scalar(double value) {
  return Tensor::from_host<double>(std::vector<double>{value}, {1}, cpu_stream());
}

double value_of(const Tensor& t) {
  return t.data<double>()[0];
}

TEST(LossGradient, MseMatchesCentralDifferences) {
  for (Reduction reduction : {Reduction::Mean, Reduction::Sum}) {
    Tensor pred = random_double_tensor({3, 4}, 51), target = random_double_tensor({3, 4}, 52);
    const double upstream = 0.7;
    auto loss = [&](const std::vector<Tensor>& in) {
      Tensor out = double_scalar(0);
      mse_forward(out, in[0], in[1], reduction, cpu_stream());
      return upstream * value_of(out);
    };
    Tensor grad_pred = Tensor::zeros({3, 4}, cpu_stream(), DType::Float64);
    Tensor grad_target = Tensor::zeros({3, 4}, cpu_stream(), DType::Float64);
    mse_backward(grad_pred, grad_target, double_scalar(upstream), pred, target, reduction,
                 cpu_stream());
    EXPECT_TRUE(check_gradient(loss, {pred, target}, {grad_pred, grad_target}));
  }
}

TEST(LossGradient, CrossEntropyMatchesCentralDifferences) {
  for (Reduction reduction : {Reduction::Mean, Reduction::Sum}) {
    for (const double eps : {0.0, 0.15}) {
      Tensor logits = random_double_tensor({5, 7}, 61, -3.0, 3.0);
      Tensor labels =
          Tensor::from_host<double>(std::vector<double>{0, 6, 3, 3, 1}, {5}, cpu_stream());
      const double upstream = 0.7;
      auto loss = [&](const std::vector<Tensor>& in) {
        Tensor out = double_scalar(0);
        softmax_cross_entropy_forward(out, Tensor(), Tensor(), in[0], labels, reduction,
                                      cpu_stream(), eps);
        return upstream * value_of(out);
      };
      Tensor grad = Tensor::zeros({5, 7}, cpu_stream(), DType::Float64);
      softmax_cross_entropy_backward(grad, double_scalar(upstream), logits, labels, reduction,
                                     cpu_stream(), eps);
      EXPECT_TRUE(check_gradient(loss, {logits}, {grad})) << "eps " << eps;
    }
  }
}

TEST(LossGradient, L2MatchesCentralDifferences) {
  Tensor w = random_double_tensor({4, 5}, 71);
  const double upstream = 0.7, coeff = 0.3;
  auto loss = [&](const std::vector<Tensor>& in) {
    Tensor out = double_scalar(0);
    l2_loss_forward(out, in[0], coeff, cpu_stream());
    return upstream * value_of(out);
  };
  Tensor grad_w = Tensor::zeros({4, 5}, cpu_stream(), DType::Float64);
  l2_loss_backward(grad_w, double_scalar(upstream), w, coeff, cpu_stream());
  EXPECT_TRUE(check_gradient(loss, {w}, {grad_w}));
}

// For tests/ops_vs_torch_test.py (family label_smoothing): through the tape
// (ag::softmax_cross_entropy: the CPU's backward from probs, CUDA's recomputing one),
// per backend and dtype, logits [5,7] and [4,12] (CUDA's general and cached rows),
// labels, each eps and reduction: eps [1], sum [1] (1: Sum), grad_loss [1], loss and
// grad_logits.
TEST(LabelSmoothingVsTorch, WritesCases) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const TorchCaseBackend& backend : torch_case_backends()) {
    const Stream& stream = backend.stream();
    int index = 0;
    for (const Shape& shape : {Shape{5, 7}, Shape{4, 12}}) {
      const Tensor logits =
          backend.make(random_values(std::size_t(numel_of(shape)), 80 + index, -4.0f, 4.0f), shape);
      std::vector<float> y;
      for (std::int64_t n = 0; n < shape[0]; ++n) y.push_back(float((3 * n + 1) % shape[1]));
      const Tensor labels = backend.make(y, {shape[0]});
      for (const double eps : {0.0, 0.125, 0.375, 1.0}) {  // exact in float32
        for (const Reduction reduction : {Reduction::Mean, Reduction::Sum}) {
          const std::string p = backend.prefix + std::to_string(index++) + "/";
          Tensor grad_logits = Tensor::zeros(shape, stream, backend.dtype);
          const Tensor grad_loss = backend.make({0.75f}, {1});
          Tape tape(stream);
          const Var x = tape.variable(logits, grad_logits, "logits");
          const Var loss =
              ag::softmax_cross_entropy(x, tape.constant(labels), reduction, nullptr, eps);
          tape.backward(loss, grad_loss);
          out.insert(out.end(),
                     {{p + "logits", logits},
                      {p + "labels", labels},
                      {p + "eps", backend.make({float(eps)}, {1})},
                      {p + "sum", backend.make({reduction == Reduction::Sum ? 1.0f : 0.0f}, {1})},
                      {p + "grad_loss", grad_loss},
                      {p + "loss", loss.value()},
                      {p + "grad_logits", grad_logits}});
        }
      }
    }
  }
  write_torch_cases("label_smoothing.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
