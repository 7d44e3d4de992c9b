// ReLU forward and backward on every backend, in float32 and in bfloat16 and
// float16 (bit for bit against the reference), and its gradient in float64.
// The files an op takes, in order: the top of kernels/relu.h.
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "kernels/reference/relu.h"
#include "sixteen_bit.h"
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

class ReluSixteenBitTest : public SixteenBitTest {};
TL_INSTANTIATE_SIXTEEN_BIT(ReluSixteenBitTest);

// The forward keeps every value's bits (a NaN's too) or writes +0: the reference's
// bits on odd sizes, with NaN, infinities and signed zeros among the inputs.
TEST_P(ReluSixteenBitTest, ForwardIsTheReferenceBitForBit) {
  for (std::int64_t n : {1, 7, 257, 4099}) {
    const auto values = values_with_specials(static_cast<std::size_t>(n), 5);
    Tensor x = make(values, {n});
    Tensor y = Tensor::empty({n}, stream(), dtype());
    relu_forward(y, x, stream());
    typed([&]<typename T>() {
      const std::vector<T> x16 = narrow<T>(values);
      std::vector<T> expected(x16.size());
      reference::relu_forward(expected.data(), x16.data(), n);
      EXPECT_EQ(bits(host(y)), bits(widen(expected))) << "n = " << n;
    });
    EXPECT_TRUE(std::isnan(host(y)[0])) << "a ReLU that drops NaN hides a broken input";
  }
  // In place (y aliases x).
  Tensor x = make({-1.5f, 2.5f}, {2});
  relu_forward(x, x, stream());
  EXPECT_EQ(host(x), (std::vector<float>{0.0f, 2.5f}));
}

// The gradient is accumulated onto a sentinel in float32 and rounded once, or
// assigned: the reference's bits either way. The control: the two expectations
// differ, so an add that assigns (or the reverse) fails.
TEST_P(ReluSixteenBitTest, BackwardAccumulatesOrAssignsAsTheReference) {
  for (std::int64_t n : {1, 9, 1031}) {
    const auto xv = values_with_specials(static_cast<std::size_t>(n), 6);
    const auto gyv = values_with_specials(static_cast<std::size_t>(n), 7);
    const auto sentinel = random_values(static_cast<std::size_t>(n), 8, -100.0f, 100.0f);
    Tensor y = make(xv, {n});
    relu_forward(y, y, stream());
    Tensor grad_y = make(gyv, {n});
    for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
      Tensor grad_x = make(sentinel, {n});
      relu_backward(grad_x, grad_y, y, stream(), write);
      typed([&]<typename T>() {
        std::vector<T> y16 = narrow<T>(xv);
        reference::relu_forward(y16.data(), y16.data(), n);
        const std::vector<T> gy16 = narrow<T>(gyv);
        std::vector<T> added = narrow<T>(sentinel), assigned = added;
        reference::relu_backward(added.data(), gy16.data(), y16.data(), n, GradWrite::Accumulate);
        reference::relu_backward(assigned.data(), gy16.data(), y16.data(), n, GradWrite::Assign);
        const auto& expected = write == GradWrite::Assign ? assigned : added;
        EXPECT_EQ(bits(host(grad_x)), bits(widen(expected))) << "n = " << n;
        EXPECT_NE(bits(widen(added)), bits(widen(assigned))) << "control, n = " << n;
      });
    }
  }
}

// By hand: the float32 sum rounded to nearest even. In bfloat16 (a step of 2 at
// 256) 256 + 1 is a tie that goes to the even 256 and 256 + 1.0078125 rounds up to
// 258; in float16 (a step of 0.25) both give 257.
TEST_P(ReluSixteenBitTest, AnAccumulatedGradientIsRoundedOnce) {
  Tensor y = make({1.0f, 1.0f}, {2});
  Tensor grad_y = make({1.0f, 1.0078125f}, {2});
  Tensor grad_x = make({256.0f, 256.0f}, {2});
  relu_backward(grad_x, grad_y, y, stream());
  const std::vector<float> expected = dtype() == DType::BFloat16
                                          ? std::vector<float>{256.0f, 258.0f}
                                          : std::vector<float>{257.0f, 257.0f};
  EXPECT_EQ(host(grad_x), expected);
}

TEST_P(ReluSixteenBitTest, MixedDtypesAreShapeErrors) {
  Tensor x = make({1.0f, 2.0f}, {2});
  Tensor y = Tensor::empty({2}, stream());
  EXPECT_THROW_WITH(relu_forward(y, x, stream()), ShapeError,
                    std::string("relu_forward: x is ") + dtype_name(dtype()));
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
