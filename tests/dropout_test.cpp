// Dropout (kernels/dropout.h) on every backend: the reference's masks bit for bit,
// the same mask for a sample wherever the batch is split, the kept fraction, the
// backward's mask equal to the forward's, add-versus-assign, in place, the limits
// p = 0 and p = 1, typed errors, and float64 gradient checks through the tape.
#include <cmath>
#include <limits>
#include <vector>

#include "gradcheck.h"
#include "kernels/dropout.h"
#include "kernels/dropout_unit.h"
#include "kernels/reference/dropout.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class DropoutTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(DropoutTest);

DropoutKey key_for(std::int64_t first_row = 0) {
  return {1234, dropout_subsequence(7, "block1/dropout"), first_row};
}

// What the reference gives for x [rows, D] whose first row is sample first_row.
std::vector<float> reference_forward(const std::vector<float>& x, std::int64_t row_size, double p,
                                     const DropoutKey& key) {
  std::vector<float> y(x.size(), -7.0f);
  reference::dropout_forward(y.data(), x.data(), p, key.seed, key.subsequence,
                             static_cast<std::uint64_t>(key.first_row * row_size),
                             static_cast<std::int64_t>(x.size()));
  return y;
}

TEST_P(DropoutTest, ForwardIsTheReferenceBitForBit) {
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
    for (std::int64_t rows : {1, 3, 129}) {
      const std::int64_t row_size = 37;
      const auto x = random_values(static_cast<std::size_t>(rows * row_size), 3, -2.0f, 2.0f);
      Tensor y = make(std::vector<float>(x.size(), -7.0f), {rows, row_size});
      dropout_forward(y, make(x, {rows, row_size}), p, key_for(5), stream());
      EXPECT_EQ(host(y), reference_forward(x, row_size, p, key_for(5)))
          << "p = " << p << ", rows = " << rows;
    }
  }
}

// p equal to one element's own uniform draw keeps it, a hair above drops it: the
// line between kept and dropped is exactly the reference's (the CPU tests it on
// integers, kernels/cpu/dropout.cpp), checked where an element sits on it.
TEST_P(DropoutTest, AnElementOnTheKeepLineFollowsTheReference) {
  const std::int64_t rows = 3, row_size = 37;
  const DropoutKey key = key_for(5);
  const std::int64_t on_line = 50;  // global element 5 * 37 + 50
  const double u = dropout_unit(key.seed, key.subsequence,
                                static_cast<std::uint64_t>(key.first_row * row_size + on_line));
  const auto x = random_values(static_cast<std::size_t>(rows * row_size), 5, 0.5f, 2.0f);
  for (double p : {u, std::nextafter(u, 0.0), std::nextafter(u, 1.0)}) {
    Tensor y = make(std::vector<float>(x.size(), -7.0f), {rows, row_size});
    dropout_forward(y, make(x, {rows, row_size}), p, key, stream());
    const auto got = host(y);
    EXPECT_EQ(got, reference_forward(x, row_size, p, key)) << "p = " << p;
    EXPECT_EQ(got[on_line] != 0.0f, p <= u) << "p = " << p;
  }
}

// The tower guarantee: rows [0, a) on one tower and [a, R) on another, each with its
// own first_row, give the whole batch's output, for every split.
TEST_P(DropoutTest, ASampleHasOneMaskWhereverTheBatchIsSplit) {
  const std::int64_t rows = 11, row_size = 6;
  const auto x = random_values(rows * row_size, 4, 0.5f, 2.0f);
  Tensor whole = Tensor::empty({rows, row_size}, stream());
  dropout_forward(whole, make(x, {rows, row_size}), 0.5, key_for(), stream());
  const auto expected = host(whole);
  for (std::int64_t split : {0, 1, 4, 10, 11}) {
    std::vector<float> joined;
    for (const auto& [begin, end] : {std::pair{std::int64_t{0}, split}, std::pair{split, rows}}) {
      if (begin == end) continue;
      std::vector<float> part(x.begin() + begin * row_size, x.begin() + end * row_size);
      Tensor y = Tensor::empty({end - begin, row_size}, stream());
      dropout_forward(y, make(part, {end - begin, row_size}), 0.5, key_for(begin), stream());
      const auto got = host(y);
      joined.insert(joined.end(), got.begin(), got.end());
    }
    EXPECT_EQ(joined, expected) << "split at row " << split;
  }
  // Control: a slice keyed as if it were the batch's first rows gets another mask.
  std::vector<float> tail(x.begin() + 4 * row_size, x.end());
  Tensor y = Tensor::empty({rows - 4, row_size}, stream());
  dropout_forward(y, make(tail, {rows - 4, row_size}), 0.5, key_for(0), stream());
  EXPECT_NE(host(y), std::vector<float>(expected.begin() + 4 * row_size, expected.end()));
}

TEST_P(DropoutTest, KeepsAboutOneMinusPAndScalesTheKept) {
  const std::int64_t n = 1 << 20;
  const double p = 0.3;
  Tensor y = Tensor::empty({n}, stream());
  dropout_forward(y, make(std::vector<float>(n, 1.0f), {n}), p, key_for(), stream());
  const float scale = reference::dropout_scale<float>(p);
  std::int64_t kept = 0;
  for (float v : host(y)) {
    ASSERT_TRUE(v == 0.0f || v == scale) << v;
    kept += v != 0.0f;
  }
  // Binomial(n, 0.7): the standard deviation is about 469; allow five of them.
  EXPECT_NEAR(static_cast<double>(kept), 0.7 * n, 5 * std::sqrt(n * p * (1 - p)));
}

TEST_P(DropoutTest, StreamsDifferByStepAndName) {
  const std::int64_t n = 256;
  Tensor x = make(std::vector<float>(n, 1.0f), {n});
  auto mask = [&](std::uint64_t step, const char* name) {
    Tensor y = Tensor::empty({n}, stream());
    dropout_forward(y, x, 0.5, {9, dropout_subsequence(step, name), 0}, stream());
    return host(y);
  };
  EXPECT_EQ(mask(3, "a/dropout"), mask(3, "a/dropout"));
  EXPECT_NE(mask(3, "a/dropout"), mask(4, "a/dropout"));
  EXPECT_NE(mask(3, "a/dropout"), mask(3, "b/dropout"));
}

TEST_P(DropoutTest, BackwardUsesTheForwardsMaskAndAccumulatesOrAssigns) {
  const std::int64_t rows = 5, row_size = 33;
  const auto x = random_values(rows * row_size, 6, 0.5f, 2.0f);  // no zeros: y == 0 means dropped
  Tensor y = Tensor::empty({rows, row_size}, stream());
  dropout_forward(y, make(x, {rows, row_size}), 0.4, key_for(2), stream());
  const auto forward = host(y);
  const auto grad_y = random_values(x.size(), 7);
  Tensor grad_x = make(std::vector<float>(x.size(), 1.0f), {rows, row_size});  // sentinel
  dropout_backward(grad_x, make(grad_y, {rows, row_size}), 0.4, key_for(2), stream());
  const float scale = reference::dropout_scale<float>(0.4);
  const auto accumulated = host(grad_x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float m = forward[i] == 0.0f ? 0.0f : scale;
    ASSERT_EQ(accumulated[i], 1.0f + grad_y[i] * m) << "element " << i;
  }
  Tensor assigned = make(std::vector<float>(x.size(), std::nanf("")), {rows, row_size});
  dropout_backward(assigned, make(grad_y, {rows, row_size}), 0.4, key_for(2), stream(),
                   GradWrite::Assign);
  const auto got = host(assigned);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(got[i], grad_y[i] * (forward[i] == 0.0f ? 0.0f : scale)) << "element " << i;
  }
}

TEST_P(DropoutTest, InPlaceTheLimitsAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = make({1, -2, nan, 4}, {4});
  dropout_forward(x, x, 0.0, key_for(), stream());  // in place, p = 0: the identity
  auto v = host(x);
  EXPECT_TRUE(v[0] == 1 && v[1] == -2 && std::isnan(v[2]) && v[3] == 4);
  dropout_forward(x, x, 1.0, key_for(), stream());  // p = 1: all dropped; NaN * 0 stays NaN
  v = host(x);
  EXPECT_TRUE(v[0] == 0 && v[1] == 0 && std::signbit(v[1]) && std::isnan(v[2]) && v[3] == 0);
  Tensor empty = Tensor::zeros({0, 3}, stream());
  dropout_forward(empty, empty, 0.5, key_for(), stream());
  dropout_backward(empty, empty, 0.5, key_for(), stream());
}

TEST_P(DropoutTest, RejectsBadArguments) {
  Tensor x = Tensor::zeros({2, 3}, stream());
  for (double p : {-0.1, 1.5, std::nan("")}) {
    EXPECT_THROW_WITH(dropout_forward(x, x, p, key_for(), stream()), InvalidArgument,
                      "dropout_forward: p is");
  }
  EXPECT_THROW_WITH(dropout_backward(x, x, 0.5, key_for(-1), stream()), InvalidArgument,
                    "dropout_backward: key.first_row is -1");
  EXPECT_THROW_WITH(dropout_forward(Tensor::zeros({3, 2}, stream()), x, 0.5, key_for(), stream()),
                    ShapeError, "dropout_forward: y is float32[3,2]");
  Tensor half = Tensor::zeros({2, 3}, stream(), DType::Float16);
  EXPECT_THROW_WITH(dropout_forward(half, half, 0.5, key_for(), stream()), NotSupported,
                    "dropout_forward: float16 is not supported");
}

// --- float64 on the CPU --------------------------------------------------------

TEST(DropoutGradient, ThroughTheTape) {
  Tensor x = random_double_tensor({4, 6}, 71);
  Tensor grad = Tensor::zeros({4, 6}, cpu(), DType::Float64);
  const DropoutKey key = key_for(3);
  // x used twice, once through dropout: the two contributions must add up.
  auto loss_fn = [&](const std::vector<Tensor>& in) {
    Tape tape(cpu());
    Var v = tape.constant(in[0]);
    return ag::sum(ag::mul(ag::dropout(v, 0.25, key), v)).value().to_host<double>()[0];
  };
  Tape tape(cpu());
  Var v = tape.variable(x, grad, "x");
  tape.backward(ag::sum(ag::mul(ag::dropout(v, 0.25, key), v)));
  EXPECT_TRUE(check_gradient(loss_fn, {x}, {grad}));
  // The float64 mask is the float32 mask: the same draws decide.
  Tensor y64 = Tensor::empty({4, 6}, cpu(), DType::Float64);
  dropout_forward(y64, x, 0.25, key, cpu());
  Tensor y32 = Tensor::empty({4, 6}, cpu());
  dropout_forward(y32, x.to(DType::Float32, cpu()), 0.25, key, cpu());
  const std::vector<double> a = y64.to_host<double>();
  const std::vector<float> b = y32.to_host<float>();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i] == 0.0, b[i] == 0.0f) << i;
}

TEST(DropoutGradient, EvaluationReturnsTheInput) {
  Tape tape(cpu());
  Var v = tape.constant(random_double_tensor({2, 3}, 72));
  Var out = ag::dropout(v, 0.5, key_for(), false);
  EXPECT_EQ(out.value().data<double>(), v.value().data<double>());
  EXPECT_THROW_WITH(ag::dropout(v, 2.0, key_for(), false), InvalidArgument, "dropout: p is 2");
}

// --- every ISA of the CPU -------------------------------------------------------

// The CPU draws sixteen (AVX-512) or eight (AVX2) Philox counters a vector
// (kernels/cpu/dropout.cpp): every ISA this CPU runs must give the reference's bits,
// forward and backward (assigned, and accumulated into a sentinel), for ranges that
// start on every word of a draw, are shorter than a block, end inside one, span a
// thread's range, and cross the 2^32nd draw (the counter's carry into its high
// word); p on an element's own draw among them.
TEST(DropoutCpu, EveryIsaGivesTheReferenceBits) {
  const RestoreGemmIsa restore;
  const std::int64_t row_size = 4;
  // (first row, rows): element 4 * first_row onward. 2^32 - 5 rows of 4 start at draw
  // 2^32 - 5, so the first vector of draws wraps the counter's low word.
  const std::vector<std::pair<std::int64_t, std::int64_t>> ranges = {
      {0, 1}, {3, 15}, {1, 16}, {2, 17}, {7, 50}, {5, 25001}, {(std::int64_t{1} << 32) - 5, 40}};
  const DropoutKey base = key_for();
  const double on_line = dropout_unit(base.seed, base.subsequence, 4 * 7 + 9);
  int isas = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas;
    for (const auto& [first_row, rows] : ranges) {
      for (double p : {0.0, 0.2, 0.5, on_line, 1.0}) {
        // A shift of one element (an odd row size) starts the range on each word of a draw.
        for (std::int64_t size : {row_size, row_size + 1, row_size + 2, row_size + 3}) {
          const DropoutKey key{base.seed, base.subsequence, first_row};
          const auto n = static_cast<std::size_t>(rows * size);
          const auto x = random_values(n, 9, -2.0f, 2.0f);
          const std::string where = "ISA " + std::to_string(int(isa)) + ", first row " +
                                    std::to_string(first_row) + ", rows " + std::to_string(rows) +
                                    " of " + std::to_string(size) + ", p " + std::to_string(p);
          Tensor y = Tensor::empty({rows, size}, cpu());
          dropout_forward(y, Tensor::from_host<float>(x, {rows, size}, cpu()), p, key, cpu());
          const auto expected = reference_forward(x, size, p, key);
          ASSERT_EQ(bits(y.to_host<float>(cpu())), bits(expected)) << where;

          std::vector<float> accumulated(n, 0.75f), assigned(n);
          const auto e0 = static_cast<std::uint64_t>(first_row * size);
          reference::dropout_backward(accumulated.data(), x.data(), p, key.seed, key.subsequence,
                                      e0, static_cast<std::int64_t>(n), GradWrite::Accumulate);
          reference::dropout_backward(assigned.data(), x.data(), p, key.seed, key.subsequence, e0,
                                      static_cast<std::int64_t>(n), GradWrite::Assign);
          Tensor grad_y = Tensor::from_host<float>(x, {rows, size}, cpu());
          Tensor grad_x =
              Tensor::from_host<float>(std::vector<float>(n, 0.75f), {rows, size}, cpu());
          dropout_backward(grad_x, grad_y, p, key, cpu());
          ASSERT_EQ(bits(grad_x.to_host<float>(cpu())), bits(accumulated)) << where;
          dropout_backward(grad_x, grad_y, p, key, cpu(), GradWrite::Assign);
          ASSERT_EQ(bits(grad_x.to_host<float>(cpu())), bits(assigned)) << where;
          if (p == 0.5 && n >= 64) {  // control: the rows keyed one row later differ
            EXPECT_NE(bits(expected), bits(reference_forward(
                                          x, size, p, {key.seed, key.subsequence, first_row + 1})))
                << where;
          }
        }
      }
    }
  }
  EXPECT_GE(isas, 1);
}

}  // namespace
}  // namespace towerlab::testing
