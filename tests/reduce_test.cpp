// sum, mean and first_nonfinite on every backend (first_nonfinite on every CPU ISA).
#include <limits>
#include <string>
#include <vector>

#include "cpu_isa.h"
#include "kernels/reference/reduce.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class ReduceTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(ReduceTest);

TEST_P(ReduceTest, HandComputed) {
  Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor out = Tensor::empty({1}, stream());
  sum(out, x, stream());
  EXPECT_EQ(host(out)[0], 21.0f);
  mean(out, x, stream());
  EXPECT_EQ(host(out)[0], 3.5f);
}

TEST_P(ReduceTest, OddSizesMatchADoubleSum) {
  for (std::int64_t n : {1, 3, 127, 128, 129, 65537, 3000017}) {
    const auto x = random_values(static_cast<std::size_t>(n), 21, 0.0f, 1.0f);
    const double expected = reference::sum(x.data(), n);
    Tensor out = Tensor::empty({1}, stream());
    sum(out, make(x, {n}), stream());
    EXPECT_NEAR(host(out)[0], expected, 1e-6 * expected + 1e-6) << "n = " << n;
    mean(out, make(x, {n}), stream());
    EXPECT_NEAR(host(out)[0], expected / n, 1e-6) << "n = " << n;
  }
}

TEST_P(ReduceTest, RepeatedReductionsGiveTheSameBits) {
  const auto x = random_values(1 << 20, 22);
  Tensor t = make(x, {1 << 20});
  Tensor out = Tensor::empty({1}, stream());
  sum(out, t, stream());
  const float first = host(out)[0];
  for (int i = 0; i < 5; ++i) {
    sum(out, t, stream());
    EXPECT_EQ(host(out)[0], first);
  }
}

TEST_P(ReduceTest, SumSquaresMatchesTheReferenceAndRepeatsItsBits) {
  for (std::int64_t n : {0, 1, 3, 127, 129, 65537, 1000003}) {
    const auto x = random_values(static_cast<std::size_t>(n), 23, -2.0f, 2.0f);
    const double expected = reference::sum_squares(x.data(), n);
    Tensor t = make(x, {n});
    Tensor out = make({42}, {1});
    sum_squares(out, t, stream());
    const float first = host(out)[0];
    EXPECT_NEAR(first, expected, 2e-6 * expected) << "n = " << n;
    sum_squares(out, t, stream());
    EXPECT_EQ(host(out)[0], first) << "n = " << n;
  }
  EXPECT_EQ(reference::sum_squares(std::vector<double>{3.0, -4.0}.data(), 2), 25.0);
  Tensor out = Tensor::empty({1}, stream());
  sum_squares(out, make({1, -2, 3, 0.5f}, {2, 2}), stream());
  EXPECT_EQ(host(out)[0], 14.25f);
}

TEST_P(ReduceTest, EmptyInputGivesZero) {
  Tensor out = make({42}, {1});
  sum(out, Tensor::empty({0}, stream()), stream());
  EXPECT_EQ(host(out)[0], 0.0f);
  fill(out, 42.0, stream());
  mean(out, Tensor::empty({0, 3}, stream()), stream());
  EXPECT_EQ(host(out)[0], 0.0f);
}

TEST_P(ReduceTest, OutputMustHaveOneElement) {
  Tensor x = Tensor::zeros({4}, stream());
  EXPECT_THROW_WITH(sum(Tensor::empty({2}, stream()), x, stream()), ShapeError,
                    "sum: out must have one element, got float32[2]");
  EXPECT_THROW_WITH(sum_squares(Tensor::empty({0}, stream()), x, stream()), ShapeError,
                    "sum_squares: out must have one element, got float32[0]");
}

// On the CPU once per ISA: the blocks' vector test is compiled for each.
TEST_P(ReduceTest, FirstNonFiniteFindsTheSmallestIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::int64_t n = (1 << 20) + 5;  // many blocks, several threads, a short last one
  for_each_cpu_isa(stream().device(), [&](const std::string& where) {
    SCOPED_TRACE(where);
    std::vector<float> x = random_values(std::size_t(n), 23);
    EXPECT_EQ(first_nonfinite(make(x, {n}), stream()), -1);
    x[std::size_t(n - 1)] = -inf;
    EXPECT_EQ(first_nonfinite(make(x, {n}), stream()), n - 1);
    x[700001] = nan;
    x[900000] = inf;
    EXPECT_EQ(first_nonfinite(make(x, {n}), stream()), 700001);
    x[3] = inf;
    EXPECT_EQ(first_nonfinite(make(x, {n}), stream()), 3);
    x[0] = std::numeric_limits<float>::max();  // large is finite
    EXPECT_EQ(first_nonfinite(make(x, {n}), stream()), 3);
    EXPECT_EQ(first_nonfinite(Tensor::empty({0}, stream()), stream()), -1);
  });
}

}  // namespace
}  // namespace towerlab::testing
