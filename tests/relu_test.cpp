// ReLU forward and backward on every backend, and its gradient in float64.
// The files an op takes, in order: the top of kernels/relu.h.
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "kernels/reference/relu.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class ReluTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(ReluTest);

TEST_P(ReluTest, ForwardClampsNegatives) {
  Tensor x = make({-2.0f, -0.0f, 0.0f, 0.5f, 3.0f}, {5});
  Tensor y = Tensor::empty({5}, stream());
  relu_forward(y, x, stream());
  EXPECT_EQ(host(y), (std::vector<float>{0.0f, 0.0f, 0.0f, 0.5f, 3.0f}));
}

TEST_P(ReluTest, ForwardKeepsNaNAndInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = make({std::numeric_limits<float>::quiet_NaN(), -inf, inf}, {3});
  Tensor y = Tensor::empty({3}, stream());
  relu_forward(y, x, stream());
  const auto out = host(y);
  EXPECT_TRUE(std::isnan(out[0])) << "a ReLU that drops NaN hides a broken input";
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], inf);
}

TEST_P(ReluTest, BackwardAccumulatesIntoGradX) {
  Tensor y = make({0.0f, 1.0f, 0.0f, 2.0f}, {2, 2});
  Tensor grad_y = make({10.0f, 20.0f, 30.0f, 40.0f}, {2, 2});
  Tensor grad_x = make({1.0f, 1.0f, 1.0f, 1.0f}, {2, 2});  // sentinel: must be added to
  relu_backward(grad_x, grad_y, y, stream());
  EXPECT_EQ(host(grad_x), (std::vector<float>{1.0f, 21.0f, 1.0f, 41.0f}));
}

TEST_P(ReluTest, MatchesHostOnOddSizes) {
  for (std::int64_t n : {0, 1, 7, 257, 1000003}) {
    auto values = random_values(static_cast<std::size_t>(n), 3);
    Tensor x = make(values, {n});
    Tensor y = Tensor::empty({n}, stream());
    relu_forward(y, x, stream());
    std::vector<float> expected(values.size());
    reference::relu_forward(expected.data(), values.data(), n);
    EXPECT_EQ(host(y), expected) << "n = " << n;
  }
}

TEST_P(ReluTest, RejectsMismatchedShapes) {
  Tensor x = Tensor::zeros({2, 3}, stream());
  Tensor y = Tensor::zeros({3, 2}, stream());
  EXPECT_THROW_WITH(relu_forward(y, x, stream()), ShapeError, "relu_forward: x is float32[2,3]");
}

TEST(ReluGradient, MatchesCentralDifferences) {
  Tensor x = random_double_tensor({4, 5}, 11);
  // Keep away from the kink at 0, where the derivative is undefined.
  double* p = x.data<double>();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (std::abs(p[i]) < 0.05) p[i] = 0.3;
  }
  Tensor g = random_double_tensor({4, 5}, 12);
  const Stream& cpu = default_stream(Device::cpu());
  auto loss = [&](const std::vector<Tensor>& in) {
    Tensor y = Tensor::empty({4, 5}, cpu, DType::Float64);
    relu_forward(y, in[0], cpu);
    return weighted_sum(g, y);
  };
  Tensor y = Tensor::empty({4, 5}, cpu, DType::Float64);
  relu_forward(y, x, cpu);
  Tensor grad_x = Tensor::zeros({4, 5}, cpu, DType::Float64);
  relu_backward(grad_x, g, y, cpu);
  EXPECT_TRUE(check_gradient(loss, {x}, {grad_x}));
}

}  // namespace
}  // namespace towerlab::testing
