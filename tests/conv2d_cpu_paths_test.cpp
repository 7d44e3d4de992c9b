// The CPU's own conv2d paths, each checked on every ISA the machine has: the
// direct path for one input channel, col2im's vector path, the implicit weight
// gradient, the backward's image groups (the same bits for any thread count), stride
// 2 (against the stride-1 forward and the reference), the implicit forward and
// bfloat16 im2col's vector path.
// Winograd's own: conv2d_winograd_cpu_test.cpp.
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
#include "kernels/cpu/conv2d_implicit.h"
#include "kernels/cpu/conv2d_lowering.h"
#include "kernels/cpu/matmul.h"
#include "sixteen_bit.h"
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

// --- im2col of bfloat16 flat runs on AVX-512 ------------------------------------------
//
// With unit strides and Q == W, a bfloat16 image's patch matrix is copied 32 values a
// vector under masks that zero the padding (kernels/cpu/conv2d_lowering.cpp). It only
// moves data, so on AVX-512 it must give the bits of a plain loop, as the portable
// build does: planes whose P*Q is and is not a multiple of 32, a plane smaller than a
// tap's reach, dilation, kernels wider than tall and taller than wide, the rows ld
// apart (several images side by side) with the gap between them left as it was, and
// two shapes in turn (the masks worked out again).
TEST(Conv2dIm2col, Bf16VectorPathGivesThePlainLoopsBits) {
  if (!gemm_isa_supported(GemmIsa::Avx512) || !__builtin_cpu_supports("avx512bw")) {
    GTEST_SKIP() << "this CPU has no AVX-512 BW";
  }
  const RestoreGemmIsa restore;
  const bfloat16 gap(7.0f);
  for (const ConvCase& k :
       {ConvCase{"28x28", 1, 3, 28, 28, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"7x7", 1, 4, 7, 7, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"8x8_two_vectors", 1, 2, 8, 8, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"2x2_5x5_kernel", 1, 2, 2, 2, 1, 5, 5, make_params(1, 1, 2, 2)},
        ConvCase{"dilation2", 1, 2, 13, 13, 1, 3, 3, make_params(1, 1, 2, 2, 2, 2)},
        ConvCase{"1x3_kernel", 1, 3, 6, 11, 1, 1, 3, make_params(1, 1, 0, 1)},
        ConvCase{"3x1_kernel", 1, 3, 9, 5, 1, 3, 1, make_params(1, 1, 1, 0)},
        ConvCase{"28x28_again", 1, 2, 28, 28, 1, 3, 3, make_params(1, 1, 1, 1)}}) {
    SCOPED_TRACE(k.name);
    const Conv2dShape s = shape_of(k);
    ASSERT_EQ(s.Q, s.W) << "not a flat-run case";
    const std::int64_t pq = s.P * s.Q, rows = s.C * s.R * s.S, ld = 2 * pq + 5;
    const std::vector<bfloat16> x =
        narrow<bfloat16>(random_values(std::size_t(s.C * s.H * s.W), 1401, 0.5f, 2.0f));
    // The plain loop: col[(c,r,kq), (op,oq)] = x[c, op - pad_h + r dil_h, oq - pad_w + kq dil_w].
    std::vector<bfloat16> want(std::size_t(rows * ld), gap);
    const Conv2dParams& p = s.params;
    for (std::int64_t c = 0; c < s.C; ++c) {
      for (std::int64_t r = 0; r < s.R; ++r) {
        for (std::int64_t kq = 0; kq < s.S; ++kq) {
          for (std::int64_t op = 0; op < s.P; ++op) {
            for (std::int64_t oq = 0; oq < s.Q; ++oq) {
              const std::int64_t h = op - p.pad_h + r * p.dilation_h;
              const std::int64_t w = oq - p.pad_w + kq * p.dilation_w;
              const bool inside = h >= 0 && h < s.H && w >= 0 && w < s.W;
              want[std::size_t(((c * s.R + r) * s.S + kq) * ld + pq + op * s.Q + oq)] =
                  inside ? x[std::size_t((c * s.H + h) * s.W + w)] : bfloat16(0.0f);
            }
          }
        }
      }
    }
    // The image lowered into the second of two slots of each row, as the forward's
    // runs of images place it.
    auto lowered = [&](GemmIsa isa) {
      set_gemm_isa(isa);
      std::vector<bfloat16> col(std::size_t(rows * ld), gap);
      cpu::im2col(col.data() + pq, x.data(), s, ld);
      return col;
    };
    for (GemmIsa isa : {GemmIsa::Avx512, GemmIsa::Portable}) {
      const std::vector<bfloat16> got = lowered(isa);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(bfloat16)), 0)
          << (isa == GemmIsa::Avx512 ? "AVX-512" : "portable");
    }
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
// 4 u in conv2d_winograd_cpu_test.cpp's cases): "a few float32 roundings" (kernels/conv2d.h).
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
    const CpuConvCase c(k, seed += 10);
    CpuConvCase wrong_x = c, wrong_g = c;  // the controls: one value 1% off
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
