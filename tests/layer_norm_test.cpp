// Layer normalization forward and backward on every backend against its reference,
// with and without weight and bias, at odd sizes and extremes (rows around 1e4,
// constant rows, NaN), add-versus-assign sentinels, the errors, and float64
// gradient checks through the kernels and through the tape.
// The files an op takes, in order: the top of kernels/relu.h.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "cpu_isa.h"
#include "engine/thread_pool.h"
#include "gradcheck.h"
#include "kernels/reference/layer_norm.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The reference's results in float for [rows, cols] values.
struct Expected {
  std::vector<float> y, mean, rstd, grad_x, grad_weight, grad_bias;
};

// The tolerance kernels/layer_norm.h states for the backends, with a NaN expected
// exactly where one is found.
::testing::AssertionResult matches_reference(const std::vector<float>& actual,
                                             const std::vector<float>& expected) {
  std::vector<float> a = actual, e = expected;
  if (a.size() != e.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < e.size(); ++i) {
    if (std::isnan(e[i]) != std::isnan(a[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << ", the reference has " << e[i];
    }
    if (std::isnan(e[i])) a[i] = e[i] = 0.0f;
  }
  return all_close(a, e, 1e-5, 1e-4);
}

class LayerNormTest : public BackendTest {
 protected:
  struct Case {
    std::int64_t rows, cols;
    std::vector<float> x, weight, bias, grad_y;  // weight, bias empty: not given
  };

  Expected reference(const Case& c, float sentinel) {
    Expected e;
    const std::size_t n = c.x.size();
    e.y.resize(n);
    e.mean.resize(std::size_t(c.rows));
    e.rstd.resize(std::size_t(c.rows));
    reference::LayerNormForwardData<float> f{
        .y = e.y.data(),
        .mean = e.mean.data(),
        .rstd = e.rstd.data(),
        .x = c.x.data(),
        .weight = c.weight.empty() ? nullptr : c.weight.data(),
        .bias = c.bias.empty() ? nullptr : c.bias.data(),
        .rows = c.rows,
        .cols = c.cols,
    };
    reference::layer_norm_forward(f, 0, c.rows);
    e.grad_x.assign(n, sentinel);
    e.grad_weight.assign(std::size_t(c.cols), sentinel);
    e.grad_bias.assign(std::size_t(c.cols), sentinel);
    reference::LayerNormBackwardData<float> b{
        .grad_x = e.grad_x.data(),
        .grad_weight = e.grad_weight.data(),
        .grad_bias = e.grad_bias.data(),
        .grad_y = c.grad_y.data(),
        .x = c.x.data(),
        .weight = f.weight,
        .mean = e.mean.data(),
        .rstd = e.rstd.data(),
        .rows = c.rows,
        .cols = c.cols,
    };
    reference::layer_norm_backward_x(b, 0, c.rows);
    reference::layer_norm_backward_params(b, 0, c.cols);
    return e;
  }

  // The forward of c on the backend (weight and bias where c has them).
  LayerNormForward forward(const Case& c) {
    const Shape shape = {c.rows, c.cols};
    const Shape per_row = {c.rows}, per_col = {c.cols};
    LayerNormForward f;
    f.y = Tensor::empty(shape, stream());
    f.mean = Tensor::empty(per_row, stream());
    f.rstd = Tensor::empty(per_row, stream());
    f.x = make(c.x, shape);
    if (!c.weight.empty()) f.weight = make(c.weight, per_col);
    if (!c.bias.empty()) f.bias = make(c.bias, per_col);
    layer_norm_forward(f, stream());
    return f;
  }

  // grad_x alone for c's forward f, assigned over a NaN sentinel that must not be
  // read (GradWrite::Assign); the gradients not asked for are not computed.
  LayerNormBackward assigned_grad_x(const Case& c, const LayerNormForward& f) {
    LayerNormBackward b;
    b.grad_x = make(std::vector<float>(c.x.size(), kNaN), {c.rows, c.cols});
    b.grad_y = make(c.grad_y, {c.rows, c.cols});
    b.x = f.x;
    b.weight = f.weight;
    b.mean = f.mean;
    b.rstd = f.rstd;
    b.grad_x_write = GradWrite::Assign;
    layer_norm_backward(b, stream());
    return b;
  }

  // Forward and backward on the backend: every gradient accumulated onto a
  // sentinel of 0.5, grad_x from the backend's own mean and rstd.
  Expected run(const Case& c, float sentinel) {
    const Shape shape = {c.rows, c.cols};
    const Shape per_col = {c.cols};
    const LayerNormForward f = forward(c);
    LayerNormBackward b;
    b.grad_x = make(std::vector<float>(c.x.size(), sentinel), shape);
    b.grad_weight = make(std::vector<float>(std::size_t(c.cols), sentinel), per_col);
    b.grad_bias = make(std::vector<float>(std::size_t(c.cols), sentinel), per_col);
    b.grad_y = make(c.grad_y, shape);
    b.x = f.x;
    b.weight = f.weight;
    b.mean = f.mean;
    b.rstd = f.rstd;
    layer_norm_backward(b, stream());
    return {host(f.y),      host(f.mean),        host(f.rstd),
            host(b.grad_x), host(b.grad_weight), host(b.grad_bias)};
  }

  void check(const Case& c, const std::string& what) {
    const Expected a = run(c, 0.5f), e = reference(c, 0.5f);
    EXPECT_TRUE(matches_reference(a.y, e.y)) << "y, " << what;
    EXPECT_TRUE(matches_reference(a.mean, e.mean)) << "mean, " << what;
    EXPECT_TRUE(matches_reference(a.rstd, e.rstd)) << "rstd, " << what;
    EXPECT_TRUE(matches_reference(a.grad_x, e.grad_x)) << "grad_x, " << what;
    EXPECT_TRUE(matches_reference(a.grad_weight, e.grad_weight)) << "grad_weight, " << what;
    EXPECT_TRUE(matches_reference(a.grad_bias, e.grad_bias)) << "grad_bias, " << what;
  }

  static Case random_case(std::int64_t rows, std::int64_t cols, bool affine, unsigned seed,
                          float offset = 0.0f) {
    Case c{rows, cols, random_values(std::size_t(rows * cols), seed, offset - 2.0f, offset + 2.0f),
           {},   {},   random_values(std::size_t(rows * cols), seed + 1)};
    if (affine) {
      c.weight = random_values(std::size_t(cols), seed + 2, 0.5f, 1.5f);
      c.bias = random_values(std::size_t(cols), seed + 3);
    }
    return c;
  }
};
TL_INSTANTIATE_BACKENDS(LayerNormTest);

TEST_P(LayerNormTest, MatchesReferenceOnOddSizes) {
  for (bool affine : {true, false}) {
    for (std::int64_t cols : {1, 3, 17, 1000, 4097}) {
      for (std::int64_t rows : {1, 5, 300}) {
        const Case c = random_case(rows, cols, affine, unsigned(rows * 7 + cols));
        check(c, std::to_string(rows) + " x " + std::to_string(cols) +
                     (affine ? ", affine" : ", no affine"));
      }
    }
  }
  // Not trivial: a normalized row has mean 0 and variance 1 (the reference's too).
  const Case c = random_case(3, 1000, false, 5);
  const Expected a = run(c, 0.0f);
  double sum = 0, squares = 0;
  for (std::size_t j = 0; j < 1000; ++j) {
    sum += a.y[j];
    squares += double(a.y[j]) * a.y[j];
  }
  EXPECT_NEAR(sum / 1000, 0.0, 1e-5);
  EXPECT_NEAR(squares / 1000, 1.0, 1e-3);
  EXPECT_GT(std::abs(a.grad_weight[0] - a.grad_bias[0]), 1e-3);
}

TEST_P(LayerNormTest, AnyRankIsRowsOfTheLastDimension) {
  const auto values = random_values(2 * 3 * 5, 13);
  LayerNormForward f;
  f.x = make(values, {2, 3, 5});
  f.y = Tensor::empty({2, 3, 5}, stream());
  f.mean = Tensor::empty({6}, stream());
  f.rstd = Tensor::empty({6}, stream());
  layer_norm_forward(f, stream());
  Case c{6, 5, values, {}, {}, std::vector<float>(30, 1.0f)};
  const Expected e = reference(c, 0.0f);
  EXPECT_TRUE(matches_reference(host(f.y), e.y));
  EXPECT_TRUE(matches_reference(host(f.mean), e.mean));
}

TEST_P(LayerNormTest, LargeOffsetsConstantRowsAndNaN) {
  // Rows around 1e4 with a spread of 2: the variance is not lost to cancellation.
  const Case big = random_case(5, 1000, true, 17, 1e4f);
  check(big, "rows around 1e4");
  const Expected a = run(big, 0.0f);
  double squares = 0;
  for (std::size_t j = 0; j < 1000; ++j) {
    const double x_hat = (double(a.y[j]) - big.bias[j]) / big.weight[j];
    squares += x_hat * x_hat;
  }
  EXPECT_NEAR(squares / 1000, 1.0, 1e-2);
  // A constant row: variance 0, rstd = 1 / sqrt(eps), y = bias, x_hat = 0 and so
  // grad_x = rstd (grad_y - mean(grad_y)) (weight 1).
  Case flat{
      2, 4, {3, 3, 3, 3, 1, 2, 3, 4}, {1, 1, 1, 1}, {0.5f, 0.25f, 0, -1}, {1, 2, 3, 4, 1, 1, 1, 1}};
  check(flat, "a constant row");
  const Expected f = run(flat, 0.0f);
  EXPECT_EQ(f.mean[0], 3.0f);
  EXPECT_NEAR(f.rstd[0], 1.0 / std::sqrt(1e-5), 1e-2);
  for (std::size_t j = 0; j < 4; ++j) EXPECT_EQ(f.y[j], flat.bias[j]);
  for (std::size_t j = 0; j < 4; ++j) {
    EXPECT_NEAR(f.grad_x[j] / (flat.grad_y[j] - 2.5) * std::sqrt(1e-5), 1.0, 1e-4) << j;
  }
  // A NaN: its row is NaN (statistics, y, grad_x) and so is every grad_weight; the
  // other rows and grad_bias's other columns are not.
  Case nan = random_case(3, 5, true, 19);
  nan.x[7] = kNaN;  // row 1
  check(nan, "NaN");
  const Expected n = run(nan, 0.0f);
  EXPECT_TRUE(std::isnan(n.mean[1]) && std::isnan(n.rstd[1]));
  EXPECT_FALSE(std::isnan(n.mean[0]) || std::isnan(n.mean[2]));
  for (std::size_t j = 0; j < 15; ++j) {
    EXPECT_EQ(std::isnan(n.y[j]), j >= 5 && j < 10) << j;
    EXPECT_EQ(std::isnan(n.grad_x[j]), j >= 5 && j < 10) << j;
  }
  for (std::size_t j = 0; j < 5; ++j) EXPECT_TRUE(std::isnan(n.grad_weight[j])) << j;
  for (std::size_t j = 0; j < 5; ++j) EXPECT_FALSE(std::isnan(n.grad_bias[j])) << j;
}

TEST_P(LayerNormTest, GradientsAccumulateOrAssign) {
  const Case c = random_case(4, 6, true, 23);
  const Expected once = reference(c, 0.0f);
  // Every gradient accumulates onto a sentinel of 1.
  const Expected added = run(c, 1.0f);
  auto plus_one = [](std::vector<float> v) {
    for (float& x : v) x += 1.0f;
    return v;
  };
  EXPECT_TRUE(all_close(added.grad_x, plus_one(once.grad_x), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(added.grad_weight, plus_one(once.grad_weight), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(added.grad_bias, plus_one(once.grad_bias), 1e-5, 1e-4));
  // grad_x assigned over a NaN sentinel, which must not be read; the gradients not
  // asked for are not computed.
  const LayerNormForward f = forward(c);
  const LayerNormBackward b = assigned_grad_x(c, f);
  EXPECT_TRUE(all_close(host(b.grad_x), once.grad_x, 1e-5, 1e-4));
  // grad_bias alone.
  LayerNormBackward only_bias;
  only_bias.grad_bias = make(std::vector<float>(6, 2.0f), {6});
  only_bias.grad_y = b.grad_y;
  only_bias.x = f.x;
  only_bias.mean = f.mean;
  only_bias.rstd = f.rstd;
  layer_norm_backward(only_bias, stream());
  std::vector<float> expected_bias = once.grad_bias;
  for (float& v : expected_bias) v += 2.0f;
  EXPECT_TRUE(all_close(host(only_bias.grad_bias), expected_bias, 1e-5, 1e-4));
}

TEST_P(LayerNormTest, DeterministicAndInPlace) {
  const Case c = random_case(300, 257, true, 29);
  const Expected a = run(c, 0.0f), b = run(c, 0.0f);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.grad_x, b.grad_x);
  EXPECT_EQ(a.grad_weight, b.grad_weight);  // the same bits every run
  EXPECT_EQ(a.grad_bias, b.grad_bias);
  LayerNormForward f;
  f.x = make(c.x, {300, 257});
  f.y = f.x;  // in place
  f.weight = make(c.weight, {257});
  f.bias = make(c.bias, {257});
  f.mean = Tensor::empty({300}, stream());
  f.rstd = Tensor::empty({300}, stream());
  layer_norm_forward(f, stream());
  EXPECT_EQ(host(f.y), a.y);
}

// The CPU's own paths: on the CPU only (a CUDA case that skips would go unrun on
// the emulated GPUs, where every CUDA case must run).
class LayerNormCpuTest : public LayerNormTest {};
INSTANTIATE_TEST_SUITE_P(Cpu, LayerNormCpuTest, ::testing::Values(Device::cpu()), backend_name);

// The CPU's float32 path is the reference's double arithmetic in vector lanes
// (kernels/cpu/layer_norm.cpp), held on every ISA to the tolerance kernels/layer_norm.h
// states for it, 2e-7 + 1e-6 |reference|, much tighter than the backends' 1e-5 +
// 1e-4: widths below, at and past a group of lanes and with a partial group, rows
// around 1e4, gradients added onto a sentinel and assigned over NaN. The control
// shows the check is not silent: the reference at another eps (a relative change
// of a few 1e-6 in y) is outside it.
TEST_P(LayerNormCpuTest, LanesWithinTheirTolerance) {
  const auto tight = [](const std::vector<float>& actual, const std::vector<float>& expected) {
    return all_close(actual, expected, 2e-7, 1e-6);
  };
  for_each_cpu_isa(device(), [&](const std::string& isa) {
    for (bool affine : {true, false}) {
      for (std::int64_t cols : {1, 3, 4, 7, 8, 9, 16, 17, 33, 64, 67}) {
        for (float offset : {0.0f, 1e4f}) {
          const Case c = random_case(37, cols, affine, unsigned(cols * 3 + affine), offset);
          const std::string what = isa + ", 37 x " + std::to_string(cols) +
                                   (affine ? ", affine" : "") + ", offset " +
                                   std::to_string(offset);
          const Expected a = run(c, 0.5f), e = reference(c, 0.5f);
          EXPECT_TRUE(tight(a.y, e.y)) << "y, " << what;
          EXPECT_TRUE(tight(a.mean, e.mean)) << "mean, " << what;
          EXPECT_TRUE(tight(a.rstd, e.rstd)) << "rstd, " << what;
          EXPECT_TRUE(tight(a.grad_x, e.grad_x)) << "grad_x, " << what;
          EXPECT_TRUE(tight(a.grad_weight, e.grad_weight)) << "grad_weight, " << what;
          EXPECT_TRUE(tight(a.grad_bias, e.grad_bias)) << "grad_bias, " << what;
        }
      }
    }
    // grad_x assigned over NaN (never read), against the reference's assigned one.
    const Case c = random_case(5, 19, true, 41);
    const LayerNormBackward b = assigned_grad_x(c, forward(c));
    EXPECT_TRUE(tight(host(b.grad_x), reference(c, 0.0f).grad_x)) << "assigned, " << isa;
  });
  // Control: y from the reference at eps 2e-5 instead of 1e-5 fails the check.
  const Case c = random_case(37, 64, true, 43);
  std::vector<float> other_eps(c.x.size()), mean(37), rstd(37);
  reference::layer_norm_forward(reference::LayerNormForwardData<float>{.y = other_eps.data(),
                                                                       .mean = mean.data(),
                                                                       .rstd = rstd.data(),
                                                                       .x = c.x.data(),
                                                                       .weight = c.weight.data(),
                                                                       .bias = c.bias.data(),
                                                                       .rows = 37,
                                                                       .cols = 64,
                                                                       .eps = 2e-5},
                                0, 37);
  EXPECT_FALSE(tight(run(c, 0.0f).y, other_eps));
}

// The CPU's float32 forward and grad_x take rows four at a time (kernels/cpu/
// layer_norm.cpp: their sums' chains side by side), the rest one at a time: each
// row's y, mean, rstd and grad_x (assigned over NaN) are the bits it has alone, as a
// [1, D] tensor, on every ISA, for widths with and without a partial group of lanes,
// with and without weight and bias, on one thread and with three asked for (a range
// may then start between blocks of four). Control: a row alone with one value of x
// 1e-3 off differs from the row taken together.
TEST_P(LayerNormCpuTest, RowsTakenTogetherHaveEachRowsBits) {
  const int saved = num_threads();
  for_each_cpu_isa(device(), [&](const std::string& isa) {
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      for (bool affine : {true, false}) {
        for (std::int64_t cols : {7, 64, 67}) {
          const std::int64_t rows = 11;
          const Case c = random_case(rows, cols, affine, unsigned(cols * 5 + affine), 3.0f);
          const LayerNormForward whole = forward(c);
          const std::vector<float> y = host(whole.y), mean = host(whole.mean),
                                   rstd = host(whole.rstd),
                                   grad_x = host(assigned_grad_x(c, whole).grad_x);
          for (std::int64_t r = 0; r < rows; ++r) {
            SCOPED_TRACE(::testing::Message()
                         << isa << ", " << threads << " threads, " << rows << " x " << cols
                         << (affine ? ", affine" : "") << ", row " << r);
            Case one{
                1,
                cols,
                std::vector<float>(c.x.begin() + r * cols, c.x.begin() + (r + 1) * cols),
                c.weight,
                c.bias,
                std::vector<float>(c.grad_y.begin() + r * cols, c.grad_y.begin() + (r + 1) * cols)};
            const LayerNormForward alone = forward(one);
            EXPECT_EQ(host(alone.y),
                      std::vector<float>(y.begin() + r * cols, y.begin() + (r + 1) * cols));
            EXPECT_EQ(
                host(assigned_grad_x(one, alone).grad_x),
                std::vector<float>(grad_x.begin() + r * cols, grad_x.begin() + (r + 1) * cols));
            EXPECT_EQ(host(alone.mean)[0], mean[std::size_t(r)]);
            EXPECT_EQ(host(alone.rstd)[0], rstd[std::size_t(r)]);
            one.x.back() += 1e-3f;
            EXPECT_NE(host(forward(one).y),
                      std::vector<float>(y.begin() + r * cols, y.begin() + (r + 1) * cols))
                << "control";
          }
        }
      }
    }
  });
  set_num_threads(saved);
}

TEST_P(LayerNormTest, RejectsBadShapesAndArguments) {
  LayerNormForward f;
  f.x = Tensor::zeros({2, 3}, stream());
  f.y = Tensor::zeros({2, 3}, stream());
  f.mean = Tensor::zeros({2}, stream());
  f.rstd = Tensor::zeros({2}, stream());
  f.weight = Tensor::zeros({4}, stream());
  EXPECT_THROW_WITH(layer_norm_forward(f, stream()), ShapeError,
                    "layer_norm_forward: weight is float32[4] on " + device().str() +
                        " but x float32[2,3] on " + device().str() + " has D = 3 (expected [3])");
  f.weight = Tensor();
  f.rstd = Tensor::zeros({3}, stream());
  EXPECT_THROW_WITH(layer_norm_forward(f, stream()), ShapeError,
                    "layer_norm_forward: rstd is float32[3] on " + device().str() +
                        " but x float32[2,3] on " + device().str() +
                        " has R = 2 rows (expected [2])");
  f.rstd = Tensor::zeros({2}, stream());
  f.y = Tensor::zeros({3, 2}, stream());
  EXPECT_THROW_WITH(layer_norm_forward(f, stream()), ShapeError,
                    "layer_norm_forward: y is float32[3,2]");
  f.y = Tensor::zeros({2, 3}, stream());
  f.eps = -1.0;
  EXPECT_THROW_WITH(layer_norm_forward(f, stream()), InvalidArgument,
                    "layer_norm_forward: eps is -1; it must be finite and >= 0");
  f.eps = 1e-5;
  f.mean = Tensor();
  EXPECT_THROW_WITH(layer_norm_forward(f, stream()), InvalidArgument,
                    "layer_norm_forward: mean is undefined");
  LayerNormBackward b;
  b.x = Tensor::zeros({2, 3}, stream());
  b.grad_y = Tensor::zeros({2, 3}, stream());
  b.mean = Tensor::zeros({2}, stream());
  b.rstd = Tensor::zeros({2}, stream());
  b.grad_weight = Tensor::zeros({2}, stream());
  EXPECT_THROW_WITH(layer_norm_backward(b, stream()), ShapeError,
                    "layer_norm_backward: grad_weight is float32[2]");
  Tensor h = Tensor::zeros({2, 3}, stream(), DType::BFloat16);
  f.x = h;
  f.y = h;
  EXPECT_THROW_WITH(layer_norm_forward(f, stream()), NotSupported,
                    "layer_norm_forward: bfloat16 is not supported");
  b.grad_weight = Tensor();
  b.grad_y = Tensor::zeros({2, 3}, stream(), DType::Float16);
  EXPECT_THROW_WITH(layer_norm_backward(b, stream()), NotSupported,
                    "layer_norm_backward: float16 is not supported");
}

// The reference at points computed by PyTorch (torch.nn.functional.layer_norm,
// float64), so the specification is not wrong in the same way as the backends.
TEST(LayerNormReference, KnownValues) {
  const std::vector<double> x = {1, 2, 3, 4}, w = {0.5, -1, 2, 1.5}, b = {0.1, 0.2, 0.3, 0.4};
  std::vector<double> y(4), mean(1), rstd(1);
  reference::LayerNormForwardData<double> d{.y = y.data(),
                                            .mean = mean.data(),
                                            .rstd = rstd.data(),
                                            .x = x.data(),
                                            .weight = nullptr,
                                            .bias = nullptr,
                                            .rows = 1,
                                            .cols = 4};
  reference::layer_norm_forward(d, 0, 1);
  EXPECT_NEAR(y[0], -1.341635419968927, 1e-14);
  EXPECT_NEAR(y[2], 0.4472118066563089, 1e-14);
  EXPECT_DOUBLE_EQ(mean[0], 2.5);
  d.weight = w.data();
  d.bias = b.data();
  d.eps = 1e-3;
  reference::layer_norm_forward(d, 0, 1);
  EXPECT_NEAR(y[0], -0.5705522259822752, 1e-14);
  EXPECT_NEAR(y[1], 0.6470348173215168, 1e-14);
  EXPECT_NEAR(y[3], 2.4116566779468256, 1e-14);
}

TEST(LayerNormGradient, MatchesCentralDifferences) {
  const Stream& cpu = default_stream(Device::cpu());
  for (bool affine : {true, false}) {
    const Shape shape = {3, 2, 7};
    Tensor x = random_double_tensor(shape, 71, -2.0, 2.0);
    Tensor w = random_double_tensor({7}, 72, 0.5, 1.5);
    Tensor b = random_double_tensor({7}, 73);
    Tensor g = random_double_tensor(shape, 74);
    auto forward = [&](const std::vector<Tensor>& in) {
      LayerNormForward f;
      f.x = in[0];
      if (affine) {
        f.weight = in[1];
        f.bias = in[2];
      }
      f.y = Tensor::empty(shape, cpu, DType::Float64);
      f.mean = Tensor::empty({6}, cpu, DType::Float64);
      f.rstd = Tensor::empty({6}, cpu, DType::Float64);
      layer_norm_forward(f, cpu);
      return f;
    };
    auto loss = [&](const std::vector<Tensor>& in) { return weighted_sum(g, forward(in).y); };
    const LayerNormForward f = forward({x, w, b});
    LayerNormBackward args;
    args.grad_x = Tensor::zeros(shape, cpu, DType::Float64);
    args.grad_weight = Tensor::zeros({7}, cpu, DType::Float64);
    args.grad_bias = Tensor::zeros({7}, cpu, DType::Float64);
    args.grad_y = g;
    args.x = x;
    args.weight = f.weight;
    args.mean = f.mean;
    args.rstd = f.rstd;
    layer_norm_backward(args, cpu);
    if (affine) {
      EXPECT_TRUE(check_gradient(loss, {x, w, b}, {args.grad_x, args.grad_weight, args.grad_bias}));
    } else {
      EXPECT_TRUE(check_gradient(loss, {x}, {args.grad_x}));
    }
  }
}

TEST(LayerNormGradient, ThroughTheTape) {
  Tensor x = random_double_tensor({4, 5}, 81, -2.0, 2.0);
  Tensor w = random_double_tensor({5}, 82, 0.5, 1.5);
  Tensor b = random_double_tensor({5}, 83);
  Tensor c = random_double_tensor({4, 5}, 84);
  Tensor grad_x = Tensor::zeros({4, 5}, cpu(), DType::Float64);
  Tensor grad_w = Tensor::zeros({5}, cpu(), DType::Float64);
  Tensor grad_b = Tensor::zeros({5}, cpu(), DType::Float64);
  // x used twice (normalized, then multiplied by itself); a constant weighting.
  auto build = [&](Tape& tape, const Var& vx, const Var& vw, const Var& vb) {
    return ag::sum(ag::mul(ag::mul(ag::layer_norm(vx, vw, vb), vx), tape.constant(c)));
  };
  auto loss_fn = [&](const std::vector<Tensor>& in) {
    Tape tape(cpu());
    return build(tape, tape.constant(in[0]), tape.constant(in[1]), tape.constant(in[2]))
        .value()
        .to_host<double>()[0];
  };
  Tape tape(cpu());
  tape.backward(build(tape, tape.variable(x, grad_x, "x"), tape.variable(w, grad_w, "w"),
                      tape.variable(b, grad_b, "b")));
  EXPECT_TRUE(check_gradient(loss_fn, {x, w, b}, {grad_x, grad_w, grad_b}));
  // Without weight and bias.
  Tensor grad_plain = Tensor::zeros({4, 5}, cpu(), DType::Float64);
  auto plain_fn = [&](const std::vector<Tensor>& in) {
    Tape t(cpu());
    Var v = t.constant(in[0]);
    return ag::sum(ag::mul(ag::layer_norm(v), t.constant(c))).value().to_host<double>()[0];
  };
  Tape t(cpu());
  t.backward(ag::sum(ag::mul(ag::layer_norm(t.variable(x, grad_plain, "x")), t.constant(c))));
  EXPECT_TRUE(check_gradient(plain_fn, {x}, {grad_plain}));
}

// Inputs and outputs for tests/ops_vs_torch_test.py (ctest ops_vs_torch), as
// SoftmaxVsTorch.WritesCases does: per backend and dtype, x [7,33] (row 3 around
// 100), weight, bias, grad_y, eps 1e-5, then y, mean, rstd and the three gradients.
TEST(LayerNormVsTorch, WritesCases) {
  auto x_values = random_values(7 * 33, 95, -2.0f, 2.0f);
  for (std::size_t j = 3 * 33; j < 4 * 33; ++j) x_values[j] += 100.0f;
  const auto w_values = random_values(33, 96, 0.5f, 1.5f);
  const auto b_values = random_values(33, 97);
  const auto gy_values = random_values(7 * 33, 98);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const TorchCaseBackend& backend : torch_case_backends()) {
    const Stream& stream = backend.stream();
    const DType dtype = backend.dtype;
    LayerNormForward f;
    f.x = backend.make(x_values, {7, 33});
    f.weight = backend.make(w_values, {33});
    f.bias = backend.make(b_values, {33});
    f.y = Tensor::empty({7, 33}, stream, dtype);
    f.mean = Tensor::empty({7}, stream, dtype);
    f.rstd = Tensor::empty({7}, stream, dtype);
    layer_norm_forward(f, stream);
    LayerNormBackward b;
    b.grad_x = Tensor::zeros({7, 33}, stream, dtype);
    b.grad_weight = Tensor::zeros({33}, stream, dtype);
    b.grad_bias = Tensor::zeros({33}, stream, dtype);
    b.grad_y = backend.make(gy_values, {7, 33});
    b.x = f.x;
    b.weight = f.weight;
    b.mean = f.mean;
    b.rstd = f.rstd;
    layer_norm_backward(b, stream);
    for (const auto& [name, t] :
         std::vector<std::pair<std::string, Tensor>>{{"x", f.x},
                                                     {"weight", f.weight},
                                                     {"bias", f.bias},
                                                     {"grad_y", b.grad_y},
                                                     {"y", f.y},
                                                     {"mean", f.mean},
                                                     {"rstd", f.rstd},
                                                     {"grad_x", b.grad_x},
                                                     {"grad_weight", b.grad_weight},
                                                     {"grad_bias", b.grad_bias}}) {
      out.emplace_back(backend.prefix + name, t);
    }
  }
  write_torch_cases("layer_norm.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
