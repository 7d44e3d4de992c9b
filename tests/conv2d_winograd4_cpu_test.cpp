// Winograd F(4x4,3x3) on the CPU (kernels/cpu/winograd4.cpp), forced on for the
// forward and backward-data: against the reference within a tolerance scaled to
// each result's terms, with a control; the same bits on every ISA and for any
// thread count; the tile Auto picks; the backward-data pass as the turned forward,
// assigned and accumulated. (A 16-bit y as the float32 y rounded once:
// tests/conv2d_sixteen_bit_output_test.cpp, under both tiles.)
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>

#include "conv2d_cpu_case.h"
#include "cpu_isa.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/winograd.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// F(4x4,3x3)'s transforms weigh inputs by up to 5 (Bᵀ) and 8 (Aᵀ) and its kernels
// by fractions down to 1/24 (G): it rounds looser than F(2x2,3x3), though still
// within a few dozen units of float32 rounding u = 2^-24 of each result's terms,
// sum |w||x| (+ |b|, + |sentinel|): the cases below stay under 64 u (the errors go
// to the test's XML record). The
// tolerance is 256 u, as on CUDA (tests/conv2d_winograd_test.cpp); a pixel 1% off
// in one tile moves a result by more (the control below).
constexpr double kTolerance = 256.0 / (1 << 24);

// The weight gradient stays F(3x3,2x2) (kernels/cpu/winograd.h): its tolerance.
constexpr double kWeightGradientTolerance = 32.0 / (1 << 24);

std::vector<ConvCase> cases() {
  return {
      {"resnet_64_7x7", 3, 64, 7, 7, 64, 3, 3, make_params(1, 1, 1, 1)},
      {"resnet_32_14x14", 2, 32, 14, 14, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"odd_pad1", 3, 5, 13, 11, 7, 3, 3, make_params(1, 1, 1, 1)},
      {"odd_pad0_no_bias", 1, 3, 9, 12, 4, 3, 3, make_params(1, 1, 0, 0), false},
      {"pad1x0", 2, 6, 7, 6, 5, 3, 3, make_params(1, 1, 1, 0)},
      {"one_partial_tile", 1, 2, 3, 3, 3, 3, 3, make_params(1, 1, 0, 0)},
      {"one_row_pad1", 3, 3, 1, 2, 2, 3, 3, make_params(1, 1, 1, 1)},
      // Rows of more than eight tiles; many tile blocks (more than 64 tiles each).
      {"wide_rows", 2, 8, 6, 45, 9, 3, 3, make_params(1, 1, 1, 1)},
      {"many_blocks", 4, 16, 30, 30, 16, 3, 3, make_params(1, 1, 1, 1)},
      // More than kGemmKc = 256 channels each side: V's panels in two blocks of rows.
      {"C260_K258", 1, 260, 6, 5, 258, 3, 3, make_params(1, 1, 1, 1)},
  };
}

struct F4x4 {
  cpu::ScopedWinogradTile tile{cpu::WinogradTile::F4x4};
};

TEST(Conv2dWinograd4, MatchesReferenceWithinTheTermMagnitudes) {
  const F4x4 f4x4;
  unsigned seed = 4100;
  for (const ConvCase& k : cases()) {
    SCOPED_TRACE(k.name);
    const CpuConvCase c(k, seed += 10);
    std::ostringstream errors;
    errors << std::scientific << std::setprecision(2);
    for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
      SCOPED_TRACE(isa);
      const ConvOutputs got = c.run(cpu::Conv2dAlgorithm::Winograd);
      const double y = worst_error(got.y, c.y, c.y_scale);
      const double gx = worst_error(got.grad_x, c.grad_x, c.grad_x_scale);
      EXPECT_LE(y, kTolerance) << "y";
      EXPECT_LE(gx, kTolerance) << "grad_x";
      EXPECT_LE(worst_error(got.grad_w, c.grad_w, c.grad_w_scale), kWeightGradientTolerance);
      errors << isa << ": y " << y << ", grad_x " << gx << "; ";
    });
    // The larger tile really ran: its bits differ from F(2x2)'s.
    const ConvOutputs f4 = c.run(cpu::Conv2dAlgorithm::Winograd);
    const cpu::ScopedWinogradTile f2x2(cpu::WinogradTile::F2x2);
    const ConvOutputs f2 = c.run(cpu::Conv2dAlgorithm::Winograd);
    if (k.C * k.K >= 16) {
      EXPECT_NE(f4.y, f2.y);
      EXPECT_NE(f4.grad_x, f2.grad_x);
    }
    EXPECT_EQ(f4.grad_w, f2.grad_w) << "the weight gradient is F(3x3,2x2) under both";
    RecordProperty("worst_error_" + k.name, errors.str());
  }
}

// Control: one input pixel 1% off in one tile, and one grad_y value, fail the check.
TEST(Conv2dWinograd4, ToleranceCatchesOneWrongTile) {
  const F4x4 f4x4;
  const CpuConvCase c({"resnet_32", 2, 32, 14, 14, 32, 3, 3, make_params(1, 1, 1, 1)}, 4190);
  CpuConvCase wrong_x = c, wrong_g = c;
  const std::size_t pixel = (1 * 32 + 7) * 14 * 14 + 5 * 14 + 9;  // n 1, channel 7, (5, 9)
  wrong_x.xv[pixel] *= 1.01f;
  wrong_g.gv[pixel] *= 1.01f;
  const ConvOutputs right = c.run(cpu::Conv2dAlgorithm::Winograd);
  EXPECT_LE(worst_error(right.y, c.y, c.y_scale), kTolerance);
  EXPECT_LE(worst_error(right.grad_x, c.grad_x, c.grad_x_scale), kTolerance);
  EXPECT_GT(worst_error(wrong_x.run(cpu::Conv2dAlgorithm::Winograd).y, c.y, c.y_scale), kTolerance);
  EXPECT_GT(
      worst_error(wrong_g.run(cpu::Conv2dAlgorithm::Winograd).grad_x, c.grad_x, c.grad_x_scale),
      kTolerance);
}

// The blocks are the shape's: 1, 2 and 3 threads give the same bits. The AVX2
// transforms serve the AVX2 and the AVX-512 GEMM alike (the latter's panels 32
// tiles wide, V's eight-tile vectors inside them), whose products sum in the same
// order: the same bits. (The portable GEMM sums in its own order: the reference
// test holds it.)
TEST(Conv2dWinograd4, SameBitsForAnyThreadCount) {
  const F4x4 f4x4;
  const CpuConvCase c({"odd_wide_b5", 5, 33, 9, 23, 40, 3, 3, make_params(1, 1, 1, 0)}, 4200);
  const int saved = num_threads();
  set_num_threads(1);
  const std::vector<float> one = c.run(cpu::Conv2dAlgorithm::Winograd).all();
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    const std::vector<float> all = c.run(cpu::Conv2dAlgorithm::Winograd).all();
    ASSERT_EQ(all.size(), one.size());
    EXPECT_EQ(std::memcmp(all.data(), one.data(), all.size() * sizeof(float)), 0)
        << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(Conv2dWinograd4, Avx512GivesTheAvx2Bits) {
  if (!gemm_isa_supported(GemmIsa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  const F4x4 f4x4;
  const CpuConvCase c({"odd_wide_b5", 5, 33, 9, 23, 40, 3, 3, make_params(1, 1, 1, 0)}, 4200);
  const RestoreGemmIsa restore;
  set_gemm_isa(GemmIsa::Avx2);
  const std::vector<float> avx2 = c.run(cpu::Conv2dAlgorithm::Winograd).all();
  set_gemm_isa(GemmIsa::Avx512);
  const std::vector<float> avx512 = c.run(cpu::Conv2dAlgorithm::Winograd).all();
  ASSERT_EQ(avx512.size(), avx2.size());
  EXPECT_EQ(std::memcmp(avx512.data(), avx2.data(), avx2.size() * sizeof(float)), 0);
}

// Auto takes F(4x4) where both channel counts are 32 or more (ResNet-20's second and
// third stages, FashionNet's 32 -> 64 layer), F(2x2) for ResNet-20's 16-channel stage
// and a 16 -> 64 layer.
TEST(Conv2dWinograd4, AutoPicksTheTileByShape) {
  for (const ConvCase& k :
       {ConvCase{"c32", 1, 32, 14, 14, 32, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"c16", 1, 16, 28, 28, 16, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"c16_k64", 1, 16, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}}) {
    SCOPED_TRACE(k.name);
    const CpuConvCase c(k, 4300);
    const ConvOutputs automatic = c.run(cpu::Conv2dAlgorithm::Auto);
    ConvOutputs f4, f2;
    {
      const cpu::ScopedWinogradTile tile(cpu::WinogradTile::F4x4);
      f4 = c.run(cpu::Conv2dAlgorithm::Winograd);
    }
    {
      const cpu::ScopedWinogradTile tile(cpu::WinogradTile::F2x2);
      f2 = c.run(cpu::Conv2dAlgorithm::Winograd);
    }
    ASSERT_NE(f4.y, f2.y);
    const bool wide = k.C >= 32 && k.K >= 32;
    EXPECT_EQ(automatic.y, wide ? f4.y : f2.y);
    EXPECT_EQ(automatic.grad_x, wide ? f4.grad_x : f2.grad_x);
  }
}

// The input gradient is the forward on grad_y (padded by 2 - pad) with the kernels
// turned and the channels swapped: grad_x added onto a sentinel has the bits of the
// sentinel plus that forward's y, and assigned over NaNs (a first write) the bits
// of the forward's y added onto zeros. Padding 1 (the turned forward's, which
// Winograd takes), odd sizes.
TEST(Conv2dWinograd4, BackwardDataIsTheTurnedForward) {
  const F4x4 f4x4;
  const cpu::ScopedConv2dAlgorithm winograd(cpu::Conv2dAlgorithm::Winograd);
  for (const ConvCase& k : {ConvCase{"7x7", 2, 40, 7, 7, 36, 3, 3, make_params(1, 1, 1, 1)},
                            ConvCase{"13x10", 1, 9, 13, 10, 12, 3, 3, make_params(1, 1, 1, 1)}}) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), 4401);  // [K,C,3,3]
    const auto gv = random_values(std::size_t(numel_of(ys)), 4402);
    const auto sentinel = random_values(std::size_t(numel_of(k.x_shape())), 4403);
    std::vector<float> turned(wv.size());  // turned[c,k,r,s] = weight[k,c,2-r,2-s]
    for (std::int64_t f = 0; f < k.K; ++f) {
      for (std::int64_t c = 0; c < k.C; ++c) {
        for (int t = 0; t < 9; ++t) {
          turned[std::size_t((c * k.K + f) * 9 + t)] = wv[std::size_t((f * k.C + c) * 9 + 8 - t)];
        }
      }
    }
    const std::int64_t pad = 2 - k.params.pad_h;
    const ConvCase forward{k.name, k.N, k.K, ys[2], ys[3], k.C, 3, 3, make_params(1, 1, pad, pad)};
    ASSERT_EQ(forward.y_shape(), k.x_shape());
    Tensor y = Tensor::empty(k.x_shape(), cpu());
    conv2d_forward(y, Tensor::from_host<float>(gv, ys, cpu()),
                   Tensor::from_host<float>(turned, forward.w_shape(), cpu()), Tensor(),
                   forward.params, cpu());
    const std::vector<float> turned_y = y.to_host<float>(cpu());
    auto grad_x = [&](const std::vector<float>& start, bool accumulate) {
      Tensor gx = Tensor::from_host<float>(start, k.x_shape(), cpu());
      conv2d_backward(gx, Tensor(), Tensor(), Tensor::from_host<float>(gv, ys, cpu()),
                      Tensor::zeros(k.x_shape(), cpu()),
                      Tensor::from_host<float>(wv, k.w_shape(), cpu()), k.params, cpu(),
                      accumulate ? GradWrite::Accumulate : GradWrite::Assign);
      return gx.to_host<float>(cpu());
    };
    std::vector<float> added = turned_y;
    for (std::size_t i = 0; i < added.size(); ++i) added[i] = sentinel[i] + turned_y[i];
    const std::vector<float> accumulated = grad_x(sentinel, true);
    EXPECT_EQ(std::memcmp(accumulated.data(), added.data(), added.size() * sizeof(float)), 0);
    const std::vector<float> nans(sentinel.size(), std::numeric_limits<float>::quiet_NaN());
    const std::vector<float> assigned = grad_x(nans, false);
    std::vector<float> onto_zeros = turned_y;
    for (float& v : onto_zeros) v = 0.0f + v;
    EXPECT_EQ(std::memcmp(assigned.data(), onto_zeros.data(), added.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace towerlab::testing
