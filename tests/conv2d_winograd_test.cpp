// CUDA's Winograd F(4x4,3x3) conv2d (kernels/cuda/conv2d_winograd.h): the forward
// and backward-data against a double-precision reference within a tolerance scaled
// to each result's terms, on both paddings, ragged tiles (P, Q not multiples of 4),
// channels that are not multiples of the GEMM tiles, one image and several; with a
// control that the tolerance catches one wrong input, the choice Auto makes, and the
// same bits run after run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

struct Case {
  std::string name;
  std::int64_t N, C, H, W, K, pad_h, pad_w;
  bool bias = true;

  Conv2dParams params() const { return {1, 1, pad_h, pad_w, 1, 1}; }
  Shape x_shape() const { return {N, C, H, W}; }
  Shape w_shape() const { return {K, C, 3, 3}; }
  Shape y_shape() const { return {N, K, H + 2 * pad_h - 2, W + 2 * pad_w - 2}; }
};

// The forward (plus bias) and backward-data of a 3x3 stride-1 layer in double.
struct Reference {
  std::vector<double> y, grad_x;
};

Reference reference(const Case& k, const std::vector<double>& x, const std::vector<double>& w,
                    const std::vector<double>& b, const std::vector<double>& gy) {
  const Shape ys = k.y_shape();
  const std::int64_t P = ys[2], Q = ys[3];
  Reference ref;
  ref.y.assign(static_cast<std::size_t>(numel_of(ys)), 0.0);
  ref.grad_x.assign(x.size(), 0.0);
  for (std::int64_t n = 0; n < k.N; ++n) {
    for (std::int64_t o = 0; o < k.K; ++o) {
      for (std::int64_t p = 0; p < P; ++p) {
        for (std::int64_t q = 0; q < Q; ++q) {
          const auto yi = static_cast<std::size_t>(((n * k.K + o) * P + p) * Q + q);
          double acc = k.bias ? b[static_cast<std::size_t>(o)] : 0.0;
          for (std::int64_t c = 0; c < k.C; ++c) {
            for (std::int64_t r = 0; r < 3; ++r) {
              for (std::int64_t s = 0; s < 3; ++s) {
                const std::int64_t h = p - k.pad_h + r, ww = q - k.pad_w + s;
                if (h < 0 || h >= k.H || ww < 0 || ww >= k.W) continue;
                const auto xi = static_cast<std::size_t>(((n * k.C + c) * k.H + h) * k.W + ww);
                const auto wi = static_cast<std::size_t>(((o * k.C + c) * 3 + r) * 3 + s);
                acc += w[wi] * x[xi];
                ref.grad_x[xi] += gy[yi] * w[wi];
              }
            }
          }
          ref.y[yi] = acc;
        }
      }
    }
  }
  return ref;
}

std::vector<double> widen(const std::vector<float>& v, bool magnitude) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = magnitude ? std::fabs(v[i]) : v[i];
  return out;
}

// The largest |actual - expected| / scale.
double worst_error(const std::vector<float>& actual, const std::vector<double>& expected,
                   const std::vector<double>& scale) {
  EXPECT_EQ(actual.size(), expected.size());
  double worst = 0;
  for (std::size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    worst = std::max(worst, std::fabs(double(actual[i]) - expected[i]) / scale[i]);
  }
  return worst;
}

// F(4x4,3x3)'s transforms (entries up to 8, fractions down to 1/24) round a result
// by up to a few tens of units u = 2^-24 of the sum of its terms' magnitudes,
// sum |w||x| (+ |b|, + |sentinel|); the cases below measure up to about 45 u (the
// implicit GEMM: under 4 u). The tolerance is 256 u; the control shows that one
// wrong input in one tile exceeds it.
constexpr double kTolerance = 256.0 / (1 << 24);

struct Outputs {
  std::vector<float> y, grad_x;
};

// One case's inputs, its reference results and their magnitude scales.
struct Problem {
  Case k;
  std::vector<float> xv, wv, bv, gv, sentinel;
  std::vector<double> y, grad_x, y_scale, grad_x_scale;

  Problem(const Case& c, unsigned seed) : k(c) {
    xv = random_values(std::size_t(numel_of(k.x_shape())), seed);
    wv = random_values(std::size_t(numel_of(k.w_shape())), seed + 1);
    bv = random_values(std::size_t(k.K), seed + 2);
    gv = random_values(std::size_t(numel_of(k.y_shape())), seed + 3);
    sentinel = random_values(xv.size(), seed + 4);
    compute_reference();
  }
  void compute_reference() {
    const Reference ref =
        reference(k, widen(xv, false), widen(wv, false), widen(bv, false), widen(gv, false));
    const Reference abs =
        reference(k, widen(xv, true), widen(wv, true), widen(bv, true), widen(gv, true));
    y = ref.y;
    y_scale = abs.y;
    grad_x.clear(), grad_x_scale.clear();
    for (std::size_t i = 0; i < xv.size(); ++i) {
      grad_x.push_back(double(sentinel[i]) + ref.grad_x[i]);
      grad_x_scale.push_back(std::fabs(double(sentinel[i])) + abs.grad_x[i]);
    }
  }

  // y, and grad_x accumulated onto the sentinel, on `stream` under `algorithm`.
  Outputs run(const Stream& stream, Conv2dAlgorithm algorithm) const {
    const cpu::ScopedConv2dAlgorithm scoped(algorithm);
    auto put = [&](const std::vector<float>& v, const Shape& shape) {
      return Tensor::from_host<float>(v, shape, stream);
    };
    const Shape ys = k.y_shape();
    Tensor x = put(xv, k.x_shape()), w = put(wv, k.w_shape());
    Tensor y_out = put(std::vector<float>(std::size_t(numel_of(ys)), 7.0f), ys);
    conv2d_forward(y_out, x, w, k.bias ? put(bv, {k.K}) : Tensor(), k.params(), stream);
    Tensor gx = put(sentinel, k.x_shape());
    conv2d_backward(gx, Tensor(), Tensor(), put(gv, ys), x, w, k.params(), stream);
    return {y_out.to_host<float>(stream), gx.to_host<float>(stream)};
  }
};

std::vector<Case> cases() {
  return {
      // P, Q multiples of 4 (whole tiles, the output's float4 stores), one image.
      {"whole_tiles_pad1_batch1", 1, 16, 8, 12, 24, 1, 1},
      // Ragged tiles both ways, padding 0, no bias, channels off every tile size.
      {"ragged_pad0_no_bias", 3, 5, 11, 9, 7, 0, 0, false},
      {"ragged_pad1", 2, 13, 7, 10, 9, 1, 1},
      {"pad1x0", 2, 6, 9, 6, 5, 1, 0},
      // More than 64 output channels: the GEMM's 128-row tile, two of them, ragged
      // in both channel counts (and backward-data's 67 output channels on the 128 tile).
      {"C67_K130", 2, 67, 9, 9, 130, 1, 1},
      // A wide layer as Auto takes it: two column tiles of the GEMM (147 tiles), the
      // output's float4 rows (Q = 28).
      {"C64_K64_28x28", 3, 64, 28, 28, 64, 1, 1},
      // The smallest image padding 0 allows, and one row with padding 1.
      {"one_partial_tile", 1, 3, 3, 3, 4, 0, 0},
      {"one_row_pad1", 2, 4, 1, 5, 3, 1, 1},
  };
}

class Conv2dWinogradCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    skip_without_cuda_device();
    if (IsSkipped() || HasFatalFailure()) return;
    stream_ = std::make_unique<Stream>(Device::cuda(0));
  }
  const Stream& stream() const { return *stream_; }

 private:
  std::unique_ptr<Stream> stream_;
};

TEST_F(Conv2dWinogradCuda, MatchesReferenceWithinTheTermMagnitudes) {
  unsigned seed = 3000;
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name);
    const Problem c(k, seed += 10);
    const Outputs winograd = c.run(stream(), Conv2dAlgorithm::Winograd);
    const double y_error = worst_error(winograd.y, c.y, c.y_scale);
    const double gx_error = worst_error(winograd.grad_x, c.grad_x, c.grad_x_scale);
    EXPECT_LE(y_error, kTolerance) << "y";
    EXPECT_LE(gx_error, kTolerance) << "grad_x";
    // Winograd really ran: its bits differ from the implicit GEMM's somewhere.
    const Outputs gemm = c.run(stream(), Conv2dAlgorithm::Im2col);
    EXPECT_NE(winograd.y, gemm.y);
    EXPECT_NE(winograd.grad_x, gemm.grad_x);
    std::ostringstream errors;
    errors << std::scientific << std::setprecision(2) << "y " << y_error << ", grad_x " << gx_error
           << " (implicit GEMM: " << worst_error(gemm.y, c.y, c.y_scale) << ", "
           << worst_error(gemm.grad_x, c.grad_x, c.grad_x_scale) << ")";
    RecordProperty("worst_error_" + k.name, errors.str());
  }
}

// Controls: one input (of x, then of grad_y) off by 0.25 in one tile fails the check.
TEST_F(Conv2dWinogradCuda, ToleranceCatchesOneWrongInput) {
  const Problem c({"ragged", 2, 8, 9, 10, 8, 1, 1}, 3100);
  Problem wrong_x = c, wrong_g = c;
  const std::size_t pixel = (1 * 8 + 3) * 9 * 10 + 5 * 10 + 6;  // n 1, channel 3, (5, 6)
  wrong_x.xv[pixel] += 0.25f;
  wrong_g.gv[pixel] += 0.25f;
  const Outputs right = c.run(stream(), Conv2dAlgorithm::Winograd);
  EXPECT_LE(worst_error(right.y, c.y, c.y_scale), kTolerance);
  EXPECT_LE(worst_error(right.grad_x, c.grad_x, c.grad_x_scale), kTolerance);
  EXPECT_GT(worst_error(wrong_x.run(stream(), Conv2dAlgorithm::Winograd).y, c.y, c.y_scale),
            kTolerance);
  EXPECT_GT(worst_error(wrong_g.run(stream(), Conv2dAlgorithm::Winograd).grad_x, c.grad_x,
                        c.grad_x_scale),
            kTolerance);
}

TEST_F(Conv2dWinogradCuda, RepeatsTheBits) {
  const Problem c({"C67_K70", 2, 67, 6, 7, 70, 1, 1}, 3200);
  const Outputs first = c.run(stream(), Conv2dAlgorithm::Winograd);
  const Outputs second = c.run(stream(), Conv2dAlgorithm::Winograd);
  EXPECT_EQ(std::memcmp(first.y.data(), second.y.data(), first.y.size() * sizeof(float)), 0);
  EXPECT_EQ(
      std::memcmp(first.grad_x.data(), second.grad_x.data(), first.grad_x.size() * sizeof(float)),
      0);
}

// Auto takes Winograd from 64 input and output channels on (both passes), the
// implicit GEMM below (FashionNet's 32 -> 64 layer); a forced Winograd leaves the
// shapes it cannot do (stride 2, padding 2) to the implicit GEMM.
TEST_F(Conv2dWinogradCuda, AutoPicksByShape) {
  const Problem wide({"wide", 1, 64, 5, 6, 64, 1, 1}, 3300);
  const Outputs automatic = wide.run(stream(), Conv2dAlgorithm::Auto);
  const Outputs winograd = wide.run(stream(), Conv2dAlgorithm::Winograd);
  const Outputs gemm = wide.run(stream(), Conv2dAlgorithm::Im2col);
  EXPECT_EQ(automatic.y, winograd.y);
  EXPECT_EQ(automatic.grad_x, winograd.grad_x);
  EXPECT_NE(automatic.y, gemm.y);
  const Problem narrow({"narrow", 1, 32, 5, 6, 64, 1, 1}, 3301);
  EXPECT_EQ(narrow.run(stream(), Conv2dAlgorithm::Auto).y,
            narrow.run(stream(), Conv2dAlgorithm::Im2col).y);

  const cpu::ScopedConv2dAlgorithm forced(Conv2dAlgorithm::Winograd);
  for (const Conv2dParams& params :
       {Conv2dParams{2, 2, 1, 1, 1, 1}, Conv2dParams{1, 1, 2, 2, 1, 1}}) {
    const Shape xs{1, 8, 7, 7}, ws{8, 8, 3, 3};
    const Shape ys = conv2d_output_shape(xs, ws, params);
    Tensor x = Tensor::from_host<float>(random_values(8 * 49, 3302), xs, stream());
    Tensor w = Tensor::from_host<float>(random_values(8 * 72, 3303), ws, stream());
    Tensor y = Tensor::empty(ys, stream());
    conv2d_forward(y, x, w, Tensor(), params, stream());
    const std::vector<float> forced_y = y.to_host<float>(stream());
    {
      const cpu::ScopedConv2dAlgorithm gemm_only(Conv2dAlgorithm::Im2col);
      conv2d_forward(y, x, w, Tensor(), params, stream());
    }
    EXPECT_EQ(forced_y, y.to_host<float>(stream()));
  }
}

// An output view that starts one float into its storage (no float4 stores), with Q
// a multiple of 4 (where aligned rows take them), and an assigned grad_x.
TEST_F(Conv2dWinogradCuda, WritesThroughUnalignedViewsAndAssigns) {
  const Problem c({"unaligned", 2, 6, 8, 8, 5, 1, 1}, 3400);
  const cpu::ScopedConv2dAlgorithm forced(Conv2dAlgorithm::Winograd);
  const Shape ys = c.k.y_shape(), xs = c.k.x_shape();
  Tensor x = Tensor::from_host<float>(c.xv, xs, stream());
  Tensor w = Tensor::from_host<float>(c.wv, c.k.w_shape(), stream());
  Tensor b = Tensor::from_host<float>(c.bv, {c.k.K}, stream());
  Tensor gy = Tensor::from_host<float>(c.gv, ys, stream());
  Tensor y_storage = Tensor::zeros({numel_of(ys) + 1}, stream());
  Tensor y = y_storage.view(1, ys);
  conv2d_forward(y, x, w, b, c.k.params(), stream());
  EXPECT_LE(worst_error(y.to_host<float>(stream()), c.y, c.y_scale), kTolerance);

  Tensor gx_storage =
      Tensor::from_host<float>(std::vector<float>(std::size_t(numel_of(xs)) + 1, std::nanf("")),
                               {numel_of(xs) + 1}, stream());
  Tensor grad_x = gx_storage.view(1, xs);
  conv2d_backward(grad_x, Tensor(), Tensor(), gy, x, w, c.k.params(), stream(), GradWrite::Assign);
  std::vector<double> want(c.grad_x.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = c.grad_x[i] - c.sentinel[i];
  EXPECT_LE(worst_error(grad_x.to_host<float>(stream()), want, c.grad_x_scale), kTolerance);
}

}  // namespace
}  // namespace towerlab::testing
