// The CPU's own conv2d paths, each checked on every ISA the machine has: the
// direct path for one input channel, col2im's vector path, the implicit weight
// gradient, the backward's image groups (the same bits for any thread count), and
// Winograd F(2x2,3x3) (kernels/cpu/winograd.h), forced on: against the reference
// within a tolerance scaled to each result's terms, with controls, and the same
// bits for any thread count and ISA.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <string>

#include "conv2d_case.h"
#include "cpu_isa.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/conv2d_implicit.h"
#include "kernels/cpu/matmul.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// --- the CPU's direct path on every ISA -----------------------------------------
//
// One input channel, 3x3, unit stride runs a direct convolution (no im2col,
// kernels/cpu/conv2d_direct.h): eight pixels a vector with AVX2, sixteen with
// AVX-512. Each output is the same chain of nine fused multiply-adds either way, and
// the weight gradient's sixteen lane sums are the AVX-512 vector's lanes or two AVX2
// vectors' halves, so the two give the same bits. The shapes cover P*Q a multiple of
// sixteen (Q = 16, 28), a last group of 11, 14 and 1 pixels (in AVX2's terms: a
// half partly full, or empty), P*Q = 8 (the forward's AVX2 code on both), an odd
// K (a filter without a partner), and groups of several images (N = 35).
std::vector<ConvCase> direct_cases() {
  return {
      {"Q16", 2, 1, 18, 18, 5, 3, 3, make_params(1, 1, 0, 0)},
      {"Q19_pad1x0", 2, 1, 9, 21, 4, 3, 3, make_params(1, 1, 1, 0), false},
      {"Q28_K32", 3, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"Q70", 1, 1, 5, 70, 3, 3, 3, make_params(1, 1, 1, 1)},
      {"PQ33", 2, 1, 5, 13, 6, 3, 3, make_params(1, 1, 0, 0)},
      {"PQ8", 2, 1, 3, 10, 3, 3, 3, make_params(1, 1, 0, 0)},
      {"N35_groups", 35, 1, 12, 12, 7, 3, 3, make_params(1, 1, 1, 1)},
  };
}

// y, then grad_weight added to a sentinel, of one direct case on the CPU.
std::vector<float> direct_outputs(const ConvCase& k, const std::vector<float>& xv, unsigned seed) {
  const auto wv = random_values(std::size_t(numel_of(k.w_shape())), seed);
  const auto bv = random_values(std::size_t(k.K), seed + 1);
  const auto gv = random_values(std::size_t(numel_of(k.y_shape())), seed + 2);
  const auto sentinel = random_values(wv.size(), seed + 3);
  auto put = [](const std::vector<float>& v, const Shape& shape) {
    return Tensor::from_host<float>(v, shape, cpu());
  };
  const Tensor x = put(xv, k.x_shape()), w = put(wv, k.w_shape());
  Tensor y = Tensor::empty(k.y_shape(), cpu());
  conv2d_forward(y, x, w, k.bias ? put(bv, {k.K}) : Tensor(), k.params, cpu());
  Tensor grad_w = put(sentinel, k.w_shape());
  conv2d_backward(Tensor(), grad_w, Tensor(), put(gv, k.y_shape()), x, w, k.params, cpu());
  std::vector<float> all = y.to_host<float>(cpu());
  const std::vector<float> gw = grad_w.to_host<float>(cpu());
  all.insert(all.end(), gw.begin(), gw.end());
  return all;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Conv2dDirect, Avx512GivesTheAvx2Bits) {
  if (!gemm_isa_supported(GemmIsa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  const RestoreGemmIsa restore;
  for (const ConvCase& k : direct_cases()) {
    SCOPED_TRACE(k.name);
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1201);
    auto run = [&](GemmIsa isa, const std::vector<float>& x) {
      set_gemm_isa(isa);
      return direct_outputs(k, x, 1202);
    };
    const std::vector<float> avx2 = run(GemmIsa::Avx2, xv);
    EXPECT_TRUE(same_bits(run(GemmIsa::Avx512, xv), avx2));
    // Control: the last input value 0.1% off changes bits of y and of grad_weight,
    // and the comparison sees both.
    std::vector<float> nudged = xv;
    nudged.back() *= 1.001f;
    const std::vector<float> off = run(GemmIsa::Avx512, nudged);
    const auto y_size = std::ptrdiff_t(numel_of(k.y_shape()));
    EXPECT_FALSE(
        same_bits({off.begin(), off.begin() + y_size}, {avx2.begin(), avx2.begin() + y_size}))
        << "the control's y";
    EXPECT_FALSE(same_bits({off.begin() + y_size, off.end()}, {avx2.begin() + y_size, avx2.end()}))
        << "the control's grad_weight";
  }
}

// The direct path's images are split over threads in fixed groups: 1, 2 and 3
// threads and a tower's share of the pool give the same bits, on the ISA this CPU
// runs.
TEST(Conv2dDirect, SameBitsForAnyThreadCount) {
  const int saved = num_threads();
  for (const ConvCase& k : direct_cases()) {
    SCOPED_TRACE(k.name);
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1301);
    set_num_threads(1);
    const std::vector<float> one = direct_outputs(k, xv, 1302);
    set_num_threads(2);
    EXPECT_TRUE(same_bits(direct_outputs(k, xv, 1302), one)) << "2 threads";
    set_num_threads(3);
    EXPECT_TRUE(same_bits(direct_outputs(k, xv, 1302), one)) << "3 threads";
    const ThreadShare share(0, 2);
    EXPECT_TRUE(same_bits(direct_outputs(k, xv, 1302), one)) << "a tower's share of 2 of 3";
  }
  set_num_threads(saved);
}

// --- col2im's vector path ---------------------------------------------------------
//
// With unit strides and Q == W, or with stride 2 across, col2im sums each input
// pixel's taps eight pixels at a time (AVX2, whenever the GEMM runs AVX2 or AVX-512)
// instead of tap by tap over the plane; each pixel must still add its taps in the
// same order. With one output
// channel every element of the patch gradient is a single product, the same bits on
// every GEMM, so the input gradients of the portable build (the tap-by-tap loop)
// and of the vector path must agree bit for bit, added onto a random grad_x (the
// accumulation is part of the order).
TEST(Conv2dCol2im, VectorPathGivesTheTapByTapBits) {
  if (!gemm_isa_supported(GemmIsa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  const RestoreGemmIsa restore;
  for (const ConvCase& k :
       {ConvCase{"14x14", 3, 5, 14, 14, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"5x7", 2, 3, 5, 7, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"1x1_plane", 2, 2, 1, 1, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"9x22", 1, 2, 9, 22, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"3x5_kernel", 2, 2, 6, 11, 1, 3, 5, make_params(1, 1, 1, 2)},
        ConvCase{"dilation2", 2, 2, 9, 8, 1, 3, 3, make_params(1, 1, 2, 2, 2, 2)},
        // Stride 2 across: 3x3 with padding 1 gathers each pixel's taps (the first
        // two, a last group of 6 (Q = 14) and 7 (Q = 7) outputs, W = 1 and the last three
        // cases); the even lanes of a copy of each plane for padding 2, dilation and
        // stride 3 down; a 1x1 kernel (the tap-by-tap loop on both). Each case also
        // assigned, onto a grad_x of NaNs.
        ConvCase{"stride2_28x28", 2, 3, 28, 28, 1, 3, 3, make_params(2, 2, 1, 1)},
        ConvCase{"stride2_14x14", 2, 3, 14, 14, 1, 3, 3, make_params(2, 2, 1, 1)},
        ConvCase{"stride2_1x1", 2, 4, 28, 28, 1, 1, 1, make_params(2, 2, 0, 0)},
        ConvCase{"stride2_W41_pad2", 1, 2, 9, 41, 1, 3, 3, make_params(2, 2, 2, 2)},
        ConvCase{"stride3x2_dilation2", 2, 2, 13, 17, 1, 3, 3, make_params(3, 2, 1, 2, 2, 2)},
        ConvCase{"stride2_W1", 2, 2, 5, 1, 1, 3, 3, make_params(2, 2, 1, 1)},
        // 3x3, stride 2, padding 1 gathers each pixel's taps (col2im_gather_avx2):
        // odd H and W (a last group of 11 pixels), a last group of 1 (W = 17), and a
        // 2x3 plane.
        ConvCase{"stride2_gather_27x13", 2, 3, 27, 13, 1, 3, 3, make_params(2, 2, 1, 1)},
        ConvCase{"stride2_gather_6x17", 1, 2, 6, 17, 1, 3, 3, make_params(2, 2, 1, 1)},
        ConvCase{"stride2_gather_2x3", 2, 2, 2, 3, 1, 3, 3, make_params(2, 2, 1, 1)}}) {
    SCOPED_TRACE(k.name);
    const auto gyv = random_values(std::size_t(numel_of(k.y_shape())), 1301);
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), 1302);
    const auto gxv = random_values(std::size_t(numel_of(k.x_shape())), 1303);
    auto grad_x = [&](GemmIsa isa, const std::vector<float>& gy,
                      GradWrite write = GradWrite::Accumulate) {
      set_gemm_isa(isa);
      // An assigned grad_x starts as NaN, which it must not read.
      Tensor gx =
          write == GradWrite::Assign
              ? Tensor::from_host<float>(std::vector<float>(gxv.size(), NAN), k.x_shape(), cpu())
              : Tensor::from_host<float>(gxv, k.x_shape(), cpu());
      conv2d_backward(gx, Tensor(), Tensor(), Tensor::from_host<float>(gy, k.y_shape(), cpu()),
                      Tensor::zeros(k.x_shape(), cpu()),
                      Tensor::from_host<float>(wv, k.w_shape(), cpu()), k.params, cpu(), write);
      return gx.to_host<float>(cpu());
    };
    const std::vector<float> tap_by_tap = grad_x(GemmIsa::Portable, gyv);
    const std::vector<float> vector = grad_x(GemmIsa::Avx2, gyv);
    ASSERT_EQ(vector.size(), tap_by_tap.size());
    EXPECT_EQ(std::memcmp(vector.data(), tap_by_tap.data(), vector.size() * sizeof(float)), 0);
    const std::vector<float> assigned = grad_x(GemmIsa::Avx2, gyv, GradWrite::Assign);
    EXPECT_EQ(std::memcmp(assigned.data(), grad_x(GemmIsa::Portable, gyv, GradWrite::Assign).data(),
                          assigned.size() * sizeof(float)),
              0)
        << "assigned";
    // Control: the last gradient value 0.1% off changes the bits the comparison sees.
    std::vector<float> nudged = gyv;
    nudged.back() *= 1.001f;
    const std::vector<float> off = grad_x(GemmIsa::Avx2, nudged);
    EXPECT_NE(std::memcmp(off.data(), tap_by_tap.data(), off.size() * sizeof(float)), 0)
        << "control";
  }
}

// --- the implicit weight gradient --------------------------------------------------
//
// On AVX2 and AVX-512, the weight gradient of a 3x3 convolution of stride 1 or 2 with
// K a multiple of 32 broadcasts the patches from the padded image instead of im2col +
// GEMM; each ISA's kernel must give the bits of im2col (here by plain loops) and that
// ISA's GEMM: padded and not, one block of the GEMM's inner dimension and several
// (784 pixels), a 1x1 output, assigned (an image group's first image) and added onto
// a random partial. Then the whole weight gradient: the AVX2 and AVX-512 paths agree.

// col [C*9, P*Q] of one image x [C,H,W]: the patches, zeros in the padding.
std::vector<float> patch_matrix(const std::vector<float>& x, const Conv2dShape& s) {
  std::vector<float> col(std::size_t(s.C * 9 * s.P * s.Q));
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t r = 0; r < 3; ++r) {
      for (std::int64_t t = 0; t < 3; ++t) {
        for (std::int64_t h = 0; h < s.P; ++h) {
          for (std::int64_t w = 0; w < s.Q; ++w) {
            const std::int64_t ih = h * s.params.stride_h + r - s.params.pad_h;
            const std::int64_t iw = w * s.params.stride_w + t - s.params.pad_w;
            const bool inside = ih >= 0 && ih < s.H && iw >= 0 && iw < s.W;
            col[std::size_t(((c * 9 + r * 3 + t) * s.P + h) * s.Q + w)] =
                inside ? x[std::size_t((c * s.H + ih) * s.W + iw)] : 0.0f;
          }
        }
      }
    }
  }
  return col;
}

TEST(Conv2dImplicitWeightGrad, GivesTheGemmBits) {
  const RestoreGemmIsa restore;
  int isas_run = 0;
  for (GemmIsa isa : {GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas_run;
    for (const ConvCase& k :
         {ConvCase{"14x14_K64", 1, 5, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
          ConvCase{"28x28_K32", 1, 2, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
          ConvCase{"pad0_5x9_K96", 1, 3, 5, 9, 96, 3, 3, make_params(1, 1, 0, 0)},
          ConvCase{"pad1x0_K32", 1, 2, 6, 11, 32, 3, 3, make_params(1, 1, 1, 0)},
          ConvCase{"1x1_output", 1, 3, 3, 3, 32, 3, 3, make_params(1, 1, 0, 0)},
          // Stride 2: ResNet-20's downsampling layers on Fashion-MNIST (784 pixels in,
          // one block of the GEMM's inner dimension out), an odd width without
          // padding, and stride 2 one way only.
          ConvCase{"stride2_28x28_K32", 1, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)},
          ConvCase{"stride2_14x14_K64", 1, 5, 14, 14, 64, 3, 3, make_params(2, 2, 1, 1)},
          ConvCase{"stride2_pad0_9x13_K32", 1, 3, 9, 13, 32, 3, 3, make_params(2, 2, 0, 0)},
          ConvCase{"stride2x1_K32", 1, 2, 9, 8, 32, 3, 3, make_params(2, 1, 1, 0)},
          ConvCase{"stride1x2_K32", 1, 2, 8, 9, 32, 3, 3, make_params(1, 2, 0, 1)}}) {
      SCOPED_TRACE(k.name + (isa == GemmIsa::Avx2 ? " on AVX2" : " on AVX-512"));
      const Shape ys = k.y_shape();
      const Conv2dShape s{1, k.C, k.H, k.W, k.K, 3, 3, ys[2], ys[3], k.params};
      ASSERT_TRUE(cpu::implicit_weight_grad_applies(s));
      const std::int64_t crs = s.C * 9, pq = s.P * s.Q;
      const auto x = random_values(std::size_t(numel_of(k.x_shape())), 1501);
      const auto gy = random_values(std::size_t(s.K * pq), 1503);
      const auto start = random_values(std::size_t(crs * s.K), 1504);
      const std::vector<float> col = patch_matrix(x, s);
      std::vector<float> scratch(std::size_t(cpu::implicit_weight_grad_scratch(s)));
      for (bool first : {true, false}) {
        SCOPED_TRACE(first ? "assigned" : "added");
        std::vector<float> gemm = start, implicit = start;  // [C*9, K]
        cpu::gemm<float>(false, true, crs, s.K, pq, 1.0f, col.data(), pq, gy.data(), pq,
                         first ? 0.0f : 1.0f, gemm.data(), s.K);
        cpu::implicit_weight_grad(x.data(), gy.data(), implicit.data(), first, scratch.data(), s);
        EXPECT_EQ(std::memcmp(implicit.data(), gemm.data(), gemm.size() * sizeof(float)), 0);
        // Control: the last gradient value 0.1% off changes the bits the comparison sees.
        std::vector<float> nudged = gy, off = start;
        nudged.back() *= 1.001f;
        cpu::implicit_weight_grad(x.data(), nudged.data(), off.data(), first, scratch.data(), s);
        EXPECT_NE(std::memcmp(off.data(), gemm.data(), gemm.size() * sizeof(float)), 0)
            << "control";
      }
    }
  }
  if (isas_run == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512";
}

TEST(Conv2dImplicitWeightGrad, Avx512GivesTheAvx2Bits) {
  if (!gemm_isa_supported(GemmIsa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  const RestoreGemmIsa restore;
  for (const ConvCase& k :
       {ConvCase{"C32_K64_14x14", 3, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"C16_K32_28x28_stride2", 3, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)}}) {
    SCOPED_TRACE(k.name);
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1511);
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), 1512);
    const auto gyv = random_values(std::size_t(numel_of(k.y_shape())), 1513);
    auto grad_weight = [&](GemmIsa isa) {
      set_gemm_isa(isa);
      Tensor gw = Tensor::zeros(k.w_shape(), cpu());
      conv2d_backward(Tensor(), gw, Tensor(), Tensor::from_host<float>(gyv, k.y_shape(), cpu()),
                      Tensor::from_host<float>(xv, k.x_shape(), cpu()),
                      Tensor::from_host<float>(wv, k.w_shape(), cpu()), k.params, cpu());
      return gw.to_host<float>(cpu());
    };
    const std::vector<float> avx2 = grad_weight(GemmIsa::Avx2);
    const std::vector<float> avx512 = grad_weight(GemmIsa::Avx512);
    EXPECT_EQ(std::memcmp(avx2.data(), avx512.data(), avx2.size() * sizeof(float)), 0);
  }
}

// --- the CPU backward's image groups -------------------------------------------
//
// The CPU backward sums the weight gradient over fixed groups of images whatever
// the thread count, and each image's input gradient does not depend on its group:
// 1, 2 and 3 threads, a tower's share of the pool, and a second run give the same
// bits, for batches that leave uneven groups.
TEST(Conv2dBackwardGroups, SameBitsForAnyThreadCount) {
  for (const ConvCase& k :
       {ConvCase{"3x3_batch150", 150, 8, 9, 9, 12, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"3x3_K32_batch37", 37, 3, 7, 7, 32, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"1x1_batch37", 37, 16, 6, 6, 20, 1, 1, make_params(1, 1, 0, 0)}}) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1101);
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), 1102);
    const auto gv = random_values(std::size_t(numel_of(ys)), 1103);
    const auto sx = random_values(xv.size(), 1104), sw = random_values(wv.size(), 1105);
    // grad_x then grad_weight, both added to sentinels.
    auto run = [&](const std::vector<float>& grad_y) {
      const cpu::ScopedConv2dAlgorithm im2col(cpu::Conv2dAlgorithm::Im2col);
      auto put = [](const std::vector<float>& v, const Shape& shape) {
        return Tensor::from_host<float>(v, shape, cpu());
      };
      Tensor grad_x = put(sx, k.x_shape()), grad_w = put(sw, k.w_shape());
      conv2d_backward(grad_x, grad_w, Tensor(), put(grad_y, ys), put(xv, k.x_shape()),
                      put(wv, k.w_shape()), k.params, cpu());
      std::vector<float> all = grad_x.to_host<float>(cpu());
      const std::vector<float> gw = grad_w.to_host<float>(cpu());
      all.insert(all.end(), gw.begin(), gw.end());
      return all;
    };
    const int saved = num_threads();
    set_num_threads(1);
    const std::vector<float> one = run(gv);
    auto same_bits = [&](const std::vector<float>& many) {
      return many.size() == one.size() &&
             std::memcmp(many.data(), one.data(), one.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same_bits(run(gv))) << "one thread, run again";
    // Control: one grad_y value of the last image 0.1% off changes bits of both
    // gradients, and the comparison sees it.
    std::vector<float> nudged = gv;
    nudged.back() *= 1.001f;
    const std::vector<float> off = run(nudged);
    EXPECT_FALSE(same_bits(off)) << "the control";
    EXPECT_NE(std::vector<float>(off.begin(), off.begin() + std::ptrdiff_t(sx.size())),
              std::vector<float>(one.begin(), one.begin() + std::ptrdiff_t(sx.size())))
        << "the control's grad_x";
    EXPECT_NE(std::vector<float>(off.begin() + std::ptrdiff_t(sx.size()), off.end()),
              std::vector<float>(one.begin() + std::ptrdiff_t(sx.size()), one.end()))
        << "the control's grad_weight";
    set_num_threads(2);
    EXPECT_TRUE(same_bits(run(gv))) << "2 threads";
    set_num_threads(3);
    EXPECT_TRUE(same_bits(run(gv))) << "3 threads";
    {
      const ThreadShare share(0, 2);
      EXPECT_TRUE(same_bits(run(gv))) << "a tower's share of 2 of 3 threads";
    }
    set_num_threads(saved);
  }
}

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

// y from the forward, then grad_x and grad_weight from one backward (added to the
// sentinels) on the CPU, under `algorithm`.
struct ConvOutputs {
  std::vector<float> y, grad_x, grad_w;

  std::vector<float> all() const {
    std::vector<float> joined = y;
    joined.insert(joined.end(), grad_x.begin(), grad_x.end());
    joined.insert(joined.end(), grad_w.begin(), grad_w.end());
    return joined;
  }
};
ConvOutputs run_cpu(const ConvCase& k, const std::vector<float>& xv, const std::vector<float>& wv,
                    const std::vector<float>& bv, const std::vector<float>& gv,
                    const std::vector<float>& sentinel, const std::vector<float>& w_sentinel,
                    cpu::Conv2dAlgorithm algorithm) {
  const cpu::ScopedConv2dAlgorithm scoped(algorithm);
  auto put = [](const std::vector<float>& v, const Shape& shape) {
    return Tensor::from_host<float>(v, shape, cpu());
  };
  const Shape ys = k.y_shape();
  Tensor y = put(std::vector<float>(std::size_t(numel_of(ys)), 7.0f), ys);
  conv2d_forward(y, put(xv, k.x_shape()), put(wv, k.w_shape()), k.bias ? put(bv, {k.K}) : Tensor(),
                 k.params, cpu());
  Tensor grad_x = put(sentinel, k.x_shape()), grad_w = put(w_sentinel, k.w_shape());
  conv2d_backward(grad_x, grad_w, Tensor(), put(gv, ys), put(xv, k.x_shape()), put(wv, k.w_shape()),
                  k.params, cpu());
  return {y.to_host<float>(cpu()), grad_x.to_host<float>(cpu()), grad_w.to_host<float>(cpu())};
}

// The reference values of one case and the magnitude sums that scale its tolerance.
struct WinogradCase {
  ConvCase k;
  std::vector<float> xv, wv, bv, gv, sentinel, w_sentinel;
  std::vector<double> y, grad_x, grad_w, y_scale, grad_x_scale, grad_w_scale;

  WinogradCase(const ConvCase& c, unsigned seed) : k(c) {
    xv = random_values(std::size_t(numel_of(k.x_shape())), seed);
    wv = random_values(std::size_t(numel_of(k.w_shape())), seed + 1);
    bv = random_values(std::size_t(k.K), seed + 2);
    gv = random_values(std::size_t(numel_of(k.y_shape())), seed + 3);
    sentinel = random_values(xv.size(), seed + 4);
    w_sentinel = random_values(wv.size(), seed + 5);
    const Reference ref = reference(k, widen(xv), widen(wv), widen(bv), widen(gv));
    const Reference abs =
        reference(k, magnitudes(xv), magnitudes(wv), magnitudes(bv), magnitudes(gv));
    y = ref.y;
    y_scale = abs.y;
    for (std::size_t i = 0; i < xv.size(); ++i) {
      grad_x.push_back(double(sentinel[i]) + ref.grad_x[i]);
      grad_x_scale.push_back(std::fabs(double(sentinel[i])) + abs.grad_x[i]);
    }
    for (std::size_t i = 0; i < wv.size(); ++i) {
      grad_w.push_back(double(w_sentinel[i]) + ref.grad_w[i]);
      grad_w_scale.push_back(std::fabs(double(w_sentinel[i])) + abs.grad_w[i]);
    }
  }
  ConvOutputs run(cpu::Conv2dAlgorithm algorithm) const {
    return run_cpu(k, xv, wv, bv, gv, sentinel, w_sentinel, algorithm);
  }
};

// On every ISA this CPU has: the transforms' portable, AVX2 and AVX-512 code each
// write V into the panels of their own GEMM's B.
TEST(Conv2dWinograd, MatchesReferenceWithinTheTermMagnitudes) {
  const RestoreGemmIsa restore;
  unsigned seed = 900;
  for (const ConvCase& k : winograd_cases()) {
    SCOPED_TRACE(k.name);
    const WinogradCase c(k, seed += 10);
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
  const WinogradCase c({"fashion2", 2, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 990);
  WinogradCase wrong_x = c, wrong_g = c;
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
  for (const WinogradCase& c :
       {WinogradCase({"fashion2_b3", 3, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 997),
        WinogradCase({"odd_wide", 2, 16, 9, 37, 17, 3, 3, make_params(1, 1, 0, 1)}, 998),
        // Padding 0 across: backward-data's correlation pads 2 columns, masked off
        // from the AVX-512 input transform's loads.
        WinogradCase({"pad_w0", 2, 24, 10, 19, 20, 3, 3, make_params(1, 1, 1, 0)}, 999)}) {
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
  const WinogradCase c({"fashion2_b37", 37, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 995);
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
  const WinogradCase conv2({"fashion2", 1, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 1001);
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
    const WinogradCase c(k, 1002);
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
  const WinogradCase c({"fashion2_b7", 7, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 1003);
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

// --- stride 2 across --------------------------------------------------------------
//
// With stride_w == 2 on AVX2 and AVX-512, col2im adds eight outputs a vector to the
// even lanes of a copy of the plane (its bits: Conv2dCol2im above) and the weight
// gradient of 3x3 layers with K a multiple of 32 is the implicit GEMM (its bits:
// Conv2dImplicitWeightGrad above). The forward of a stride-2 layer sums the same
// terms in the same order as the stride-1 layer's at the outputs (s*p, 2*q) (s the
// stride down; the GEMM's sums do not depend on the column), so the two must agree
// bit for bit wherever the strided im2col puts every patch element where the
// stride-1 one does; and all three passes meet the reference within a few roundings
// of their terms' magnitudes, grad_x added onto a sentinel and assigned (onto NaNs,
// the bits of adding onto zeros), on every ISA. The shapes: ResNet-20's
// downsampling layers on Fashion-MNIST (Q = 14 and 7: a group of eight and a last
// partial one, or one partial group; K = 32 and 64) and their 1x1 projections, Q =
// 22 and 8, a row of one output, padding 2 and 0, dilation, stride 3 down, stride 2
// across only.
std::vector<ConvCase> stride2_cases() {
  return {
      {"resnet_16to32", 2, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)},
      {"resnet_32to64", 2, 32, 14, 14, 64, 3, 3, make_params(2, 2, 1, 1), false},
      {"resnet_1x1_16to32", 2, 16, 28, 28, 32, 1, 1, make_params(2, 2, 0, 0), false},
      {"W41_pad2", 1, 3, 9, 41, 5, 3, 3, make_params(2, 2, 2, 2)},
      {"Q8_odd_H", 3, 2, 7, 16, 3, 3, 3, make_params(2, 2, 1, 1)},
      {"W1", 2, 2, 5, 1, 3, 3, 3, make_params(2, 2, 1, 1)},
      {"1x1_pad1", 2, 3, 6, 5, 4, 1, 1, make_params(2, 2, 1, 1)},
      {"stride3x2_dilation2", 2, 3, 13, 17, 4, 3, 3, make_params(3, 2, 1, 2, 2, 2)},
      {"stride1x2_3x5", 2, 2, 9, 7, 3, 3, 5, make_params(1, 2, 0, 2)},
  };
}

// im2col + GEMM rounds each result a few times over its terms' magnitudes (under
// 4 u in the Winograd cases above): "a few float32 roundings" (kernels/conv2d.h).
constexpr double kIm2colTolerance = 8.0 / (1 << 24);

// The flat indices (image 0, channel 0) of an input pixel and of an output that
// reads it: the controls' values 1% off.
struct ReadPixel {
  std::size_t x, y;
};
ReadPixel read_pixel(const ConvCase& k) {
  const Conv2dParams& p = k.params;
  const Shape ys = k.y_shape();
  for (std::int64_t op = 0; op < ys[2]; ++op) {
    for (std::int64_t oq = 0; oq < ys[3]; ++oq) {
      for (std::int64_t r = 0; r < k.R; ++r) {
        for (std::int64_t t = 0; t < k.S; ++t) {
          const std::int64_t h = op * p.stride_h - p.pad_h + r * p.dilation_h;
          const std::int64_t w = oq * p.stride_w - p.pad_w + t * p.dilation_w;
          if (h >= 0 && h < k.H && w >= 0 && w < k.W) {
            return {std::size_t(h * k.W + w), std::size_t(op * ys[3] + oq)};
          }
        }
      }
    }
  }
  ADD_FAILURE() << k.name << ": no output reads an input pixel";
  return {0, 0};
}

TEST(Conv2dStride2, ForwardIsTheStride1ForwardSubsampled) {
  unsigned seed = 1400;
  for (const ConvCase& k : stride2_cases()) {
    SCOPED_TRACE(k.name);
    ConvCase dense = k;
    dense.params.stride_h = dense.params.stride_w = 1;
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), ++seed);
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), ++seed);
    const auto bv = random_values(std::size_t(k.K), ++seed);
    auto forward = [&](const ConvCase& c, const std::vector<float>& x) {
      // im2col at stride 1 too (Auto would take Winograd for 16 channels or more).
      const cpu::ScopedConv2dAlgorithm im2col(cpu::Conv2dAlgorithm::Im2col);
      Tensor y = Tensor::empty(c.y_shape(), cpu());
      conv2d_forward(y, Tensor::from_host<float>(x, c.x_shape(), cpu()),
                     Tensor::from_host<float>(wv, c.w_shape(), cpu()),
                     c.bias ? Tensor::from_host<float>(bv, {c.K}, cpu()) : Tensor(), c.params,
                     cpu());
      return y.to_host<float>(cpu());
    };
    // y's outputs (s*p, 2*q) of the stride-1 layer, in y's order.
    auto subsampled = [&](const std::vector<float>& full) {
      const Shape ys = k.y_shape(), fs = dense.y_shape();
      std::vector<float> out;
      for (std::int64_t nk = 0; nk < ys[0] * ys[1]; ++nk) {
        for (std::int64_t p = 0; p < ys[2]; ++p) {
          for (std::int64_t q = 0; q < ys[3]; ++q) {
            const std::int64_t h = p * k.params.stride_h, w = q * k.params.stride_w;
            out.push_back(full[std::size_t((nk * fs[2] + h) * fs[3] + w)]);
          }
        }
      }
      return out;
    };
    for_each_cpu_isa(Device::cpu(), [&](const std::string& where) {
      SCOPED_TRACE(where);
      const std::vector<float> want = subsampled(forward(dense, xv));
      EXPECT_EQ(bits(forward(k, xv)), bits(want));
      // Control: one input value that an output reads 1% off changes bits the
      // comparison sees.
      std::vector<float> nudged = xv;
      nudged[read_pixel(k).x] *= 1.01f;
      EXPECT_NE(bits(forward(k, nudged)), bits(want)) << "control";
    });
  }
}

TEST(Conv2dStride2, MatchesReferenceWithinTheTermMagnitudes) {
  unsigned seed = 1500;
  for (const ConvCase& k : stride2_cases()) {
    SCOPED_TRACE(k.name);
    const WinogradCase c(k, seed += 10);
    WinogradCase wrong_x = c, wrong_g = c;  // the controls: one value 1% off
    wrong_x.xv[read_pixel(k).x] *= 1.01f;
    wrong_g.gv[read_pixel(k).y] *= 1.01f;
    for_each_cpu_isa(Device::cpu(), [&](const std::string& where) {
      SCOPED_TRACE(where);
      const ConvOutputs got = c.run(cpu::Conv2dAlgorithm::Auto);
      EXPECT_LE(worst_error(got.y, c.y, c.y_scale), kIm2colTolerance) << "y";
      EXPECT_LE(worst_error(got.grad_x, c.grad_x, c.grad_x_scale), kIm2colTolerance) << "grad_x";
      EXPECT_LE(worst_error(got.grad_w, c.grad_w, c.grad_w_scale), kIm2colTolerance)
          << "grad_weight";
      const ConvOutputs off_x = wrong_x.run(cpu::Conv2dAlgorithm::Auto);
      const ConvOutputs off_g = wrong_g.run(cpu::Conv2dAlgorithm::Auto);
      EXPECT_GT(worst_error(off_x.y, c.y, c.y_scale), kIm2colTolerance) << "control: y";
      EXPECT_GT(worst_error(off_g.grad_x, c.grad_x, c.grad_x_scale), kIm2colTolerance)
          << "control: grad_x";
      EXPECT_GT(worst_error(off_x.grad_w, c.grad_w, c.grad_w_scale), kIm2colTolerance)
          << "control: grad_weight";

      // grad_x assigned onto NaNs: the bits of adding onto zeros, every pixel written
      // (stride 2 with a 1x1 kernel leaves three in four that no tap reaches: zeros).
      auto put = [](const std::vector<float>& v, const Shape& shape) {
        return Tensor::from_host<float>(v, shape, cpu());
      };
      const auto n = std::size_t(numel_of(k.x_shape()));
      Tensor onto_zeros = put(std::vector<float>(n, 0.0f), k.x_shape());
      Tensor assigned = put(std::vector<float>(n, std::nanf("")), k.x_shape());
      for (auto [grad_x, write] : {std::pair{&onto_zeros, GradWrite::Accumulate},
                                   std::pair{&assigned, GradWrite::Assign}}) {
        conv2d_backward(*grad_x, Tensor(), Tensor(), put(c.gv, k.y_shape()), put(c.xv, k.x_shape()),
                        put(c.wv, k.w_shape()), k.params, cpu(), write);
      }
      EXPECT_EQ(bits(assigned.to_host<float>(cpu())), bits(onto_zeros.to_host<float>(cpu())))
          << "assigned grad_x";
    });
  }
}

// The implicit forward (AVX2) gives the bits of im2col (plain loops) + the GEMM: with
// and without a bias, one block of the GEMM's inner dimension (C*9 = 144) and several
// (576, 40 channels), a last group of fewer than six pixels, stride 2 both ways, one
// way, and 1 (as im2col forced at stride 1 would run it). Control: one input value
// 0.1% off changes bits the comparison sees.
TEST(Conv2dImplicitForward, GivesTheGemmBits) {
  const RestoreGemmIsa restore;
  if (!gemm_isa_supported(GemmIsa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  set_gemm_isa(GemmIsa::Avx2);
  for (const ConvCase& k :
       {ConvCase{"stride2_28x28_C16_K32", 1, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)},
        ConvCase{"stride2_14x14_C32_K64", 1, 32, 14, 14, 64, 3, 3, make_params(2, 2, 1, 1)},
        ConvCase{"stride2_C64_K32_blocks", 1, 64, 9, 9, 32, 3, 3, make_params(2, 2, 1, 1)},
        ConvCase{"stride2_pad0_9x13_K32", 1, 3, 9, 13, 32, 3, 3, make_params(2, 2, 0, 0)},
        ConvCase{"stride2x1_K32", 1, 2, 9, 8, 32, 3, 3, make_params(2, 1, 1, 0)},
        ConvCase{"stride1x2_K32", 1, 2, 8, 9, 32, 3, 3, make_params(1, 2, 0, 1)},
        ConvCase{"stride1_K64", 1, 5, 7, 6, 64, 3, 3, make_params(1, 1, 1, 1)}}) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const Conv2dShape s{1, k.C, k.H, k.W, k.K, 3, 3, ys[2], ys[3], k.params};
    ASSERT_TRUE(cpu::implicit_forward_applies(s));
    const std::int64_t crs = s.C * 9, pq = s.P * s.Q;
    const auto x = random_values(std::size_t(numel_of(k.x_shape())), 1601);
    const auto w = random_values(std::size_t(s.K * crs), 1602);
    const auto bias = random_values(std::size_t(s.K), 1603);
    std::vector<float> panels(std::size_t(cpu::implicit_forward_panels(s)));
    std::vector<float> scratch(std::size_t(cpu::implicit_forward_scratch(s)));
    cpu::implicit_forward_pack(w.data(), panels.data(), s);
    const std::vector<float> col = patch_matrix(x, s);
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(with_bias ? "bias" : "no bias");
      // The im2col path's GEMM: y filled with the bias, beta 1 (or beta 0 without).
      std::vector<float> want(std::size_t(s.K * pq), 0.0f);
      if (with_bias) {
        for (std::int64_t o = 0; o < s.K; ++o) {
          std::fill(want.begin() + o * pq, want.begin() + (o + 1) * pq, bias[std::size_t(o)]);
        }
      }
      cpu::gemm<float>(false, false, s.K, pq, crs, 1.0f, w.data(), crs, col.data(), pq,
                       with_bias ? 1.0f : 0.0f, want.data(), pq);
      std::vector<float> got(want.size(), std::nanf(""));
      cpu::implicit_forward(x.data(), panels.data(), with_bias ? bias.data() : nullptr, got.data(),
                            scratch.data(), s);
      EXPECT_EQ(bits(got), bits(want));
      std::vector<float> nudged = x, off(want.size());
      nudged[std::size_t(read_pixel(k).x)] *= 1.001f;
      cpu::implicit_forward(nudged.data(), panels.data(), with_bias ? bias.data() : nullptr,
                            off.data(), scratch.data(), s);
      EXPECT_NE(bits(off), bits(want)) << "control";
    }
  }
}

}  // namespace
}  // namespace towerlab::testing
