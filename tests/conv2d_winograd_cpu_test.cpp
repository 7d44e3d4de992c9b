// Winograd F(2x2,3x3) on the CPU (kernels/cpu/winograd.h), forced on: against the
// reference within a tolerance scaled to each result's terms, with controls; the
// same bits on every ISA and for any thread count; the choice Auto makes; the AVX2
// transforms' loads at the padding, the backward-data pass as the turned forward,
// and the weight gradient's vector transforms and GEMM panels against narrower ones.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <string>

#include "conv2d_cpu_case.h"
#include "cpu_isa.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// --- Winograd F(2x2, 3x3) on the CPU -------------------------------------------
//
// Winograd rounds differently from im2col: its transforms add and subtract inputs
// before the products (Bᵀ d B sums up to 4 of them, G g Gᵀ up to 9, Aᵀ m A up to 9
// products; the weight gradient's G₂ dy G₂ᵀ up to 4, A₂ᵀ S A₂ up to 9 sums), so its
// error is bounded not by the result but by the sum of the magnitudes of the
// result's terms, sum |w||x| or sum |grad_y||x| (+ |b|, + |sentinel|), times a few
// unit roundoffs u = 2^-24 (F(2,3) is the Winograd tile with the smallest
// transforms: about 2x to 4x the direct convolution's error). The cases below stay
// under 5 u (im2col: under 4 u); the tolerance is 32 u. One input 1% off in one
// tile (a tile that read a wrong pixel, a transform coefficient off) moves a result
// by more than that (the controls below), so the check would catch a wrong tile.
constexpr double kWinogradTolerance = 32.0 / (1 << 24);

std::vector<ConvCase> winograd_cases() {
  return {
      {"even_pad1", 2, 16, 14, 14, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"odd_pad1", 3, 5, 13, 11, 7, 3, 3, make_params(1, 1, 1, 1)},
      {"odd_pad0_no_bias", 1, 3, 9, 12, 4, 3, 3, make_params(1, 1, 0, 0), false},
      {"even_pad0", 2, 20, 10, 8, 17, 3, 3, make_params(1, 1, 0, 0)},
      {"pad1x0", 1, 4, 7, 6, 5, 3, 3, make_params(1, 1, 1, 0)},
      {"one_partial_tile", 1, 2, 3, 3, 3, 3, 3, make_params(1, 1, 0, 0)},
      {"one_row_pad1", 3, 3, 1, 2, 2, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion2_two_blocks", 2, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
      {"C67_K130_two_blocks", 2, 67, 9, 9, 130, 3, 3, make_params(1, 1, 1, 1)},
      // More than kGemmKc = 256 channels on each side: V's panels (forward and
      // backward-data) in two blocks of rows.
      {"C260_K258_two_row_blocks", 1, 260, 6, 5, 258, 3, 3, make_params(1, 1, 1, 1)},
      // Channel counts that are multiples of 8 run the weight gradient's vector
      // transforms (eight channels a vector): rows of more than eight tiles, an odd
      // P and Q without padding, and rows narrower than one vector.
      {"C8_K16_wide_rows", 2, 8, 6, 37, 16, 3, 3, make_params(1, 1, 1, 1)},
      {"C16_K8_odd_pad0", 3, 16, 9, 12, 8, 3, 3, make_params(1, 1, 0, 0)},
      {"C8_K8_narrow", 2, 8, 5, 5, 8, 3, 3, make_params(1, 1, 1, 1), false},
      // The weight gradient's V and Y written into the GEMM's panels of a block of
      // more than kGemmKc tiles (800: four blocks of the GEMM's inner dimension).
      {"C8_K16_tile_blocks", 2, 8, 40, 40, 16, 3, 3, make_params(1, 1, 1, 1)},
  };
}

// On every ISA this CPU has: the transforms' portable, AVX2 and AVX-512 code each
// write V into the panels of their own GEMM's B.
TEST(Conv2dWinograd, MatchesReferenceWithinTheTermMagnitudes) {
  const RestoreGemmIsa restore;
  unsigned seed = 900;
  for (const ConvCase& k : winograd_cases()) {
    SCOPED_TRACE(k.name);
    const CpuConvCase c(k, seed += 10);
    for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
      if (!gemm_isa_supported(isa)) continue;
      SCOPED_TRACE(isa == GemmIsa::Portable ? "portable"
                   : isa == GemmIsa::Avx2   ? "AVX2"
                                            : "AVX-512");
      set_gemm_isa(isa);
      const ConvOutputs on_isa = c.run(cpu::Conv2dAlgorithm::Winograd);
      EXPECT_LE(worst_error(on_isa.y, c.y, c.y_scale), kWinogradTolerance) << "y";
      EXPECT_LE(worst_error(on_isa.grad_x, c.grad_x, c.grad_x_scale), kWinogradTolerance)
          << "grad_x";
      EXPECT_LE(worst_error(on_isa.grad_w, c.grad_w, c.grad_w_scale), kWinogradTolerance)
          << "grad_weight";
    }
    set_gemm_isa(GemmIsa::Auto);
    const ConvOutputs winograd = c.run(cpu::Conv2dAlgorithm::Winograd);
    const double y_error = worst_error(winograd.y, c.y, c.y_scale);
    const double gx_error = worst_error(winograd.grad_x, c.grad_x, c.grad_x_scale);
    const double gw_error = worst_error(winograd.grad_w, c.grad_w, c.grad_w_scale);
    // The Winograd path really ran: its bits differ from im2col's somewhere.
    const ConvOutputs im2col = c.run(cpu::Conv2dAlgorithm::Im2col);
    if (k.C * k.K >= 64) {
      EXPECT_NE(winograd.y, im2col.y);
      EXPECT_NE(winograd.grad_x, im2col.grad_x);
      EXPECT_NE(winograd.grad_w, im2col.grad_w);
    }
    // The errors go into the test's XML record (--gtest_output=xml), not the log.
    std::ostringstream errors;
    errors << std::scientific << std::setprecision(2) << "y " << y_error << ", grad_x " << gx_error
           << ", grad_weight " << gw_error << " (im2col: " << worst_error(im2col.y, c.y, c.y_scale)
           << ", " << worst_error(im2col.grad_x, c.grad_x, c.grad_x_scale) << ", "
           << worst_error(im2col.grad_w, c.grad_w, c.grad_w_scale) << ")";
    RecordProperty("worst_error_" + k.name, errors.str());
  }
}

// Controls: one input value 1% off in one tile fails the same check.
TEST(Conv2dWinograd, ToleranceCatchesOneWrongTile) {
  const CpuConvCase c({"fashion2", 2, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 990);
  CpuConvCase wrong_x = c, wrong_g = c;
  const std::size_t pixel = (1 * 32 + 7) * 14 * 14 + 5 * 14 + 9;  // n 1, c 7, (5, 9)
  wrong_x.xv[pixel] *= 1.01f;
  wrong_g.gv[pixel] *= 1.01f;  // grad_y [2,64,14,14]: n 0, k 39, (5, 9)
  const ConvOutputs right = c.run(cpu::Conv2dAlgorithm::Winograd);
  EXPECT_LE(worst_error(right.y, c.y, c.y_scale), kWinogradTolerance);
  EXPECT_LE(worst_error(right.grad_x, c.grad_x, c.grad_x_scale), kWinogradTolerance);
  EXPECT_LE(worst_error(right.grad_w, c.grad_w, c.grad_w_scale), kWinogradTolerance);
  const ConvOutputs off_x = wrong_x.run(cpu::Conv2dAlgorithm::Winograd);
  const ConvOutputs off_g = wrong_g.run(cpu::Conv2dAlgorithm::Winograd);
  EXPECT_GT(worst_error(off_x.y, c.y, c.y_scale), kWinogradTolerance);
  EXPECT_GT(worst_error(off_g.grad_x, c.grad_x, c.grad_x_scale), kWinogradTolerance);
  // The weight gradient sums over every tile of the batch: one tile's input or
  // grad_y 1% off still moves its 3x3 results past the tolerance.
  EXPECT_GT(worst_error(off_x.grad_w, c.grad_w, c.grad_w_scale), kWinogradTolerance);
  EXPECT_GT(worst_error(off_g.grad_w, c.grad_w, c.grad_w_scale), kWinogradTolerance);
}

// The transforms have AVX-512 code (sixteen tiles a vector across tile rows, the
// last group masked) and AVX2 code (eight tiles of one tile row a vector, a row's
// last pixels stored 4, 2 and 1 at a time); both must give the same bits, forward
// (bias + the tile) and backward-data (added into grad_x), with an odd P and Q (a
// last tile row and column cut in half) and rows of more than sixteen pixels. The
// weight gradient (added into grad_weight) runs the same transforms on both and each
// ISA's GEMM, whose products sum in the same order.
TEST(Conv2dWinograd, Avx512GivesTheAvx2Bits) {
  if (!gemm_isa_supported(GemmIsa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  const RestoreGemmIsa restore;
  for (const CpuConvCase& c :
       {CpuConvCase({"fashion2_b3", 3, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 997),
        CpuConvCase({"odd_wide", 2, 16, 9, 37, 17, 3, 3, make_params(1, 1, 0, 1)}, 998),
        // Padding 0 across: backward-data's correlation pads 2 columns, masked off
        // from the AVX-512 input transform's loads.
        CpuConvCase({"pad_w0", 2, 24, 10, 19, 20, 3, 3, make_params(1, 1, 1, 0)}, 999)}) {
    auto run = [&](GemmIsa isa) {
      set_gemm_isa(isa);
      return c.run(cpu::Conv2dAlgorithm::Winograd).all();
    };
    const std::vector<float> avx2 = run(GemmIsa::Avx2), avx512 = run(GemmIsa::Avx512);
    ASSERT_EQ(avx512.size(), avx2.size());
    EXPECT_EQ(std::memcmp(avx512.data(), avx2.data(), avx2.size() * sizeof(float)), 0);
  }
}

// The tile blocks depend on the shape alone, and the weight gradient's groups of
// images (2 and 3 images for a batch of 37, a group's tile blocks crossing images)
// on the batch: 1, 2 and 3 threads, a tower's share of the pool, and a second run
// give the same bits.
TEST(Conv2dWinograd, SameBitsForAnyThreadCount) {
  const CpuConvCase c({"fashion2_b37", 37, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 995);
  const int saved = num_threads();
  auto run = [&] { return c.run(cpu::Conv2dAlgorithm::Winograd).all(); };
  set_num_threads(1);
  const std::vector<float> one = run();
  auto expect_as_one = [&](const std::vector<float>& many, const char* how) {
    ASSERT_EQ(many.size(), one.size());
    EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(float)), 0)
        << "results with " << how << " differ from one thread";
  };
  expect_as_one(run(), "one thread, run again");
  set_num_threads(2);
  expect_as_one(run(), "2 threads");
  set_num_threads(3);
  expect_as_one(run(), "3 threads");
  {
    const ThreadShare share(0, 2);
    expect_as_one(run(), "a tower's share of 2 of 3 threads");
  }
  set_num_threads(saved);
}

// Auto takes Winograd for all three passes of FashionNet's second layer, and im2col
// for its first layer (C = 1) and for shapes Winograd cannot do; a forced Winograd
// lowers those shapes too.
TEST(Conv2dWinograd, AutoPicksByShape) {
  const CpuConvCase conv2({"fashion2", 1, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 1001);
  const ConvOutputs automatic = conv2.run(cpu::Conv2dAlgorithm::Auto);
  const ConvOutputs winograd = conv2.run(cpu::Conv2dAlgorithm::Winograd);
  const ConvOutputs im2col = conv2.run(cpu::Conv2dAlgorithm::Im2col);
  EXPECT_EQ(automatic.y, winograd.y);
  EXPECT_NE(automatic.y, im2col.y);
  EXPECT_EQ(automatic.grad_x, winograd.grad_x);
  EXPECT_NE(automatic.grad_x, im2col.grad_x);
  EXPECT_EQ(automatic.grad_w, winograd.grad_w);
  EXPECT_NE(automatic.grad_w, im2col.grad_w);
  for (const ConvCase& k : {ConvCase{"fashion1", 2, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
                            ConvCase{"stride2", 1, 32, 9, 9, 32, 3, 3, make_params(2, 2, 1, 1)},
                            ConvCase{"pad2", 1, 32, 9, 9, 32, 3, 3, make_params(1, 1, 2, 2)}}) {
    SCOPED_TRACE(k.name);
    const CpuConvCase c(k, 1002);
    const ConvOutputs im2col = c.run(cpu::Conv2dAlgorithm::Im2col);
    EXPECT_EQ(c.run(cpu::Conv2dAlgorithm::Auto).all(), im2col.all());
    if (k.C > 1) EXPECT_EQ(c.run(cpu::Conv2dAlgorithm::Winograd).all(), im2col.all());
  }
}

// The AVX2 input transform reads a group's input columns with plain loads where
// all eight lie inside the row, and otherwise (at the padding) the eight inside it,
// moved to their lanes, the others cleared (masked loads on rows under eight
// columns). The same layer on the input embedded in zeros (the padding made real,
// sixteen more columns on the right, padding 0) reads every tile of the original
// output with plain loads, and each output column of Winograd depends on its tile's
// inputs alone: the original output's pixels must have the same bits. Rows of 28
// (ResNet-20's first stage), 13, 8 and 7 columns, both paddings. The embedded layer's
// tile rows are longer than four tiles, so this also checks the output transform's
// two tile rows a vector (rows of four tiles) against its one row a vector.
TEST(Conv2dWinograd, EdgeLoadsGiveTheEmbeddedBits) {
  if (!gemm_isa_supported(GemmIsa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  const RestoreGemmIsa restore;
  set_gemm_isa(GemmIsa::Avx2);
  const cpu::ScopedConv2dAlgorithm winograd(cpu::Conv2dAlgorithm::Winograd);
  for (const ConvCase& k :
       {ConvCase{"resnet_16", 2, 16, 28, 28, 16, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"odd_9x13", 1, 8, 9, 13, 8, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"W8_pad_w0", 1, 8, 6, 8, 16, 3, 3, make_params(1, 1, 1, 0)},
        ConvCase{"W7", 2, 8, 7, 7, 8, 3, 3, make_params(1, 1, 1, 1)},
        // Four tiles a row (Q of 7 or 8): the output transform takes two tile rows a
        // vector; 3 tile rows (a last one alone) and 64 channels, ResNet-20's last stage.
        ConvCase{"W7_three_tile_rows", 1, 8, 5, 7, 8, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"resnet_64", 3, 64, 7, 7, 64, 3, 3, make_params(1, 1, 1, 1)}}) {
    SCOPED_TRACE(k.name);
    const std::int64_t ph = k.params.pad_h, pw = k.params.pad_w;
    const std::int64_t H2 = k.H + 2 * ph, W2 = k.W + 2 * pw + 16;
    const ConvCase embedded{k.name, k.N, k.C, H2, W2, k.K, 3, 3, make_params(1, 1, 0, 0)};
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1401);
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), 1402);
    std::vector<float> x2(std::size_t(numel_of(embedded.x_shape())), 0.0f);  // [N,C,H2,W2]
    for (std::int64_t plane = 0; plane < k.N * k.C; ++plane) {
      for (std::int64_t h = 0; h < k.H; ++h) {
        std::copy_n(xv.begin() + (plane * k.H + h) * k.W, k.W,
                    x2.begin() + (plane * H2 + h + ph) * W2 + pw);
      }
    }
    auto forward = [&](const ConvCase& c, const std::vector<float>& x) {
      Tensor y = Tensor::empty(c.y_shape(), cpu());
      conv2d_forward(y, Tensor::from_host<float>(x, c.x_shape(), cpu()),
                     Tensor::from_host<float>(wv, c.w_shape(), cpu()), Tensor(), c.params, cpu());
      return y.to_host<float>(cpu());
    };
    const std::vector<float> y = forward(k, xv), y2 = forward(embedded, x2);
    const std::int64_t P = k.y_shape()[2], Q = k.y_shape()[3], Q2 = embedded.y_shape()[3];
    ASSERT_EQ(embedded.y_shape()[2], P);
    std::int64_t differing = 0;
    for (std::int64_t plane = 0; plane < k.N * k.K; ++plane) {
      for (std::int64_t p = 0; p < P; ++p) {
        differing += std::memcmp(y.data() + (plane * P + p) * Q, y2.data() + (plane * P + p) * Q2,
                                 std::size_t(Q) * sizeof(float)) != 0;
      }
    }
    EXPECT_EQ(differing, 0) << "output rows whose bits differ";
    // Control: the last input value 0.1% off changes bits the comparison sees.
    std::vector<float> nudged = xv;
    nudged.back() *= 1.001f;
    EXPECT_NE(forward(k, nudged), y) << "control";
  }
}

// Winograd's input gradient is its forward on grad_y (padded by 2 - pad) with each
// kernel turned 180 degrees and the channels swapped: the same transforms and
// products on the same values, so grad_x added onto a sentinel must have the bits
// of the sentinel plus that forward's y, on AVX2: 7x7 (the output transform's two
// tile rows a vector, accumulating) and 28x28 with 16 channels.
TEST(Conv2dWinograd, BackwardDataIsTheTurnedForward) {
  if (!gemm_isa_supported(GemmIsa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  const RestoreGemmIsa restore;
  set_gemm_isa(GemmIsa::Avx2);
  const cpu::ScopedConv2dAlgorithm winograd(cpu::Conv2dAlgorithm::Winograd);
  for (const ConvCase& k :
       {ConvCase{"7x7", 2, 16, 7, 7, 8, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"7x5_three_tile_rows", 1, 8, 5, 7, 16, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"28x28", 2, 16, 28, 28, 16, 3, 3, make_params(1, 1, 1, 1)}}) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), 1701);  // [K,C,3,3]
    const auto gv = random_values(std::size_t(numel_of(ys)), 1702);
    const auto sentinel = random_values(std::size_t(numel_of(k.x_shape())), 1703);
    auto grad_x = [&](const std::vector<float>& g) {
      Tensor gx = Tensor::from_host<float>(sentinel, k.x_shape(), cpu());
      conv2d_backward(gx, Tensor(), Tensor(), Tensor::from_host<float>(g, ys, cpu()),
                      Tensor::zeros(k.x_shape(), cpu()),
                      Tensor::from_host<float>(wv, k.w_shape(), cpu()), k.params, cpu());
      return gx.to_host<float>(cpu());
    };
    // The turned forward: C filters over K channels, turned[c,k,r,s] = weight[k,c,2-r,2-s].
    std::vector<float> turned(wv.size());
    for (std::int64_t f = 0; f < k.K; ++f) {
      for (std::int64_t c = 0; c < k.C; ++c) {
        for (int t = 0; t < 9; ++t) {
          turned[std::size_t((c * k.K + f) * 9 + t)] = wv[std::size_t((f * k.C + c) * 9 + 8 - t)];
        }
      }
    }
    const ConvCase forward{k.name, k.N, k.K, ys[2], ys[3], k.C, 3, 3, make_params(1, 1, 1, 1)};
    ASSERT_EQ(forward.y_shape(), k.x_shape());
    Tensor y = Tensor::empty(k.x_shape(), cpu());
    conv2d_forward(y, Tensor::from_host<float>(gv, ys, cpu()),
                   Tensor::from_host<float>(turned, forward.w_shape(), cpu()), Tensor(),
                   forward.params, cpu());
    std::vector<float> want = y.to_host<float>(cpu());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = sentinel[i] + want[i];
    const std::vector<float> got = grad_x(gv);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
    // Control: the last grad_y value 0.1% off changes bits the comparison sees.
    std::vector<float> nudged = gv;
    nudged.back() *= 1.001f;
    const std::vector<float> off = grad_x(nudged);
    EXPECT_NE(std::memcmp(off.data(), want.data(), want.size() * sizeof(float)), 0) << "control";
  }
}

// With at most 16 channels in and out (an even count out, rows of at least 8) the
// AVX2 forward and backward-data run each group of tiles through all three steps at
// once (kernels/cpu/winograd_fused.cpp, fused_applies), where more channels take the tile
// blocks and the GEMM: the same sums in the same order, so the same bits. Each
// output plane depends on its own filter alone, and each input-gradient plane on its
// own channel's kernels, so a layer of K filters must give the bits of the first K of
// a layer of 17 (blocked), and its input gradient, added onto a sentinel or assigned
// over NaNs, those of the first C channels of a layer of 17 channels. ResNet-20's
// first stage (16 and 16 on 28 x 28, bias), and odd sizes: 9 x 13 with padding only
// down the rows, and 6 and 10 channels.
TEST(Conv2dWinograd, FewChannelsGiveTheBlockedBits) {
  if (!gemm_isa_supported(GemmIsa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  const RestoreGemmIsa restore;
  set_gemm_isa(GemmIsa::Avx2);
  const cpu::ScopedConv2dAlgorithm winograd(cpu::Conv2dAlgorithm::Winograd);
  constexpr std::int64_t kWide = 17;  // channels that the blocked path takes
  for (const ConvCase& k : {ConvCase{"resnet_16", 2, 16, 28, 28, 16, 3, 3, make_params(1, 1, 1, 1)},
                            ConvCase{"odd_9x13", 1, 6, 9, 13, 10, 3, 3, make_params(1, 1, 1, 0)}}) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape(), xs = k.x_shape();
    const std::int64_t pq = ys[2] * ys[3], hw = xs[2] * xs[3];
    const auto xv = random_values(std::size_t(numel_of(xs)), 1801);
    const auto gv = random_values(std::size_t(numel_of(ys)), 1802);
    // The wide layers' weights and bias, the narrow layer's in their first filters
    // (forward) or channels (backward).
    const ConvCase wide_k{k.name, k.N, k.C, k.H, k.W, kWide, 3, 3, k.params};
    const ConvCase wide_c{k.name, k.N, kWide, k.H, k.W, k.K, 3, 3, k.params};
    const auto wide_kw = random_values(std::size_t(numel_of(wide_k.w_shape())), 1803);
    const auto bias = random_values(std::size_t(kWide), 1804);
    auto wide_cw = random_values(std::size_t(numel_of(wide_c.w_shape())), 1805);
    // The narrow weight [K,C,3,3]: the first K filters of wide_kw.
    const std::vector<float> wv(wide_kw.begin(), wide_kw.begin() + k.K * k.C * 9);
    for (std::int64_t f = 0; f < k.K; ++f) {  // wide_cw[f, c] = wv[f, c] for c < C
      std::copy_n(wv.begin() + f * k.C * 9, k.C * 9, wide_cw.begin() + f * kWide * 9);
    }
    // planes [first, first + count) of each image of `v` (planes of `size` floats, `of` an image)
    auto planes = [](const std::vector<float>& v, std::int64_t images, std::int64_t of,
                     std::int64_t count, std::int64_t size) {
      std::vector<float> out;
      for (std::int64_t n = 0; n < images; ++n) {
        out.insert(out.end(), v.begin() + n * of * size, v.begin() + (n * of + count) * size);
      }
      return out;
    };
    auto put = [](const std::vector<float>& v, const Shape& shape) {
      return Tensor::from_host<float>(v, shape, cpu());
    };

    auto forward = [&](const ConvCase& c, const std::vector<float>& w,
                       const std::vector<float>& x) {
      Tensor y = Tensor::empty(c.y_shape(), cpu());
      const std::vector<float> b(bias.begin(), bias.begin() + c.K);
      conv2d_forward(y, put(x, c.x_shape()), put(w, c.w_shape()), put(b, {c.K}), c.params, cpu());
      return y.to_host<float>(cpu());
    };
    const std::vector<float> y = forward(k, wv, xv);
    const std::vector<float> wide_y = planes(forward(wide_k, wide_kw, xv), k.N, kWide, k.K, pq);
    ASSERT_EQ(y.size(), wide_y.size());
    EXPECT_EQ(std::memcmp(y.data(), wide_y.data(), y.size() * sizeof(float)), 0) << "forward";
    std::vector<float> nudged = xv;  // control: the last input 0.1% off
    nudged.back() *= 1.001f;
    EXPECT_NE(forward(k, wv, nudged), y) << "forward control";

    // grad_x of layer c from gy onto `onto` (its image planes), added or assigned.
    auto grad_x = [&](const ConvCase& c, const std::vector<float>& w, const std::vector<float>& gy,
                      const std::vector<float>& onto, GradWrite write) {
      Tensor gx = put(onto, c.x_shape());
      conv2d_backward(gx, Tensor(), Tensor(), put(gy, ys), Tensor::zeros(c.x_shape(), cpu()),
                      put(w, c.w_shape()), c.params, cpu(), write);
      return gx.to_host<float>(cpu());
    };
    const auto wide_sentinel = random_values(std::size_t(numel_of(wide_c.x_shape())), 1806);
    const std::vector<float> sentinel = planes(wide_sentinel, k.N, kWide, k.C, hw);
    const std::vector<float> nans(wide_sentinel.size(), std::nanf(""));
    for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
      const bool added = write == GradWrite::Accumulate;
      SCOPED_TRACE(added ? "grad_x added" : "grad_x assigned");
      const std::vector<float> got =
          grad_x(k, wv, gv, added ? sentinel : planes(nans, k.N, kWide, k.C, hw), write);
      const std::vector<float> want = planes(
          grad_x(wide_c, wide_cw, gv, added ? wide_sentinel : nans, write), k.N, kWide, k.C, hw);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
      EXPECT_EQ(std::count_if(got.begin(), got.end(), [](float v) { return std::isnan(v); }), 0)
          << "control: a NaN left where grad_x was assigned";
      std::vector<float> off = gv;  // control: the last grad_y value 0.1% off
      off.back() *= 1.001f;
      const std::vector<float> moved =
          grad_x(k, wv, off, added ? sentinel : planes(nans, k.N, kWide, k.C, hw), write);
      EXPECT_NE(std::memcmp(moved.data(), want.data(), want.size() * sizeof(float)), 0)
          << "control";
    }
  }
}

// The weight gradient's last transform (A₂ᵀ S A₂, adds only) takes eight filters a
// vector on AVX2, then four, then one: each lane the same adds. Each filter's
// gradient depends on its own grad_y plane alone (the GEMM's columns are
// independent), so a layer of 8 filters (eight a vector) must give the bits of two
// layers of 4 (four a vector), and one of 13 filters (8 + 4 + 1) the bits of layers
// of 8, 4 and 1 on its planes: each on the AVX2 GEMM, padded and not.
TEST(Conv2dWinograd, WeightGradientFiltersHaveTheNarrowBits) {
  if (!gemm_isa_supported(GemmIsa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  const RestoreGemmIsa restore;
  set_gemm_isa(GemmIsa::Avx2);
  const cpu::ScopedConv2dAlgorithm winograd(cpu::Conv2dAlgorithm::Winograd);
  struct Split {
    ConvCase whole;
    std::vector<std::int64_t> parts;  // filters of each narrower layer, in order
  };
  for (const Split& split :
       {Split{{"K8", 3, 16, 14, 14, 8, 3, 3, make_params(1, 1, 1, 1)}, {4, 4}},
        Split{{"K13_pad0", 2, 8, 9, 11, 13, 3, 3, make_params(1, 1, 0, 0)}, {8, 4, 1}}}) {
    const ConvCase& k = split.whole;
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const std::int64_t pq = ys[2] * ys[3];
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1501);
    const auto gv = random_values(std::size_t(numel_of(ys)), 1502);  // [N,K,P,Q]
    // grad_weight [filters, C, 3, 3] from filters [first, first + filters) of grad_y.
    auto grad_w = [&](std::int64_t first, std::int64_t filters, const std::vector<float>& g) {
      const ConvCase part{k.name, k.N, k.C, k.H, k.W, filters, 3, 3, k.params};
      std::vector<float> gy;  // [N, filters, P, Q]
      for (std::int64_t n = 0; n < k.N; ++n) {
        gy.insert(gy.end(), g.begin() + (n * k.K + first) * pq,
                  g.begin() + (n * k.K + first + filters) * pq);
      }
      Tensor gw = Tensor::zeros(part.w_shape(), cpu());
      conv2d_backward(Tensor(), gw, Tensor(), Tensor::from_host<float>(gy, part.y_shape(), cpu()),
                      Tensor::from_host<float>(xv, k.x_shape(), cpu()),
                      Tensor::zeros(part.w_shape(), cpu()), k.params, cpu());
      return gw.to_host<float>(cpu());
    };
    const std::vector<float> whole = grad_w(0, k.K, gv);
    std::vector<float> parts;
    std::int64_t first = 0;
    for (std::int64_t filters : split.parts) {
      const std::vector<float> part = grad_w(first, filters, gv);
      parts.insert(parts.end(), part.begin(), part.end());
      first += filters;
    }
    ASSERT_EQ(parts.size(), whole.size());
    EXPECT_EQ(std::memcmp(parts.data(), whole.data(), whole.size() * sizeof(float)), 0);
    // Control: the first grad_y value 0.1% off changes bits the comparison sees.
    std::vector<float> nudged = gv;
    nudged.front() *= 1.001f;
    const std::vector<float> off = grad_w(0, k.K, nudged);
    EXPECT_NE(std::memcmp(off.data(), whole.data(), whole.size() * sizeof(float)), 0) << "control";
  }
}

// The weight gradient's AVX2 transforms (channel and filter counts multiples of 8)
// write V into the GEMM's panels of 6 channels, eight channels a vector split over
// two panels (6 + 2, 4 + 4, 2 + 6); with 9 filters the scalar transforms write the
// same values one by one. Each filter's gradient depends on its own grad_y plane, and
// these shapes keep the same tile blocks for 8 and 9 filters, so the 8 filters'
// gradients must have the bits of the first 8 of 9: C = 8 (a block of 360 tiles,
// past one of the GEMM's 256-tile steps), 16 (ResNet-20's first stage) and 32.
TEST(Conv2dWinograd, WeightGradientPanelsHaveTheScalarBits) {
  if (!gemm_isa_supported(GemmIsa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  const RestoreGemmIsa restore;
  set_gemm_isa(GemmIsa::Avx2);
  const cpu::ScopedConv2dAlgorithm winograd(cpu::Conv2dAlgorithm::Winograd);
  for (const ConvCase& k : {ConvCase{"C8_W60", 1, 8, 28, 60, 9, 3, 3, make_params(1, 1, 1, 1)},
                            ConvCase{"C16_W40", 2, 16, 28, 40, 9, 3, 3, make_params(1, 1, 1, 1)},
                            ConvCase{"C32_W28", 2, 32, 28, 28, 9, 3, 3, make_params(1, 1, 1, 1)}}) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const std::int64_t pq = ys[2] * ys[3];
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1601);
    const auto gv = random_values(std::size_t(numel_of(ys)), 1602);  // [N,9,P,Q]
    // grad_weight [filters, C, 3, 3] from the first `filters` planes of grad_y.
    auto grad_w = [&](std::int64_t filters, const std::vector<float>& x) {
      const ConvCase part{k.name, k.N, k.C, k.H, k.W, filters, 3, 3, k.params};
      std::vector<float> gy;  // [N, filters, P, Q]
      for (std::int64_t n = 0; n < k.N; ++n) {
        gy.insert(gy.end(), gv.begin() + n * k.K * pq, gv.begin() + (n * k.K + filters) * pq);
      }
      Tensor gw = Tensor::zeros(part.w_shape(), cpu());
      conv2d_backward(Tensor(), gw, Tensor(), Tensor::from_host<float>(gy, part.y_shape(), cpu()),
                      Tensor::from_host<float>(x, k.x_shape(), cpu()),
                      Tensor::zeros(part.w_shape(), cpu()), k.params, cpu());
      return gw.to_host<float>(cpu());
    };
    const std::vector<float> eight = grad_w(8, xv), nine = grad_w(9, xv);
    ASSERT_EQ(nine.size(), eight.size() / 8 * 9);
    EXPECT_EQ(std::memcmp(eight.data(), nine.data(), eight.size() * sizeof(float)), 0);
    // Control: the last input value 0.1% off changes bits the comparison sees.
    std::vector<float> nudged = xv;
    nudged.back() *= 1.001f;
    const std::vector<float> off = grad_w(8, nudged);
    EXPECT_NE(std::memcmp(off.data(), nine.data(), off.size() * sizeof(float)), 0) << "control";
  }
}

// The weight gradient asked for alone is the one computed beside grad_x, bit for
// bit: the two passes share the backward's image groups, not its arithmetic.
TEST(Conv2dWinograd, WeightGradientAloneHasTheSameBits) {
  const CpuConvCase c({"fashion2_b7", 7, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 1003);
  const cpu::ScopedConv2dAlgorithm winograd(cpu::Conv2dAlgorithm::Winograd);
  auto put = [](const std::vector<float>& v, const Shape& shape) {
    return Tensor::from_host<float>(v, shape, cpu());
  };
  Tensor grad_w = put(c.w_sentinel, c.k.w_shape());
  conv2d_backward(Tensor(), grad_w, Tensor(), put(c.gv, c.k.y_shape()), put(c.xv, c.k.x_shape()),
                  put(c.wv, c.k.w_shape()), c.k.params, cpu());
  const std::vector<float> alone = grad_w.to_host<float>(cpu());
  EXPECT_LE(worst_error(alone, c.grad_w, c.grad_w_scale), kWinogradTolerance);
  EXPECT_EQ(alone, c.run(cpu::Conv2dAlgorithm::Winograd).grad_w);
}

}  // namespace
}  // namespace towerlab::testing
