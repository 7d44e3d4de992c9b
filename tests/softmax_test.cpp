// Softmax and log-softmax forward and backward on every backend against their
// reference, with and without the causal mask, at the extremes (logits of +-1e4,
// -inf, NaN), add-versus-assign sentinels, the errors, and float64 gradient checks
// through the kernels and through the tape.
// The files an op takes, in order: the top of kernels/relu.h.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "cpu_isa.h"
#include "gradcheck.h"
#include "kernels/reference/softmax.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const char* name(SoftmaxKind kind) {
  return kind == SoftmaxKind::Softmax ? "softmax" : "log_softmax";
}

const char* name(SoftmaxMask mask) {
  return mask == SoftmaxMask::Causal ? "causal" : "no mask";
}

void forward(SoftmaxKind kind, const Tensor& y, const Tensor& x, SoftmaxMask mask,
             const Stream& stream) {
  (kind == SoftmaxKind::Softmax ? softmax_forward : log_softmax_forward)(y, x, mask, stream);
}

void backward(SoftmaxKind kind, const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
              SoftmaxMask mask, const Stream& stream, GradWrite write = GradWrite::Accumulate) {
  (kind == SoftmaxKind::Softmax ? softmax_backward : log_softmax_backward)(grad_x, grad_y, y, mask,
                                                                           stream, write);
}

// The reference in float on [rows, cols] values.
std::vector<float> reference_forward(const std::vector<float>& x, std::int64_t cols,
                                     SoftmaxKind kind, SoftmaxMask mask) {
  std::vector<float> y(x.size());
  reference::softmax_forward(y.data(), x.data(), 0, std::int64_t(x.size()) / cols, cols, kind,
                             mask);
  return y;
}

std::vector<float> reference_backward(std::vector<float> grad_x, const std::vector<float>& grad_y,
                                      const std::vector<float>& y, std::int64_t cols,
                                      SoftmaxKind kind, SoftmaxMask mask, GradWrite write) {
  reference::softmax_backward(grad_x.data(), grad_y.data(), y.data(), 0,
                              std::int64_t(y.size()) / cols, cols, kind, mask, write);
  return grad_x;
}

// all_close within kernels/softmax.h's tolerance, with a NaN expected exactly where
// one is found and infinities equal.
::testing::AssertionResult matches_reference(const std::vector<float>& actual,
                                             const std::vector<float>& expected) {
  std::vector<float> a = actual, e = expected;
  if (a.size() != e.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < e.size(); ++i) {
    if (std::isnan(e[i]) != std::isnan(a[i]) || (std::isinf(e[i]) && a[i] != e[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << ", the reference has " << e[i];
    }
    if (!std::isfinite(e[i])) a[i] = e[i] = 0.0f;
  }
  return all_close(a, e, 1e-6, 1e-5);
}

class SoftmaxTest : public BackendTest {
 protected:
  // Forward, then backward into a sentinel of 0.5 (accumulated), each against the
  // reference; returns the forward's output.
  std::vector<float> check_both(SoftmaxKind kind, const std::vector<float>& values,
                                const std::vector<float>& grad_y, const Shape& shape,
                                SoftmaxMask mask, const std::string& what) {
    const std::int64_t cols = shape.back();
    Tensor x = make(values, shape);
    Tensor y = Tensor::empty(shape, stream());
    forward(kind, y, x, mask, stream());
    const auto out = host(y);
    const auto expected = reference_forward(values, cols, kind, mask);
    EXPECT_TRUE(matches_reference(out, expected)) << name(kind) << ", " << what;
    const std::vector<float> sentinel(values.size(), 0.5f);
    Tensor grad_x = make(sentinel, shape);
    backward(kind, grad_x, make(grad_y, shape), y, mask, stream());
    // The reference's backward from the reference's output, so that the forward's
    // rounding is not counted twice.
    EXPECT_TRUE(matches_reference(
        host(grad_x),
        reference_backward(sentinel, grad_y, expected, cols, kind, mask, GradWrite::Accumulate)))
        << name(kind) << "' , " << what;
    return out;
  }
};
TL_INSTANTIATE_BACKENDS(SoftmaxTest);

constexpr SoftmaxKind kKinds[] = {SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax};

TEST_P(SoftmaxTest, MatchesReferenceOnOddSizes) {
  for (SoftmaxKind kind : kKinds) {
    for (std::int64_t cols : {1, 3, 17, 1000, 4097}) {
      for (std::int64_t rows : {1, 5, 300}) {
        const std::size_t n = std::size_t(rows * cols);
        const auto values = random_values(n, unsigned(cols + rows), -6.0f, 6.0f);
        const auto grad_y = random_values(n, unsigned(cols * rows + 1));
        const auto out = check_both(kind, values, grad_y, {rows, cols}, SoftmaxMask::None,
                                    std::to_string(rows) + " x " + std::to_string(cols));
        // Not trivial: each softmax row sums to 1 and has a value below 1 when D > 1.
        if (kind == SoftmaxKind::Softmax) {
          double sum = 0;
          for (std::int64_t j = 0; j < cols; ++j) sum += out[std::size_t(j)];
          EXPECT_NEAR(sum, 1.0, 1e-5);
          if (cols > 1) EXPECT_LT(out[0], 1.0f);
        }
      }
    }
  }
}

TEST_P(SoftmaxTest, AnyRankIsRowsOfTheLastDimension) {
  // [2,3,5] is 6 rows of 5: the same numbers as [6,5].
  const auto values = random_values(30, 3, -2.0f, 2.0f);
  for (SoftmaxKind kind : kKinds) {
    Tensor y3 = Tensor::empty({2, 3, 5}, stream());
    Tensor y2 = Tensor::empty({6, 5}, stream());
    forward(kind, y3, make(values, {2, 3, 5}), SoftmaxMask::None, stream());
    forward(kind, y2, make(values, {6, 5}), SoftmaxMask::None, stream());
    EXPECT_EQ(host(y3), host(y2)) << name(kind);
    Tensor y1 = Tensor::empty({30}, stream());  // a vector is one row
    forward(kind, y1, make(values, {30}), SoftmaxMask::None, stream());
    EXPECT_TRUE(
        matches_reference(host(y1), reference_forward(values, 30, kind, SoftmaxMask::None)));
  }
}

TEST_P(SoftmaxTest, CausalMaskExcludesLaterKeys) {
  for (SoftmaxKind kind : kKinds) {
    for (const Shape& shape : {Shape{1, 1}, Shape{3, 3}, Shape{17, 17}, Shape{2, 3, 40, 40}}) {
      const std::int64_t t = shape.back();
      std::int64_t n = 1;
      for (std::int64_t d : shape) n *= d;
      auto values = random_values(std::size_t(n), unsigned(t), -4.0f, 4.0f);
      auto grad_y = random_values(std::size_t(n), unsigned(t + 7));
      // Masked entries are never read: NaN there must not reach anything.
      for (std::int64_t r = 0; r < n / t; ++r) {
        for (std::int64_t j = r % t + 1; j < t; ++j) {
          values[std::size_t(r * t + j)] = kNaN;
          grad_y[std::size_t(r * t + j)] = kNaN;
        }
      }
      const auto out = check_both(kind, values, grad_y, shape, SoftmaxMask::Causal,
                                  "causal " + std::to_string(t));
      Tensor y = make(out, shape);
      Tensor grad_x = make(std::vector<float>(std::size_t(n), kNaN), shape);  // assigned
      backward(kind, grad_x, make(grad_y, shape), y, SoftmaxMask::Causal, stream(),
               GradWrite::Assign);
      const auto grad = host(grad_x);
      for (std::int64_t r = 0; r < n / t; ++r) {
        const std::int64_t i = r % t;
        double sum = 0;
        for (std::int64_t j = 0; j < t; ++j) {
          const std::size_t at = std::size_t(r * t + j);
          if (j > i) {
            EXPECT_EQ(out[at], kind == SoftmaxKind::Softmax ? 0.0f : -kInf) << r << "," << j;
            EXPECT_EQ(grad[at], 0.0f) << r << "," << j;
          } else {
            EXPECT_TRUE(std::isfinite(out[at]) && std::isfinite(grad[at])) << r << "," << j;
            sum += kind == SoftmaxKind::Softmax ? out[at] : std::exp(double(out[at]));
          }
        }
        EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << r;
      }
      // The first query sees only itself.
      EXPECT_EQ(out[0], kind == SoftmaxKind::Softmax ? 1.0f : 0.0f);
    }
  }
}

TEST_P(SoftmaxTest, LargeLogitsAndInfinities) {
  const std::int64_t cols = 4;
  const std::vector<float> values = {
      1e4f,  -1e4f, 0.0f,  1e4f - 1.0f,   // large logits: no overflow
      -1e4f, -1e4f, -1e4f, -1e4f + 2.0f,  // all large and negative: no underflow to 0 / 0
      -kInf, 0.0f,  1.0f,  -kInf,         // -inf entries: exactly 0 / -inf
      -kInf, -kInf, -kInf, -kInf,         // a row of -inf: NaN, as PyTorch
      2.0f,  kNaN,  1.0f,  0.0f,          // NaN: the whole row
      kInf,  0.0f,  1.0f,  2.0f};         // +inf: NaN (inf - inf)
  const std::vector<float> grad_y = random_values(values.size(), 9);
  for (SoftmaxKind kind : kKinds) {
    const auto out = check_both(kind, values, grad_y, {6, cols}, SoftmaxMask::None, "extremes");
    auto at = [&](std::int64_t r, std::int64_t j) { return out[std::size_t(r * cols + j)]; };
    const bool soft = kind == SoftmaxKind::Softmax;
    EXPECT_NEAR(at(0, 0), soft ? 1.0f / (1.0f + std::exp(-1.0f)) : -std::log1p(std::exp(-1.0f)),
                1e-6);
    EXPECT_EQ(at(0, 1), soft ? 0.0f : -2e4f - std::log1p(std::exp(-1.0f)));
    EXPECT_TRUE(std::isfinite(at(1, 0)) && at(1, 3) > at(1, 0));
    EXPECT_EQ(at(2, 0), soft ? 0.0f : -kInf);
    EXPECT_EQ(at(2, 3), soft ? 0.0f : -kInf);
    EXPECT_TRUE(std::isfinite(at(2, 1)) && std::isfinite(at(2, 2)));
    for (std::int64_t r = 3; r < 6; ++r) {
      for (std::int64_t j = 0; j < cols; ++j) EXPECT_TRUE(std::isnan(at(r, j))) << r << "," << j;
    }
    // The backward keeps the NaN rows NaN and gives the -inf entries 0 (softmax) or
    // grad_y (log-softmax).
    Tensor grad_x = Tensor::empty({6, cols}, stream());
    backward(kind, grad_x, make(grad_y, {6, cols}), make(out, {6, cols}), SoftmaxMask::None,
             stream(), GradWrite::Assign);
    const auto grad = host(grad_x);
    EXPECT_EQ(grad[8], soft ? 0.0f : grad_y[8]);
    for (std::size_t i = 0; i < 12; ++i) EXPECT_TRUE(std::isfinite(grad[i])) << i;
    for (std::size_t i = 12; i < 24; ++i) EXPECT_TRUE(std::isnan(grad[i])) << i;
  }
}

TEST_P(SoftmaxTest, BackwardAccumulatesOrAssigns) {
  const std::vector<float> values = {-1.5f, -0.25f, 0.5f, 2.0f, 0.0f, 1.0f, 3.0f, -2.0f, 0.5f};
  const std::vector<float> grad_y = {10, 20, 30, 40, 50, 60, 70, 80, 90};
  for (SoftmaxKind kind : kKinds) {
    for (SoftmaxMask mask : {SoftmaxMask::None, SoftmaxMask::Causal}) {
      const auto y_values = reference_forward(values, 3, kind, mask);
      Tensor y = make(y_values, {3, 3});
      Tensor gy = make(grad_y, {3, 3});
      const auto contribution = reference_backward(std::vector<float>(9, 0.0f), grad_y, y_values, 3,
                                                   kind, mask, GradWrite::Assign);
      Tensor grad_x = make(std::vector<float>(9, 1.0f), {3, 3});  // sentinel: must be added to
      backward(kind, grad_x, gy, y, mask, stream());
      std::vector<float> expected;
      for (float c : contribution) expected.push_back(1.0f + c);
      // atol 1e-5: grad_y up to 90 makes float's rounding of the terms about 90 * 2^-24.
      EXPECT_TRUE(all_close(host(grad_x), expected, 1e-5)) << name(kind) << ", " << name(mask);
      Tensor assigned = make(std::vector<float>(9, kNaN), {3, 3});  // sentinel: must not be read
      backward(kind, assigned, gy, y, mask, stream(), GradWrite::Assign);
      EXPECT_TRUE(all_close(host(assigned), contribution, 1e-5))
          << name(kind) << ", " << name(mask);
      // grad_x may be grad_y itself when assigned.
      Tensor in_place = make(grad_y, {3, 3});
      backward(kind, in_place, in_place, y, mask, stream(), GradWrite::Assign);
      EXPECT_TRUE(all_close(host(in_place), contribution, 1e-5)) << name(kind) << " in place";
    }
  }
}

TEST_P(SoftmaxTest, ForwardInPlaceAndDeterministic) {
  const auto values = random_values(300 * 17, 11, -3.0f, 3.0f);
  for (SoftmaxKind kind : kKinds) {
    Tensor a = Tensor::empty({300, 17}, stream());
    Tensor b = Tensor::empty({300, 17}, stream());
    forward(kind, a, make(values, {300, 17}), SoftmaxMask::None, stream());
    forward(kind, b, make(values, {300, 17}), SoftmaxMask::None, stream());
    EXPECT_EQ(host(a), host(b)) << name(kind);  // the same bits every run
    Tensor x = make(values, {300, 17});
    forward(kind, x, x, SoftmaxMask::None, stream());  // y aliases x
    EXPECT_EQ(host(x), host(a)) << name(kind);
  }
}

TEST_P(SoftmaxTest, RejectsBadShapesAndSixteenBitDtypes) {
  Tensor x = Tensor::zeros({2, 3}, stream());
  Tensor y = Tensor::zeros({3, 2}, stream());
  EXPECT_THROW_WITH(softmax_forward(y, x, SoftmaxMask::None, stream()), ShapeError,
                    "softmax_forward: x is float32[2,3]");
  EXPECT_THROW_WITH(log_softmax_backward(x, x, y, SoftmaxMask::None, stream()), ShapeError,
                    "log_softmax_backward: y is float32[3,2]");
  EXPECT_THROW_WITH(
      softmax_forward(x, x, SoftmaxMask::Causal, stream()), ShapeError,
      "softmax_forward: the causal mask takes x as [..., T, T] (queries by keys), but x is "
      "float32[2,3]");
  Tensor v = Tensor::zeros({4}, stream());
  EXPECT_THROW_WITH(log_softmax_forward(v, v, SoftmaxMask::Causal, stream()), ShapeError,
                    "but x is float32[4]");
  Tensor h = Tensor::zeros({2, 2}, stream(), DType::BFloat16);
  EXPECT_THROW_WITH(softmax_forward(h, h, SoftmaxMask::None, stream()), NotSupported,
                    "softmax_forward: bfloat16 is not supported");
  Tensor f = Tensor::zeros({2, 2}, stream(), DType::Float16);
  EXPECT_THROW_WITH(log_softmax_backward(f, f, f, SoftmaxMask::None, stream()), NotSupported,
                    "log_softmax_backward: float16 is not supported");
}

// The reference at points whose values are known from PyTorch (float64), so that
// the specification is not wrong in the same way as the backends.
TEST(SoftmaxReference, KnownValues) {
  const std::vector<double> x = {1.0, 2.0, 3.0};
  std::vector<double> y(3);
  reference::softmax_forward(y.data(), x.data(), 0, 1, 3, SoftmaxKind::Softmax, SoftmaxMask::None);
  EXPECT_NEAR(y[0], 0.09003057317038046, 1e-15);
  EXPECT_NEAR(y[1], 0.24472847105479767, 1e-15);
  EXPECT_NEAR(y[2], 0.6652409557748219, 1e-15);
  reference::softmax_forward(y.data(), x.data(), 0, 1, 3, SoftmaxKind::LogSoftmax,
                             SoftmaxMask::None);
  EXPECT_NEAR(y[0], -2.4076059644443806, 1e-15);
  EXPECT_NEAR(y[2], -0.40760596444438035, 1e-15);
}

TEST(SoftmaxCpu, Float64IsTheReference) {
  const Stream& cpu = default_stream(Device::cpu());
  Tensor x = random_double_tensor({7, 9, 9}, 41, -5.0, 5.0);
  for (SoftmaxKind kind : kKinds) {
    for (SoftmaxMask mask : {SoftmaxMask::None, SoftmaxMask::Causal}) {
      Tensor y = Tensor::empty({7, 9, 9}, cpu, DType::Float64);
      forward(kind, y, x, mask, cpu);
      std::vector<double> expected(7 * 81);
      reference::softmax_forward(expected.data(), x.data<double>(), 0, 63, 9, kind, mask);
      EXPECT_EQ(y.to_host<double>(), expected) << name(kind) << ", " << name(mask);
    }
  }
}

// The float32 CPU path is float math in vector lanes (kernels/cpu/softmax.cpp), not
// the reference: on every ISA this CPU has, both kinds, with and without the causal
// mask, rows of 1, 7, 17 and 1029 values (partial vector groups), forward and
// backward (accumulated into a sentinel and assigned) must stay within
// kernels/softmax.h's 1e-6 + 1e-5 |reference|, NaN exactly where the reference has
// one. Row r of each matrix is, by r % 5: random logits, logits scaled to +-6000,
// -inf at every third key, all -inf, a NaN; masked keys hold NaN (never read). The
// control is the test run once with a planted error in the exp (the report of the
// commit that added this).
TEST(SoftmaxCpu, EveryIsaMatchesTheReferenceInFloat32) {
  for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
    for (SoftmaxKind kind : kKinds) {
      for (SoftmaxMask mask : {SoftmaxMask::None, SoftmaxMask::Causal}) {
        for (std::int64_t cols : {1, 7, 17, 1029}) {
          const std::int64_t rows = mask == SoftmaxMask::Causal ? cols * (cols > 17 ? 1 : 2) : 10;
          const std::size_t n = std::size_t(rows * cols);
          auto x = random_values(n, unsigned(cols), -6.0f, 6.0f);
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t kept = reference::softmax_kept(r, cols, mask);
            for (std::int64_t j = 0; j < cols; ++j) {
              float& v = x[std::size_t(r * cols + j)];
              if (j >= kept)
                v = kNaN;
              else if (r % 5 == 1)
                v *= 1000.0f;
              else if ((r % 5 == 2 && j % 3 == 1) || r % 5 == 3)
                v = -kInf;
              else if (r % 5 == 4 && j == kept / 2)
                v = kNaN;
            }
          }
          const auto grad_y = random_values(n, unsigned(cols + 1));
          const std::vector<float> sentinel(n, 0.5f);
          const std::string where =
              isa + ", " + name(kind) + ", " + name(mask) + ", D = " + std::to_string(cols);
          const Shape shape =
              mask == SoftmaxMask::Causal ? Shape{rows / cols, cols, cols} : Shape{rows, cols};
          Tensor y = Tensor::empty(shape, cpu());
          forward(kind, y, Tensor::from_host<float>(x, shape, cpu()), mask, cpu());
          const auto expected = reference_forward(x, cols, kind, mask);
          EXPECT_TRUE(matches_reference(y.to_host<float>(cpu()), expected)) << where;
          // The backward from the reference's output, so that the forward's rounding
          // is not counted twice.
          Tensor ey = Tensor::from_host<float>(expected, shape, cpu());
          Tensor gy = Tensor::from_host<float>(grad_y, shape, cpu());
          for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
            Tensor gx = Tensor::from_host<float>(sentinel, shape, cpu());
            backward(kind, gx, gy, ey, mask, cpu(), write);
            EXPECT_TRUE(matches_reference(
                gx.to_host<float>(cpu()),
                reference_backward(sentinel, grad_y, expected, cols, kind, mask, write)))
                << where << (write == GradWrite::Assign ? ", assigned" : ", accumulated");
          }
        }
      }
    }
  });
}

// sum of g * y over the kept entries (the masked -inf of log-softmax left out).
double kept_weighted_sum(const Tensor& g, const Tensor& y, SoftmaxMask mask) {
  const std::int64_t cols = y.shape().back();
  const double* pg = g.data<double>();
  const double* py = y.data<double>();
  double sum = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    if (mask == SoftmaxMask::Causal && i % cols > (i / cols) % cols) continue;
    sum += pg[i] * py[i];
  }
  return sum;
}

TEST(SoftmaxGradient, MatchesCentralDifferences) {
  const Stream& cpu = default_stream(Device::cpu());
  for (SoftmaxKind kind : kKinds) {
    for (SoftmaxMask mask : {SoftmaxMask::None, SoftmaxMask::Causal}) {
      const Shape shape = {2, 5, 5};
      Tensor x = random_double_tensor(shape, 51, -3.0, 3.0);
      Tensor g = random_double_tensor(shape, 52);
      auto loss = [&](const std::vector<Tensor>& in) {
        Tensor y = Tensor::empty(shape, cpu, DType::Float64);
        forward(kind, y, in[0], mask, cpu);
        return kept_weighted_sum(g, y, mask);
      };
      Tensor y = Tensor::empty(shape, cpu, DType::Float64);
      forward(kind, y, x, mask, cpu);
      Tensor grad_x = Tensor::zeros(shape, cpu, DType::Float64);
      backward(kind, grad_x, g, y, mask, cpu);
      EXPECT_TRUE(check_gradient(loss, {x}, {grad_x})) << name(kind) << ", " << name(mask);
    }
  }
}

TEST(SoftmaxGradient, ThroughTheTape) {
  for (SoftmaxKind kind : kKinds) {
    auto op = [kind](const Var& v) {
      return kind == SoftmaxKind::Softmax ? ag::softmax(v) : ag::log_softmax(v);
    };
    Tensor x = random_double_tensor({3, 4}, 61, -2.0, 2.0);
    Tensor grad = Tensor::zeros({3, 4}, cpu(), DType::Float64);
    auto loss_fn = [&](const std::vector<Tensor>& in) {
      Tape tape(cpu());
      Var v = tape.constant(in[0]);  // x used twice: the two contributions must add up
      return ag::sum(ag::mul(op(v), v)).value().to_host<double>()[0];
    };
    Tape tape(cpu());
    Var v = tape.variable(x, grad, "x");
    tape.backward(ag::sum(ag::mul(op(v), v)));
    EXPECT_TRUE(check_gradient(loss_fn, {x}, {grad})) << name(kind);
  }
  // The causal softmax on the tape: attention scores [2, 4, 4].
  Tensor s = random_double_tensor({2, 4, 4}, 62, -2.0, 2.0);
  Tensor w = random_double_tensor({2, 4, 4}, 63);
  Tensor grad = Tensor::zeros({2, 4, 4}, cpu(), DType::Float64);
  auto loss_fn = [&](const std::vector<Tensor>& in) {
    Tape tape(cpu());
    Var v = tape.constant(in[0]);
    return ag::sum(ag::mul(ag::softmax(v, SoftmaxMask::Causal), tape.constant(w)))
        .value()
        .to_host<double>()[0];
  };
  Tape tape(cpu());
  Var v = tape.variable(s, grad, "scores");
  tape.backward(ag::sum(ag::mul(ag::softmax(v, SoftmaxMask::Causal), tape.constant(w))));
  EXPECT_TRUE(check_gradient(loss_fn, {s}, {grad}));
}

// Inputs and outputs for tests/ops_vs_torch_test.py (ctest ops_vs_torch), which runs
// this case with TOWERLAB_OPS_VS_TORCH_DIR set and computes PyTorch's results from
// the same inputs: per backend and dtype ("cpu_float32/", "cpu_float64/",
// "cuda_float32/" where a GPU is), x and grad_y, then each op's y and grad_x
// (assigned). The causal inputs are [2,6,6] with grad_y 0 at the masked keys, which
// a PyTorch masked_fill(-inf) would otherwise add into log-softmax's sum
// (tests/ops_vs_torch.h).
TEST(SoftmaxVsTorch, WritesCases) {
  std::vector<std::pair<std::string, Tensor>> out;
  auto x_values = random_values(5 * 17, 91, -6.0f, 6.0f);
  x_values[3] = 1e4f;    // a large logit: row 0 is one-hot in float
  x_values[17] = -1e4f;  // a large negative one
  x_values[40] = -kInf;  // an excluded key
  const auto gy_values = random_values(5 * 17, 92);
  const auto xc_values = random_values(2 * 6 * 6, 93, -3.0f, 3.0f);
  auto gyc_values = random_values(2 * 6 * 6, 94);
  for (std::size_t i = 0; i < gyc_values.size(); ++i) {
    if (i % 6 > (i / 6) % 6) gyc_values[i] = 0.0f;
  }
  for (const TorchCaseBackend& backend : torch_case_backends()) {
    const Stream& stream = backend.stream();
    const DType dtype = backend.dtype;
    const std::string& prefix = backend.prefix;
    const Tensor x = backend.make(x_values, {5, 17}), gy = backend.make(gy_values, {5, 17});
    const Tensor xc = backend.make(xc_values, {2, 6, 6});
    const Tensor gyc = backend.make(gyc_values, {2, 6, 6});
    out.insert(out.end(), {{prefix + "x", x},
                           {prefix + "grad_y", gy},
                           {prefix + "x_causal", xc},
                           {prefix + "grad_y_causal", gyc}});
    for (SoftmaxKind kind : kKinds) {
      for (SoftmaxMask mask : {SoftmaxMask::None, SoftmaxMask::Causal}) {
        const bool causal = mask == SoftmaxMask::Causal;
        const Tensor& in = causal ? xc : x;
        Tensor y = Tensor::empty(in.shape(), stream, dtype);
        forward(kind, y, in, mask, stream);
        Tensor grad_x = Tensor::empty(in.shape(), stream, dtype);
        backward(kind, grad_x, causal ? gyc : gy, y, mask, stream, GradWrite::Assign);
        const std::string op = prefix + name(kind) + (causal ? "_causal" : "");
        out.insert(out.end(), {{op + "/y", y}, {op + "/grad_x", grad_x}});
      }
    }
  }
  write_torch_cases("softmax.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
