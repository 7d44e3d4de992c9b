// CUDA's Winograd F(4x4,3x3) conv2d (kernels/cuda/conv2d_winograd.h): the forward,
// backward-data and backward-weight against a double-precision reference within a
// tolerance scaled to each result's terms, on both paddings, ragged tiles (P, Q not
// multiples of 4), channels that are not multiples of the GEMM tiles, one image and
// several, a weight gradient split along its tiles; with a control that the
// tolerance catches one wrong input, the choice Auto makes, and the same bits run
// after run.
#include <cmath>
#include <cstring>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "conv2d_case.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// A 3x3 stride-1 layer with padding pad_h, pad_w.
ConvCase layer(std::string name, std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W,
               std::int64_t K, std::int64_t pad_h, std::int64_t pad_w, bool bias = true) {
  return {std::move(name), N, C, H, W, K, 3, 3, make_params(1, 1, pad_h, pad_w), bias};
}

// F(4x4,3x3)'s transforms (entries up to 8, fractions down to 1/24) round a result
// by up to a few tens of units u = 2^-24 of the sum of its terms' magnitudes,
// sum |w||x| (+ |b|, + |sentinel|); the cases below measure up to about 45 u (the
// implicit GEMM: under 4 u). The tolerance is 256 u; the control shows that one
// wrong input in one tile exceeds it.
constexpr double kTolerance = 256.0 / (1 << 24);

struct Outputs {
  std::vector<float> y, grad_x, grad_w;
};

// One case's inputs, its reference results and their magnitude scales. The
// gradients accumulate onto sentinels (grad_x's and grad_w's), which the expected
// values and the scales include.
struct Problem {
  ConvCase k;
  std::vector<float> xv, wv, bv, gv, sentinel, w_sentinel;
  std::vector<double> y, grad_x, grad_w, y_scale, grad_x_scale, grad_w_scale;

  Problem(const ConvCase& c, unsigned seed) : k(c) {
    xv = random_values(std::size_t(numel_of(k.x_shape())), seed);
    wv = random_values(std::size_t(numel_of(k.w_shape())), seed + 1);
    bv = random_values(std::size_t(k.K), seed + 2);
    gv = random_values(std::size_t(numel_of(k.y_shape())), seed + 3);
    sentinel = random_values(xv.size(), seed + 4);
    w_sentinel = random_values(wv.size(), seed + 5);
    compute_reference();
  }
  void compute_reference() {
    const Reference ref = reference(k, widen(xv), widen(wv), widen(bv), widen(gv));
    const Reference abs =
        reference(k, magnitudes(xv), magnitudes(wv), magnitudes(bv), magnitudes(gv));
    y = ref.y;
    y_scale = abs.y;
    auto onto = [](const std::vector<float>& start, const std::vector<double>& sum,
                   const std::vector<double>& magnitude, std::vector<double>& value,
                   std::vector<double>& scale) {
      value.clear(), scale.clear();
      for (std::size_t i = 0; i < start.size(); ++i) {
        value.push_back(double(start[i]) + sum[i]);
        scale.push_back(std::fabs(double(start[i])) + magnitude[i]);
      }
    };
    onto(sentinel, ref.grad_x, abs.grad_x, grad_x, grad_x_scale);
    onto(w_sentinel, ref.grad_w, abs.grad_w, grad_w, grad_w_scale);
  }

  // y, and both gradients (one conv2d_backward) accumulated onto their sentinels, on
  // `stream` under `algorithm`.
  Outputs run(const Stream& stream, Conv2dAlgorithm algorithm) const {
    const cpu::ScopedConv2dAlgorithm scoped(algorithm);
    auto put = [&](const std::vector<float>& v, const Shape& shape) {
      return Tensor::from_host<float>(v, shape, stream);
    };
    const Shape ys = k.y_shape();
    Tensor x = put(xv, k.x_shape()), w = put(wv, k.w_shape());
    Tensor y_out = put(std::vector<float>(std::size_t(numel_of(ys)), 7.0f), ys);
    conv2d_forward(y_out, x, w, k.bias ? put(bv, {k.K}) : Tensor(), k.params, stream);
    Tensor gx = put(sentinel, k.x_shape()), gw = put(w_sentinel, k.w_shape());
    conv2d_backward(gx, gw, Tensor(), put(gv, ys), x, w, k.params, stream);
    return {y_out.to_host<float>(stream), gx.to_host<float>(stream), gw.to_host<float>(stream)};
  }
};

std::vector<ConvCase> cases() {
  return {
      // P, Q multiples of 4 (whole tiles, the output's float4 stores), one image.
      layer("whole_tiles_pad1_batch1", 1, 16, 8, 12, 24, 1, 1),
      // Ragged tiles both ways, padding 0, no bias, channels off every tile size.
      layer("ragged_pad0_no_bias", 3, 5, 11, 9, 7, 0, 0, false),
      layer("ragged_pad1", 2, 13, 7, 10, 9, 1, 1),
      layer("pad1x0", 2, 6, 9, 6, 5, 1, 0),
      // More than 64 output channels: the GEMM's 128-row tile, two of them, ragged
      // in both channel counts (and backward-data's 67 output channels on the 128
      // tile); the weight gradient's 128x128 tile, 2 x 1 of them.
      layer("C67_K130", 2, 67, 9, 9, 130, 1, 1),
      // A wide layer as Auto takes it: two column tiles of the GEMM (147 tiles), the
      // output's float4 rows (Q = 28).
      layer("C64_K64_28x28", 3, 64, 28, 28, 64, 1, 1),
      // 540 tiles (15 images of 6 x 6, P = Q = 22): the weight gradient's reduction
      // cut into splits whose last has half a K-step (132 SMs: 7 x 72 + 36 tiles; 8
      // SMs: 4 x 112 + 92), on its 64x32 tile (at most 32 input channels, as every
      // case above but two) and, with padding 1 on 22 x 22 images, on its 64x64 tile
      // (33 to 64).
      layer("weight_gradient_split", 15, 5, 24, 24, 7, 0, 0),
      layer("weight_gradient_split_64x64", 15, 33, 22, 22, 7, 1, 1),
      // The smallest image padding 0 allows, and one row with padding 1.
      layer("one_partial_tile", 1, 3, 3, 3, 4, 0, 0),
      layer("one_row_pad1", 2, 4, 1, 5, 3, 1, 1),
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
  for (const ConvCase& k : cases()) {
    SCOPED_TRACE(k.name);
    const Problem c(k, seed += 10);
    const Outputs winograd = c.run(stream(), Conv2dAlgorithm::Winograd);
    const double y_error = worst_error(winograd.y, c.y, c.y_scale);
    const double gx_error = worst_error(winograd.grad_x, c.grad_x, c.grad_x_scale);
    const double gw_error = worst_error(winograd.grad_w, c.grad_w, c.grad_w_scale);
    EXPECT_LE(y_error, kTolerance) << "y";
    EXPECT_LE(gx_error, kTolerance) << "grad_x";
    EXPECT_LE(gw_error, kTolerance) << "grad_w";
    // Winograd really ran: its bits differ from the implicit GEMM's somewhere.
    const Outputs gemm = c.run(stream(), Conv2dAlgorithm::Im2col);
    EXPECT_NE(winograd.y, gemm.y);
    EXPECT_NE(winograd.grad_x, gemm.grad_x);
    EXPECT_NE(winograd.grad_w, gemm.grad_w);
    std::ostringstream errors;
    errors << std::scientific << std::setprecision(2) << "y " << y_error << ", grad_x " << gx_error
           << ", grad_w " << gw_error << " (implicit GEMM: " << worst_error(gemm.y, c.y, c.y_scale)
           << ", " << worst_error(gemm.grad_x, c.grad_x, c.grad_x_scale) << ", "
           << worst_error(gemm.grad_w, c.grad_w, c.grad_w_scale) << ")";
    RecordProperty("worst_error_" + k.name, errors.str());
  }
}

// Controls: one input (of x, then of grad_y) off by 0.25 in one tile fails the check
// of each result it enters.
TEST_F(Conv2dWinogradCuda, ToleranceCatchesOneWrongInput) {
  const Problem c(layer("ragged", 2, 8, 9, 10, 8, 1, 1), 3100);
  Problem wrong_x = c, wrong_g = c;
  const std::size_t pixel = (1 * 8 + 3) * 9 * 10 + 5 * 10 + 6;  // n 1, channel 3, (5, 6)
  wrong_x.xv[pixel] += 0.25f;
  wrong_g.gv[pixel] += 0.25f;
  const Outputs right = c.run(stream(), Conv2dAlgorithm::Winograd);
  EXPECT_LE(worst_error(right.y, c.y, c.y_scale), kTolerance);
  EXPECT_LE(worst_error(right.grad_x, c.grad_x, c.grad_x_scale), kTolerance);
  EXPECT_LE(worst_error(right.grad_w, c.grad_w, c.grad_w_scale), kTolerance);
  const Outputs off_x = wrong_x.run(stream(), Conv2dAlgorithm::Winograd);
  const Outputs off_g = wrong_g.run(stream(), Conv2dAlgorithm::Winograd);
  EXPECT_GT(worst_error(off_x.y, c.y, c.y_scale), kTolerance);
  EXPECT_GT(worst_error(off_x.grad_w, c.grad_w, c.grad_w_scale), kTolerance);
  EXPECT_GT(worst_error(off_g.grad_x, c.grad_x, c.grad_x_scale), kTolerance);
  EXPECT_GT(worst_error(off_g.grad_w, c.grad_w, c.grad_w_scale), kTolerance);
}

TEST_F(Conv2dWinogradCuda, RepeatsTheBits) {
  const Problem c(layer("C67_K70", 2, 67, 6, 7, 70, 1, 1), 3200);
  const Outputs first = c.run(stream(), Conv2dAlgorithm::Winograd);
  const Outputs second = c.run(stream(), Conv2dAlgorithm::Winograd);
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same_bits(first.y, second.y));
  EXPECT_TRUE(same_bits(first.grad_x, second.grad_x));
  EXPECT_TRUE(same_bits(first.grad_w, second.grad_w));
}

// Auto chooses each pass on its own (kernels/cuda/conv2d_winograd.h): forward and
// backward-data where the correlation reduces >= 64 channels into >= 32, the weight
// gradient where one channel count is >= 64 and the other >= 32. Each pass's bits
// are those of the algorithm the rule names; a forced Winograd leaves the shapes it
// cannot do (stride 2, padding 2) to the implicit GEMM.
TEST_F(Conv2dWinogradCuda, AutoPicksEachPassByShape) {
  struct Expected {
    std::int64_t C, K;
    bool forward, backward_data, backward_weight;  // Winograd's
  };
  for (const Expected& e :
       {Expected{64, 64, true, true, true},
        // FashionNet's conv2: 32 reduced into 64 forward, 64 into 32
        // backward.
        Expected{32, 64, false, true, true}, Expected{64, 32, true, false, true},
        Expected{16, 64, false, false, false}, Expected{32, 32, false, false, false}}) {
    SCOPED_TRACE(::testing::Message() << e.C << " -> " << e.K);
    const Problem c(layer("auto", 1, e.C, 5, 6, e.K, 1, 1), 3300 + unsigned(e.C + e.K));
    const Outputs automatic = c.run(stream(), Conv2dAlgorithm::Auto);
    const Outputs winograd = c.run(stream(), Conv2dAlgorithm::Winograd);
    const Outputs gemm = c.run(stream(), Conv2dAlgorithm::Im2col);
    ASSERT_NE(winograd.y, gemm.y);
    ASSERT_NE(winograd.grad_x, gemm.grad_x);
    ASSERT_NE(winograd.grad_w, gemm.grad_w);
    EXPECT_EQ(automatic.y, e.forward ? winograd.y : gemm.y);
    EXPECT_EQ(automatic.grad_x, e.backward_data ? winograd.grad_x : gemm.grad_x);
    EXPECT_EQ(automatic.grad_w, e.backward_weight ? winograd.grad_w : gemm.grad_w);
  }

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
// a multiple of 4 (where aligned rows take them), and assigned gradients.
TEST_F(Conv2dWinogradCuda, WritesThroughUnalignedViewsAndAssigns) {
  const Problem c(layer("unaligned", 2, 6, 8, 8, 5, 1, 1), 3400);
  const cpu::ScopedConv2dAlgorithm forced(Conv2dAlgorithm::Winograd);
  const Shape ys = c.k.y_shape(), xs = c.k.x_shape();
  Tensor x = Tensor::from_host<float>(c.xv, xs, stream());
  Tensor w = Tensor::from_host<float>(c.wv, c.k.w_shape(), stream());
  Tensor b = Tensor::from_host<float>(c.bv, {c.k.K}, stream());
  Tensor gy = Tensor::from_host<float>(c.gv, ys, stream());
  Tensor y_storage = Tensor::zeros({numel_of(ys) + 1}, stream());
  Tensor y = y_storage.view(1, ys);
  conv2d_forward(y, x, w, b, c.k.params, stream());
  EXPECT_LE(worst_error(y.to_host<float>(stream()), c.y, c.y_scale), kTolerance);

  Tensor gx_storage =
      Tensor::from_host<float>(std::vector<float>(std::size_t(numel_of(xs)) + 1, std::nanf("")),
                               {numel_of(xs) + 1}, stream());
  Tensor grad_x = gx_storage.view(1, xs);
  conv2d_backward(grad_x, Tensor(), Tensor(), gy, x, w, c.k.params, stream(), GradWrite::Assign);
  std::vector<double> want(c.grad_x.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = c.grad_x[i] - c.sentinel[i];
  EXPECT_LE(worst_error(grad_x.to_host<float>(stream()), want, c.grad_x_scale), kTolerance);

  // The weight gradient from a grad_y view one float into its storage (Q = 8, yet no
  // float4 loads), assigned into a view one float into its storage.
  std::vector<float> shifted_gy(1, 5.0f);
  shifted_gy.insert(shifted_gy.end(), c.gv.begin(), c.gv.end());
  Tensor gy_storage = Tensor::from_host<float>(shifted_gy, {numel_of(ys) + 1}, stream());
  const Shape ws = c.k.w_shape();
  Tensor gw_storage =
      Tensor::from_host<float>(std::vector<float>(std::size_t(numel_of(ws)) + 1, std::nanf("")),
                               {numel_of(ws) + 1}, stream());
  Tensor grad_w = gw_storage.view(1, ws);
  conv2d_backward(Tensor(), grad_w, Tensor(), gy_storage.view(1, ys), x, w, c.k.params, stream(),
                  GradWrite::Assign);
  std::vector<double> want_w(c.grad_w.size());
  for (std::size_t i = 0; i < want_w.size(); ++i) want_w[i] = c.grad_w[i] - c.w_sentinel[i];
  EXPECT_LE(worst_error(grad_w.to_host<float>(stream()), want_w, c.grad_w_scale), kTolerance);
}

}  // namespace
}  // namespace towerlab::testing
