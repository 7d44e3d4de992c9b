// Max and average pooling on every backend: hand-computed cases (ties, padding,
// NaN), a plain reference on odd shapes and windows, accumulation, empty tensors,
// errors, bfloat16 and float16 (bit for bit against the reference, and through the
// autograd ops), and gradients in float64.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "gradcheck.h"
#include "kernels/cpu/pool2d.h"
#include "kernels/pool2d.h"
#include "kernels/reference/pool2d.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class Pool2dTest : public BackendTest {
 protected:
  void check_misaligned_views(std::int64_t shift, const Shape& xs);
};
TL_INSTANTIATE_BACKENDS(Pool2dTest);

// The library's plain reference (kernels/reference/pool2d.h) in double: y, and
// grad_x accumulated from zeros by the backward of grad_y.
struct PoolReference {
  std::vector<float> y, grad_x;
};

PoolReference reference(bool is_max, const std::vector<float>& x, const std::vector<float>& grad_y,
                        const Shape& xs, const Shape& ys, const Pool2dParams& p) {
  const std::vector<double> x64(x.begin(), x.end()), grad_y64(grad_y.begin(), grad_y.end());
  std::vector<double> y(static_cast<std::size_t>(numel_of(ys))), argmax(y.size()),
      grad_x(x.size(), 0.0);
  if (is_max) {
    reference::max_pool2d_forward(y.data(), argmax.data(), x64.data(), xs, p);
    reference::max_pool2d_backward(grad_x.data(), grad_y64.data(), argmax.data(), xs, p);
  } else {
    reference::avg_pool2d_forward(y.data(), x64.data(), xs, p);
    reference::avg_pool2d_backward(grad_x.data(), grad_y64.data(), xs, p);
  }
  return {{y.begin(), y.end()}, {grad_x.begin(), grad_x.end()}};
}

// Distinct values (a shuffled ramp), so that no max-pool window has a tie.
std::vector<float> distinct_values(std::size_t n, unsigned seed) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  for (float& f : v) f = f * 0.01f - 3.0f;
  return v;
}

TEST_P(Pool2dTest, MaxAndAverageTwoByTwoByHand) {
  // One 4x4 plane, 2x2 windows with stride 2 (FashionNet's pooling).
  Tensor x = make({1, 2, 5, 6,    //
                   3, 4, 7, 8,    //
                   -1, -2, 0, 0,  //
                   -3, -4, 0, 9},
                  {1, 1, 4, 4});
  const Pool2dParams p = Pool2dParams::square(2, 2);
  ASSERT_EQ(pool2d_output_shape(x.shape(), p), (Shape{1, 1, 2, 2}));
  Tensor y = Tensor::empty({1, 1, 2, 2}, stream());
  max_pool2d_forward(y, x, p, stream());
  EXPECT_EQ(host(y), (std::vector<float>{4, 8, -1, 9}));
  avg_pool2d_forward(y, x, p, stream());
  EXPECT_EQ(host(y), (std::vector<float>{2.5f, 6.5f, -2.5f, 2.25f}));

  Tensor grad_y = make({10, 20, 30, 40}, {1, 1, 2, 2});
  Tensor grad_x = make(std::vector<float>(16, 1.0f), {1, 1, 4, 4});  // sentinel
  max_pool2d_backward(grad_x, grad_y, x, p, stream());
  EXPECT_EQ(host(grad_x), (std::vector<float>{1, 1, 1, 1,    //
                                              1, 11, 1, 21,  //
                                              31, 1, 1, 1,   //
                                              1, 1, 1, 41}));
  Tensor grad_avg = make(std::vector<float>(16, 1.0f), {1, 1, 4, 4});
  avg_pool2d_backward(grad_avg, grad_y, p, stream());
  EXPECT_EQ(host(grad_avg), (std::vector<float>{3.5f, 3.5f, 6, 6,    //
                                                3.5f, 3.5f, 6, 6,    //
                                                8.5f, 8.5f, 11, 11,  //
                                                8.5f, 8.5f, 11, 11}));
}

TEST_P(Pool2dTest, TiesGoToTheFirstMaximum) {
  // Window 0 is all equal; window 1 ties at its 2nd and 4th positions.
  Tensor x = make({7, 7, 1, 5,  //
                   7, 7, 2, 5},
                  {1, 1, 2, 4});
  Tensor grad_x = Tensor::zeros({1, 1, 2, 4}, stream());
  max_pool2d_backward(grad_x, make({1, 2}, {1, 1, 1, 2}), x, Pool2dParams::square(2, 2), stream());
  EXPECT_EQ(host(grad_x), (std::vector<float>{1, 0, 0, 2,  //
                                              0, 0, 0, 0}));
}

TEST_P(Pool2dTest, NanPropagatesThroughMax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = make({1, nan, 2, 3}, {1, 1, 2, 2});
  Tensor y = Tensor::empty({1, 1, 1, 1}, stream());
  max_pool2d_forward(y, x, Pool2dParams::square(2, 2), stream());
  EXPECT_TRUE(std::isnan(host(y)[0]));
}

TEST_P(Pool2dTest, AveragePaddingIsNotCounted) {
  // 3x3 windows, stride 2, padding 1 on a 3x3 ramp: each
  // output is the mean of the real values its window covers.
  Tensor x = make({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const Pool2dParams p = Pool2dParams::square(3, 2, 1);
  Tensor y = Tensor::empty({1, 1, 2, 2}, stream());
  avg_pool2d_forward(y, x, p, stream());
  // Top-left covers {1,2,4,5}; top-right {2,3,5,6}; bottom-left {4,5,7,8}; bottom-right {5,6,8,9}.
  EXPECT_TRUE(all_close(host(y), {3.0f, 4.0f, 6.0f, 7.0f}));
  max_pool2d_forward(y, x, p, stream());
  EXPECT_EQ(host(y), (std::vector<float>{5, 6, 8, 9}));  // padding never wins
  Tensor neg = make({-1, -2, -3, -4, -5, -6, -7, -8, -9}, {1, 1, 3, 3});
  max_pool2d_forward(y, neg, p, stream());
  EXPECT_EQ(host(y), (std::vector<float>{-1, -2, -4, -5}));  // not 0 from the padding
}

// Shapes and windows that every reference comparison runs (float32 and 16 bits).
struct PoolCase {
  Shape x;
  Pool2dParams p;
};
const std::vector<PoolCase> kOddCases = {
    {{2, 3, 28, 28}, Pool2dParams::square(2, 2)},
    {{3, 2, 7, 9}, Pool2dParams::square(2, 2)},       // odd plane: last row/column dropped
    {{2, 3, 7, 9}, {3, 2, 2, 1, 1, 1}},               // rectangular window and stride, padding
    {{1, 5, 13, 11}, Pool2dParams::square(3, 1, 1)},  // overlapping windows
    {{2, 2, 5, 5}, Pool2dParams::square(5, 1)},       // one window per plane
    {{1, 1, 1, 1}, Pool2dParams::square(1, 1)},
    {{4, 3, 17, 19}, {4, 3, 3, 2, 2, 1}},
};

TEST_P(Pool2dTest, MatchesReferenceOnOddShapes) {
  for (const PoolCase& c : kOddCases) {
    const Shape ys = pool2d_output_shape(c.x, c.p);
    const auto nx = static_cast<std::size_t>(numel_of(c.x));
    const auto ny = static_cast<std::size_t>(numel_of(ys));
    const auto xv = distinct_values(nx, 1);
    const auto gyv = random_values(ny, 2);
    Tensor x = make(xv, c.x), grad_y = make(gyv, ys);
    for (bool is_max : {true, false}) {
      const PoolReference r = reference(is_max, xv, gyv, c.x, ys, c.p);
      Tensor y = Tensor::empty(ys, stream());
      Tensor grad_x = make(std::vector<float>(nx, 0.25f), c.x);  // sentinel
      if (is_max) {
        max_pool2d_forward(y, x, c.p, stream());
        max_pool2d_backward(grad_x, grad_y, x, c.p, stream());
      } else {
        avg_pool2d_forward(y, x, c.p, stream());
        avg_pool2d_backward(grad_x, grad_y, c.p, stream());
      }
      std::vector<float> expected_gx = r.grad_x;
      for (float& v : expected_gx) v += 0.25f;
      EXPECT_TRUE(all_close(host(y), r.y, 1e-6, 1e-5))
          << (is_max ? "max " : "avg ") << to_string(c.x);
      EXPECT_TRUE(all_close(host(grad_x), expected_gx, 1e-6, 1e-5))
          << (is_max ? "max " : "avg ") << to_string(c.x);
    }
  }
}

// Views may start at any element: x, y and the gradients one float past an
// aligned start take CUDA's general kernels instead of the 2x2 ones (float2
// loads), two floats past it the 2x2 ones but not average pooling's backward with
// float4 rows (Wo even), with the same results. Wo = 4 and 3: both 2x2 backwards.
TEST_P(Pool2dTest, MisalignedViewsMatchAligned) {
  for (const std::int64_t shift : {1, 2}) {
    for (const std::int64_t wo : {4, 3}) {
      check_misaligned_views(shift, {2, 3, 4, 2 * wo});
    }
  }
}

void Pool2dTest::check_misaligned_views(std::int64_t shift, const Shape& xs) {
  const Shape ys = {xs[0], xs[1], xs[2] / 2, xs[3] / 2};
  const std::int64_t n = numel_of(xs), m = numel_of(ys);
  const auto p = Pool2dParams::square(2, 2);
  const auto xv = random_values(static_cast<std::size_t>(n), 91);
  const auto gv = random_values(static_cast<std::size_t>(m), 92);
  const auto shifted = [&](const std::vector<float>& v, const Shape& shape) {
    std::vector<float> padded(v);
    padded.insert(padded.begin(), static_cast<std::size_t>(shift), 0.0f);
    return make(padded, {numel_of(shape) + shift}).view(shift, shape);
  };
  const auto zeros_view = [&](const Shape& shape) {
    return Tensor::zeros({numel_of(shape) + shift}, stream()).view(shift, shape);
  };
  SCOPED_TRACE("views " + std::to_string(shift) + " floats past the start, x " + to_string(xs));
  Tensor x = make(xv, xs), x_view = shifted(xv, xs);
  Tensor grad_y = make(gv, ys), grad_y_view = shifted(gv, ys);
  Tensor y = Tensor::zeros(ys, stream()), y_view = zeros_view(ys);
  Tensor grad_x = Tensor::zeros(xs, stream()), grad_x_view = zeros_view(xs);
  max_pool2d_forward(y, x, p, stream());
  max_pool2d_forward(y_view, x_view, p, stream());
  EXPECT_EQ(host(y_view), host(y));
  max_pool2d_backward(grad_x, grad_y, x, p, stream());
  max_pool2d_backward(grad_x_view, grad_y_view, x_view, p, stream());
  EXPECT_EQ(host(grad_x_view), host(grad_x));
  avg_pool2d_forward(y, x, p, stream());
  avg_pool2d_forward(y_view, x_view, p, stream());
  EXPECT_EQ(host(y_view), host(y));
  avg_pool2d_backward(grad_x, grad_y, p, stream());
  avg_pool2d_backward(grad_x_view, grad_y_view, p, stream());
  EXPECT_EQ(host(grad_x_view), host(grad_x));
}

TEST_P(Pool2dTest, EmptyBatchIsANoOp) {
  Tensor x = Tensor::zeros({0, 3, 4, 4}, stream());
  Tensor y = Tensor::zeros({0, 3, 2, 2}, stream());
  const Pool2dParams p = Pool2dParams::square(2, 2);
  max_pool2d_forward(y, x, p, stream());
  avg_pool2d_forward(y, x, p, stream());
  max_pool2d_backward(Tensor::zeros({0, 3, 4, 4}, stream()), y, x, p, stream());
  avg_pool2d_backward(Tensor::zeros({0, 3, 4, 4}, stream()), y, p, stream());
}

TEST_P(Pool2dTest, RejectsBadArguments) {
  Tensor x = Tensor::zeros({2, 3, 5, 5}, stream());
  Tensor y = Tensor::zeros({2, 3, 3, 3}, stream());
  EXPECT_THROW_WITH(max_pool2d_forward(y, x, Pool2dParams::square(2, 2), stream()), ShapeError,
                    "max_pool2d_forward: y is float32[2,3,3,3]");
  EXPECT_THROW_WITH(max_pool2d_forward(y, x, Pool2dParams::square(2, 2), stream()), ShapeError,
                    "gives [2,3,2,2]");
  EXPECT_THROW_WITH(avg_pool2d_forward(y, x, Pool2dParams::square(2, 2, 2), stream()),
                    InvalidArgument, "padding must be between 0 and half the window");
  EXPECT_THROW_WITH(avg_pool2d_forward(y, x, Pool2dParams::square(3, 0), stream()), InvalidArgument,
                    "window and stride must be at least 1");
  EXPECT_THROW_WITH(max_pool2d_forward(y, x, Pool2dParams::square(7, 1), stream()), ShapeError,
                    "does not fit in the 5x5 plane");
  Tensor x3 = Tensor::zeros({3, 5, 5}, stream());
  EXPECT_THROW_WITH(max_pool2d_forward(y, x3, Pool2dParams::square(2, 2), stream()), ShapeError,
                    "x must be [N,C,H,W], got [3,5,5]");
  EXPECT_THROW_WITH(max_pool2d_backward(Tensor::zeros({2, 3, 4, 4}, stream()),
                                        Tensor::zeros({2, 3, 2, 2}, stream()), x,
                                        Pool2dParams::square(2, 2), stream()),
                    ShapeError, "max_pool2d_backward: grad_x is float32[2,3,4,4]");
  EXPECT_THROW_WITH(avg_pool2d_backward(Tensor::zeros({2, 3, 4, 4}, stream()), y,
                                        Pool2dParams::square(2, 2), stream()),
                    ShapeError, "avg_pool2d_backward: grad_y is float32[2,3,3,3]");
}

// --- bfloat16 and float16 ---------------------------------------------------------

class Pool2dSixteenBitTest : public SixteenBitTest {
 protected:
  // The backwards into a copy of `sentinel` each: max pooling recomputing the
  // argmax from x, from the recorded argmax accumulated and assigned, then average
  // pooling's.
  std::vector<std::vector<float>> backwards(const Tensor& x, const Tensor& grad_y,
                                            const std::vector<float>& sentinel, const PoolCase& c);
};
TL_INSTANTIATE_SIXTEEN_BIT(Pool2dSixteenBitTest);

// The reference's bits, except that where the reference has a NaN any NaN will do:
// a GPU's arithmetic makes its own canonical NaN, where the host keeps an operand's.
::testing::AssertionResult same_bits(const std::vector<float>& actual,
                                     const std::vector<float>& expected) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const bool nan = std::isnan(expected[i]) && std::isnan(actual[i]);
    if (!nan &&
        std::bit_cast<std::uint32_t>(actual[i]) != std::bit_cast<std::uint32_t>(expected[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << actual[i] << " where the reference has " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// values_with_specials on a grid of 0.5 (many ties in every window), NaN,
// infinities, signed zeros and a float16 subnormal among them.
std::vector<float> tied_values_with_specials(std::size_t n, unsigned seed) {
  std::vector<float> v = values_with_specials(n, seed);
  for (std::size_t i = 6; i < n; ++i) v[i] = std::round(v[i] * 2.0f) / 2.0f;
  return v;
}

// y (max and average) and max pooling's float32 argmax are the reference's bits on
// every case, with ties and NaN: the first maximum wins, a NaN propagates.
TEST_P(Pool2dSixteenBitTest, ForwardsAreTheReferenceBitForBit) {
  for (const PoolCase& c : kOddCases) {
    SCOPED_TRACE(to_string(c.x));
    const Shape ys = pool2d_output_shape(c.x, c.p);
    const auto xv = tied_values_with_specials(static_cast<std::size_t>(numel_of(c.x)), 31);
    Tensor x = make(xv, c.x);
    Tensor y_max = Tensor::empty(ys, stream(), dtype()),
           y_avg = Tensor::empty(ys, stream(), dtype());
    Tensor y_argmax = Tensor::empty(ys, stream(), dtype());
    Tensor argmax = Tensor::empty(ys, stream(), DType::Float32);
    ASSERT_EQ(pool2d_argmax_dtype(dtype()), DType::Float32);
    max_pool2d_forward(y_max, x, c.p, stream());
    max_pool2d_forward_with_argmax(y_argmax, argmax, x, c.p, stream());
    avg_pool2d_forward(y_avg, x, c.p, stream());
    typed([&]<typename T>() {
      const std::vector<T> x16 = narrow<T>(xv);
      std::vector<T> expected_max(static_cast<std::size_t>(numel_of(ys))),
          expected_avg = expected_max;
      std::vector<float> expected_argmax(expected_max.size());
      reference::max_pool2d_forward(expected_max.data(), expected_argmax.data(), x16.data(), c.x,
                                    c.p);
      reference::avg_pool2d_forward(expected_avg.data(), x16.data(), c.x, c.p);
      EXPECT_EQ(bits(host(y_max)), bits(widen(expected_max))) << "a max copies its winner";
      EXPECT_EQ(bits(host(y_argmax)), bits(widen(expected_max)));
      EXPECT_EQ(argmax.to_host<float>(stream()), expected_argmax);
      EXPECT_TRUE(same_bits(host(y_avg), widen(expected_avg)));
    });
    EXPECT_TRUE(std::isnan(host(y_max)[0]) && std::isnan(host(y_avg)[0]))
        << "the window of x[0], a NaN, must give NaN";
  }
}

std::vector<std::vector<float>> Pool2dSixteenBitTest::backwards(const Tensor& x,
                                                                const Tensor& grad_y,
                                                                const std::vector<float>& sentinel,
                                                                const PoolCase& c) {
  std::vector<std::vector<float>> out;
  Tensor y = Tensor::empty(grad_y.shape(), stream(), dtype());
  Tensor argmax = Tensor::empty(grad_y.shape(), stream(), DType::Float32);
  max_pool2d_forward_with_argmax(y, argmax, x, c.p, stream());
  Tensor grad_x = make(sentinel, c.x);
  max_pool2d_backward(grad_x, grad_y, x, c.p, stream());
  out.push_back(host(grad_x));
  grad_x = make(sentinel, c.x);
  max_pool2d_backward_from_argmax(grad_x, grad_y, argmax, c.p, stream());
  out.push_back(host(grad_x));
  grad_x = make(sentinel, c.x);
  max_pool2d_backward_from_argmax(grad_x, grad_y, argmax, c.p, stream(), GradWrite::Assign);
  out.push_back(host(grad_x));
  grad_x = make(sentinel, c.x);
  avg_pool2d_backward(grad_x, grad_y, c.p, stream());
  out.push_back(host(grad_x));
  return out;
}

// Each grad_x element's terms summed in float32 and added to the sentinel once
// (kernels/pool2d.h), or assigned: the reference's bits, on overlapping windows too
// (several terms per element). The control: accumulated and assigned differ.
TEST_P(Pool2dSixteenBitTest, BackwardsAccumulateOrAssignAsTheReference) {
  for (const PoolCase& c : kOddCases) {
    SCOPED_TRACE(to_string(c.x));
    const Shape ys = pool2d_output_shape(c.x, c.p);
    const auto nx = static_cast<std::size_t>(numel_of(c.x));
    const auto xv = tied_values_with_specials(nx, 32);
    const auto gyv = values_with_specials(static_cast<std::size_t>(numel_of(ys)), 33);
    const auto sentinel = random_values(nx, 34, -100.0f, 100.0f);
    const auto results = backwards(make(xv, c.x), make(gyv, ys), sentinel, c);
    typed([&]<typename T>() {
      const std::vector<T> x16 = narrow<T>(xv), gy16 = narrow<T>(gyv);
      std::vector<T> y(gy16.size());
      std::vector<float> argmax(gy16.size());
      reference::max_pool2d_forward(y.data(), argmax.data(), x16.data(), c.x, c.p);
      std::vector<T> max_added = narrow<T>(sentinel), max_assigned(nx, T(0.0f));
      std::vector<T> avg_added = narrow<T>(sentinel);
      reference::max_pool2d_backward(max_added.data(), gy16.data(), argmax.data(), c.x, c.p);
      reference::max_pool2d_backward(max_assigned.data(), gy16.data(), argmax.data(), c.x, c.p);
      reference::avg_pool2d_backward(avg_added.data(), gy16.data(), c.x, c.p);
      EXPECT_TRUE(same_bits(results[0], widen(max_added))) << "max, argmax recomputed";
      EXPECT_TRUE(same_bits(results[1], widen(max_added))) << "max from argmax, accumulated";
      EXPECT_TRUE(same_bits(results[2], widen(max_assigned))) << "max from argmax, assigned";
      EXPECT_TRUE(same_bits(results[3], widen(avg_added))) << "average";
      // (A single output's grad_y is the NaN of values_with_specials: no control there.)
      if (nx > 1) EXPECT_NE(bits(widen(max_added)), bits(widen(max_assigned))) << "control";
    });
  }
}

// By hand: x = {0, 5, 0} under 1x2 windows of stride 1, whose two windows both
// cover (and both take) the middle value. Max pooling with grad_y = {0.75, 0.75} and
// average pooling with {1.5, 1.5} send the middle 0.75 + 0.75, the edges (average
// pooling's) 0.75. Where the sentinel s's step is 2 (bfloat16 at 256, float16 at
// 2048), s + 1.5 rounds once to s + 2 and s + 0.75 to s; adding and rounding twice
// would leave the middle at s.
TEST_P(Pool2dSixteenBitTest, AnAccumulatedGradientIsRoundedOnce) {
  const float s = dtype() == DType::BFloat16 ? 256.0f : 2048.0f;
  const Pool2dParams p = {1, 2, 1, 1, 0, 0};
  Tensor x = make({0.0f, 5.0f, 0.0f}, {1, 1, 1, 3});
  Tensor grad_x = make({s, s, s}, {1, 1, 1, 3});
  max_pool2d_backward(grad_x, make({0.75f, 0.75f}, {1, 1, 1, 2}), x, p, stream());
  EXPECT_EQ(host(grad_x), (std::vector<float>{s, s + 2.0f, s}));
  grad_x = make({s, s, s}, {1, 1, 1, 3});
  avg_pool2d_backward(grad_x, make({1.5f, 1.5f}, {1, 1, 1, 2}), p, stream());
  EXPECT_EQ(host(grad_x), (std::vector<float>{s, s + 2.0f, s}));
}

// Ties and NaN by hand: window 0 is all 7 (the first wins), window 1 ties at its
// 2nd and 4th positions; a NaN window's output is NaN and its argmax the NaN's.
TEST_P(Pool2dSixteenBitTest, TiesGoToTheFirstMaximumAndNanWins) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = make({7, 7, 1, 5, 2, nan,  //
                   7, 7, 2, 5, 3, 9},
                  {1, 1, 2, 6});
  Tensor y = Tensor::empty({1, 1, 1, 3}, stream(), dtype());
  Tensor argmax = Tensor::empty({1, 1, 1, 3}, stream(), DType::Float32);
  max_pool2d_forward_with_argmax(y, argmax, x, Pool2dParams::square(2, 2), stream());
  const std::vector<float> values = host(y);
  EXPECT_EQ(values[0], 7.0f);
  EXPECT_EQ(values[1], 5.0f);
  EXPECT_TRUE(std::isnan(values[2]));
  EXPECT_EQ(argmax.to_host<float>(stream()), (std::vector<float>{0, 3, 5}));
}

// Mixed dtypes are ShapeErrors naming the op and both tensors; an argmax of x's
// 16-bit dtype is one too, naming the dtype it must be.
TEST_P(Pool2dSixteenBitTest, MixedDtypesAreTypedErrors) {
  const Pool2dParams p = Pool2dParams::square(2, 2);
  const std::string name = dtype_name(dtype()), on = " on " + device().str();
  Tensor x = make(std::vector<float>(16, 1.0f), {1, 1, 4, 4});
  Tensor y32 = Tensor::empty({1, 1, 2, 2}, stream());
  EXPECT_THROW_WITH(max_pool2d_forward(y32, x, p, stream()), ShapeError,
                    "max_pool2d_forward: y is float32[1,1,2,2]" + on + " but x is " + name);
  EXPECT_THROW_WITH(avg_pool2d_forward(y32, x, p, stream()), ShapeError,
                    "avg_pool2d_forward: y is float32[1,1,2,2]" + on + " but x is " + name);
  EXPECT_THROW_WITH(
      avg_pool2d_backward(make(std::vector<float>(16, 0.0f), {1, 1, 4, 4}), y32, p, stream()),
      ShapeError,
      "avg_pool2d_backward: grad_y is float32[1,1,2,2]" + on + " but grad_x is " + name);
  Tensor y = Tensor::empty({1, 1, 2, 2}, stream(), dtype());
  EXPECT_THROW_WITH(max_pool2d_backward(Tensor::zeros({1, 1, 4, 4}, stream()), y, x, p, stream()),
                    ShapeError,
                    "max_pool2d_backward: grad_x is float32[1,1,4,4]" + on + " but x is " + name);
  Tensor argmax16 = Tensor::empty({1, 1, 2, 2}, stream(), dtype());
  EXPECT_THROW_WITH(max_pool2d_forward_with_argmax(y, argmax16, x, p, stream()), ShapeError,
                    "max_pool2d_forward_with_argmax: argmax is " + name + "[1,1,2,2]" + on +
                        " but y is " + name + "[1,1,2,2]" + on + ", whose argmax is float32");
  EXPECT_THROW_WITH(max_pool2d_backward_from_argmax(
                        make(std::vector<float>(16, 0.0f), {1, 1, 4, 4}), y, argmax16, p, stream()),
                    ShapeError, "max_pool2d_backward_from_argmax: argmax is " + name);
  // The control: the float32 argmax that the message asks for is taken.
  Tensor argmax = Tensor::empty({1, 1, 2, 2}, stream(), DType::Float32);
  max_pool2d_forward_with_argmax(y, argmax, x, p, stream());
}

// The autograd ops pool a 16-bit Var in its dtype, as a bf16 or fp16 tape runs them
// (docs/precision.md): y the 16-bit forward kernels' bits; x's gradient float32 (the
// policy's, Tape::grad_dtype) from a float32 grad_y, the float32 backward kernels'
// bits on the widened x, accumulated onto a sentinel (max pooling through its float32
// argmax; the global average as one op, no reshape between).
TEST_P(Pool2dSixteenBitTest, AutogradOpsPoolInTheInputsDtypeWithFloat32Gradients) {
  const Shape xs = {2, 3, 5, 7};
  const auto xv = tied_values_with_specials(static_cast<std::size_t>(numel_of(xs)), 41);
  const auto sentinel = random_values(static_cast<std::size_t>(numel_of(xs)), 42, -4.0f, 4.0f);
  const Pool2dParams p = Pool2dParams::square(3, 2, 1);
  enum class Op { Max, Avg, Global };
  for (Op op : {Op::Max, Op::Avg, Op::Global}) {
    SCOPED_TRACE(int(op));
    const Pool2dParams window = op == Op::Global ? Pool2dParams{5, 7, 1, 1, 0, 0} : p;
    const Shape ys = pool2d_output_shape(xs, window);
    const auto gyv = random_values(static_cast<std::size_t>(numel_of(ys)), 43);
    Tape tape(stream());
    tape.set_compute_dtype(dtype());
    Tensor x = make(xv, xs), grad_x = make32(sentinel, xs);
    Var v = tape.variable(x, grad_x, "x");
    Var y = op == Op::Max   ? ag::max_pool2d(v, p)
            : op == Op::Avg ? ag::avg_pool2d(v, p)
                            : ag::global_avg_pool2d(v);
    ASSERT_EQ(y.value().dtype(), dtype());
    ASSERT_EQ(tape.num_records(), 1u) << "one op: no widening or rounding recorded around it";
    Tensor grad_y = make32(gyv, y.shape());
    tape.backward(y, grad_y);
    // The kernels on their own: the 16-bit forward, the float32 backward.
    Tensor expected_y = Tensor::empty(ys, stream(), dtype()),
           expected_grad_x = make32(sentinel, xs);
    const Tensor grad_y4 = grad_y.reshape(ys);
    if (op == Op::Max) {
      max_pool2d_forward(expected_y, x, window, stream());
      max_pool2d_backward(expected_grad_x, grad_y4, cast(x, DType::Float32, stream()), window,
                          stream());
    } else {
      avg_pool2d_forward(expected_y, x, window, stream());
      avg_pool2d_backward(expected_grad_x, grad_y4, window, stream());
    }
    EXPECT_TRUE(same_bits(host(y.value()), host(expected_y)));
    EXPECT_TRUE(same_bits(host(grad_x), host(expected_grad_x)));
    EXPECT_NE(bits(host(grad_x)), bits(sentinel)) << "control: the gradient arrived";
  }
}

// --- gradients in float64 ---------------------------------------------------------

void check_pool_gradient(bool is_max, const Shape& xs, const Pool2dParams& p) {
  const Stream& cpu = default_stream(Device::cpu());
  const Shape ys = pool2d_output_shape(xs, p);
  // Values on a grid of spacing 0.01: the central-difference step (1e-6) can
  // never reorder a window, so max pooling has no tie or kink to skip.
  const auto v = distinct_values(static_cast<std::size_t>(numel_of(xs)), 3);
  Tensor x = Tensor::from_host<double>(std::vector<double>(v.begin(), v.end()), xs, cpu);
  Tensor g = random_double_tensor(ys, 4);
  auto loss = [&](const std::vector<Tensor>& in) {
    Tensor y = Tensor::empty(ys, cpu, DType::Float64);
    if (is_max) {
      max_pool2d_forward(y, in[0], p, cpu);
    } else {
      avg_pool2d_forward(y, in[0], p, cpu);
    }
    return weighted_sum(g, y);
  };
  Tensor grad_x = Tensor::zeros(xs, cpu, DType::Float64);
  if (is_max) {
    max_pool2d_backward(grad_x, g, x, p, cpu);
  } else {
    avg_pool2d_backward(grad_x, g, p, cpu);
  }
  EXPECT_TRUE(check_gradient(loss, {x}, {grad_x})) << (is_max ? "max " : "avg ") << to_string(xs);
}

TEST(Pool2dGradient, MatchesCentralDifferences) {
  for (bool is_max : {true, false}) {
    check_pool_gradient(is_max, {2, 2, 4, 6}, Pool2dParams::square(2, 2));
    check_pool_gradient(is_max, {1, 2, 5, 5}, Pool2dParams::square(3, 1, 1));
    check_pool_gradient(is_max, {2, 1, 6, 5}, {3, 2, 2, 1, 1, 0});
  }
}

// The CPU's 2x2 stride-2 max pooling runs four windows a vector (SSE), or eight with
// AVX2 and sixteen with AVX-512 (the forward; a row's last group cut to the row).
// Every ISA this CPU has must make window_argmax's choice in every window: the
// first maximum, the first NaN when the window holds one, ties to the earlier
// position; and the gradient puts each window's grad_y at that position, zeros
// elsewhere. Rows of 1 to 33 windows cover a single short group, whole groups and
// a short tail; the NaNs sit in every window position and in windows 0, 7, 8, 15
// and 16 (the first and last lanes of groups of eight and sixteen).
TEST(Pool2dTwoByTwoCpu, EveryIsaMakesWindowArgmaxsChoices) {
  const RestoreGemmIsa restore;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Pool2dParams p = Pool2dParams::square(2, 2);
  int isas = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas;
    for (std::int64_t Wo : {1, 3, 4, 5, 6, 7, 14, 16, 17, 33}) {
      const cpu::PoolPlane z{5, 2 * Wo + 1, 2, Wo};  // an odd H and W: a row and column left out
      SCOPED_TRACE("isa " + std::to_string(int(isa)) + ", Wo " + std::to_string(Wo));
      // Coarse values make ties; then a NaN in window w at position w % 4 (rows 0-1).
      std::vector<float> x = random_values(std::size_t(z.H * z.W), unsigned(Wo));
      for (float& v : x) v = std::round(v * 3.0f);
      for (std::int64_t w : {0, 7, 8, 15, 16}) {
        if (w >= Wo) continue;
        const std::int64_t k = w % 4;
        x[std::size_t((k / 2) * z.W + 2 * w + k % 2)] = nan;
      }
      std::vector<float> y(std::size_t(z.Ho * Wo)), where(y.size());
      cpu::max_pool_plane(x.data(), y.data(), where.data(), z, p);
      const std::vector<float> grad_y = random_values(y.size(), unsigned(Wo) + 100);
      std::vector<float> grad_x(x.size(), 0.5f);  // sentinel: every value must be written
      cpu::max_pool_plane_gradient(where.data(), grad_y.data(), grad_x.data(), z, p);
      // The reference's choices on the same plane, and its gradient from zeros.
      const Shape plane = {1, 1, z.H, z.W};
      const std::vector<double> x64(x.begin(), x.end()), grad_y64(grad_y.begin(), grad_y.end());
      std::vector<double> expected_y(y.size()), expected_where(y.size()), expected_grad_x(x.size());
      reference::max_pool2d_forward(expected_y.data(), expected_where.data(), x64.data(), plane, p);
      reference::max_pool2d_backward(expected_grad_x.data(), grad_y64.data(), expected_where.data(),
                                     plane, p);
      for (std::int64_t ho = 0; ho < z.Ho; ++ho) {
        for (std::int64_t wo = 0; wo < Wo; ++wo) {
          const std::size_t o = std::size_t(ho * Wo + wo);
          ASSERT_EQ(where[o], float(expected_where[o])) << "window (" << ho << ", " << wo << ")";
          EXPECT_TRUE(std::isnan(expected_y[o]) ? std::isnan(y[o]) : y[o] == expected_y[o]);
        }
      }
      EXPECT_EQ(grad_x, std::vector<float>(expected_grad_x.begin(), expected_grad_x.end()));
    }
  }
  EXPECT_GE(isas, 1);
}

// CUDA against the CPU on FashionNet's first pooling layer, 2x2 windows on an odd
// output width and on odd planes (the general kernels), and an overlapping padded
// window, with ties (values rounded to a coarse grid) that both must break the
// same way; the argmax forms too.
TEST(Pool2dCudaVsCpu, ForwardAndBackward) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  struct Case {
    Shape x;
    Pool2dParams p;
  };
  for (const Case& c : std::vector<Case>{{{128, 32, 28, 28}, Pool2dParams::square(2, 2)},
                                         {{2, 3, 6, 10}, Pool2dParams::square(2, 2)},
                                         {{3, 5, 7, 9}, Pool2dParams::square(2, 2)},
                                         {{3, 5, 31, 29}, Pool2dParams::square(3, 2, 1)}}) {
    const Shape ys = pool2d_output_shape(c.x, c.p);
    auto xv = random_values(static_cast<std::size_t>(numel_of(c.x)), 60);
    for (float& v : xv) v = std::round(v * 4.0f) / 4.0f;  // many ties
    const auto gyv = random_values(static_cast<std::size_t>(numel_of(ys)), 61);
    std::vector<std::vector<float>> results[2];
    for (int k = 0; k < 2; ++k) {
      Stream stream(k == 0 ? Device::cpu() : Device::cuda(0));
      Tensor x = Tensor::from_host<float>(xv, c.x, stream);
      Tensor grad_y = Tensor::from_host<float>(gyv, ys, stream);
      Tensor y = Tensor::empty(ys, stream);
      Tensor grad_x = Tensor::zeros(c.x, stream);
      max_pool2d_forward(y, x, c.p, stream);
      max_pool2d_backward(grad_x, grad_y, x, c.p, stream);
      results[k].push_back(y.to_host<float>(stream));
      results[k].push_back(grad_x.to_host<float>(stream));
      avg_pool2d_forward(y, x, c.p, stream);
      avg_pool2d_backward(grad_x, grad_y, c.p, stream);
      results[k].push_back(y.to_host<float>(stream));
      results[k].push_back(grad_x.to_host<float>(stream));
      Tensor argmax = Tensor::empty(ys, stream);
      max_pool2d_forward_with_argmax(y, argmax, x, c.p, stream);
      max_pool2d_backward_from_argmax(grad_x, grad_y, argmax, c.p, stream);
      results[k].push_back(y.to_host<float>(stream));
      results[k].push_back(argmax.to_host<float>(stream));
      results[k].push_back(grad_x.to_host<float>(stream));
      max_pool2d_backward_from_argmax(grad_x, grad_y, argmax, c.p, stream, GradWrite::Assign);
      results[k].push_back(grad_x.to_host<float>(stream));
    }
    for (std::size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(all_close(results[1][i], results[0][i], 1e-5, 1e-5))
          << "result " << i << " on " << to_string(c.x);
    }
  }
}

}  // namespace
}  // namespace towerlab::testing
