// bf16_planes_weight_grad (kernels/cpu/conv2d_planes_bf16.h): the weight gradient of a
// conv2d of stride 1 or 2 on bfloat16 operands over the images [first, last), from
// padded planes (split into phases at a stride of 2) on vdpbf16ps, ASSIGNED into a
// float32 partial. Each result is held to the bound kernels/conv2d.h states for exact
// products summed in float32,
//   |got - want| <= 2 (n + 2) 2^-24 (sum of |terms|),   n = (last - first) P Q,
// around the plain reference in double on the bfloat16 values of those images alone
// (tests/conv2d_gemm_bound.h). The partial starts as NaN, so an element the function
// does not write fails. On a CPU without avx512_bf16 the function is never called
// (bf16_planes_apply) and the tests skip.
//
// Cases: ResNet-20's three 3x3 layers and FashionNet's conv2; odd shapes (one and three
// channels, K = 1 and 5, tap counts that fill no tile, a 3x2 and a 1x1 kernel, no
// padding, padding of 2 and beyond the taps, dilation, rows wider than a vector, a
// one-pixel-wide image); at a stride of 2 ResNet-20's downsampling layer, odd and even
// image sizes and paddings (phases of unequal sizes), rows wider than a vector, a 5x5
// kernel, dilation, and a stride down or across only; sub-ranges of the images; long
// sums (a batch of 64 images, a call too large for one block of the scratch, a batch
// of the downsampling layer) on integer operands, whose sums are
// exact in any order and must equal the reference's. Bits: the same call twice, and
// the same images at other indices, give the same bits. Controls: the reference on
// the unrounded operands, and on a range off by one image, lie outside the bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "conv2d_case.h"
#include "conv2d_cpu_case.h"
#include "conv2d_gemm_bound.h"
#include "engine/half.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/conv2d_planes_bf16.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/reference/conv2d.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// A case's operands for all N images: x [N, C, H, W] and grad_y [N, K, P, Q] as
// uniform float32 values (seeds seed and seed + 1) and rounded to bfloat16.
struct Operands {
  std::vector<float> x, g;  // unrounded
  std::vector<bfloat16> x16, g16;
};

Operands operands_of(const ConvCase& k, unsigned seed) {
  Operands v;
  v.x = random_values(std::size_t(numel_of(k.x_shape())), seed);
  v.g = random_values(std::size_t(numel_of(k.y_shape())), seed + 1);
  v.x16 = narrow<bfloat16>(v.x);
  v.g16 = narrow<bfloat16>(v.g);
  return v;
}

// The function under test: partial [K, C*R*S] over NaN, images [first, last) of x and
// g (each pointing at its image 0).
std::vector<float> planes_weight_grad(const ConvCase& k, const bfloat16* x, const bfloat16* g,
                                      std::int64_t first, std::int64_t last) {
  std::vector<float> partial(std::size_t(numel_of(k.w_shape())),
                             std::numeric_limits<float>::quiet_NaN());
  cpu::bf16_planes_weight_grad(partial.data(), x, g, first, last, shape_of(k));
  return partial;
}

// The reference's weight gradient of images [first, last) alone, from x and g of all
// N images (as doubles).
std::vector<double> reference_weight_grad(const ConvCase& k, const std::vector<double>& x,
                                          const std::vector<double>& g, std::int64_t first,
                                          std::int64_t last) {
  ConvCase part = k;
  part.N = last - first;
  const std::int64_t x_image = k.C * k.H * k.W, g_image = numel_of(k.y_shape()) / k.N;
  std::vector<double> grad_w(std::size_t(numel_of(k.w_shape())), 0.0);
  reference::conv2d_backward(nullptr, grad_w.data(), nullptr, g.data() + first * g_image,
                             x.data() + first * x_image, nullptr, part.x_shape(), part.w_shape(),
                             part.params);
  return grad_w;
}

class Conv2dPlanesBf16WeightGrad : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::cpu_has_avx512_bf16()) {
      GTEST_SKIP() << "this CPU does not report avx512_bf16: the planes path never runs here";
    }
  }

  // Images [first, last) of a case against the reference on the bfloat16 values.
  void check(const ConvCase& k, unsigned seed, std::int64_t first, std::int64_t last) {
    SCOPED_TRACE(k.name + ", images " + std::to_string(first) + " to " + std::to_string(last));
    const Operands v = operands_of(k, seed);
    const std::vector<float> got = planes_weight_grad(k, v.x16.data(), v.g16.data(), first, last);
    const std::vector<double> x = widen(widen(v.x16)), g = widen(widen(v.g16));
    const std::vector<double> want = reference_weight_grad(k, x, g, first, last);
    const std::vector<double> scale =
        reference_weight_grad(k, magnitudes(widen(v.x16)), magnitudes(widen(v.g16)), first, last);
    const Shape y = k.y_shape();
    EXPECT_TRUE(within_bound(got, want, scale, (last - first) * y[2] * y[3], 0.0));
  }
  void check(const ConvCase& k, unsigned seed) { check(k, seed, 0, k.N); }

  // The bound grows as n^2 and passes anything of the right size once n is some
  // thousands of pixels; these operands keep a long sum sharp. Integers -3 .. 3 (exact
  // in bfloat16, and so are their products and every partial sum, below 2^24): the
  // float32 sums are exact in any order, and the result must be the reference's.
  void check_exact(const ConvCase& k, unsigned seed) {
    SCOPED_TRACE(k.name + ", integer operands");
    const Operands v = operands_of(k, seed);
    const auto integers = [](std::vector<float> u) {
      for (float& e : u) e = std::round(3.0f * e);
      return u;
    };
    const std::vector<float> x = integers(v.x), g = integers(v.g);
    const std::vector<float> got =
        planes_weight_grad(k, narrow<bfloat16>(x).data(), narrow<bfloat16>(g).data(), 0, k.N);
    EXPECT_EQ(got, narrow(reference_weight_grad(k, widen(x), widen(g), 0, k.N)));
  }
};

const Conv2dParams kPad1 = make_params(1, 1, 1, 1);

TEST_F(Conv2dPlanesBf16WeightGrad, ResNet20Layers) {
  check({"resnet_16_28x28", 2, 16, 28, 28, 16, 3, 3, kPad1}, 10);
  check({"resnet_32_14x14", 3, 32, 14, 14, 32, 3, 3, kPad1}, 20);
  check({"resnet_64_7x7", 4, 64, 7, 7, 64, 3, 3, kPad1}, 30);
}

TEST_F(Conv2dPlanesBf16WeightGrad, FashionNetConv2) {
  check({"fashion_conv2", 3, 32, 14, 14, 64, 3, 3, kPad1}, 40);
}

// Tiles cut short in both directions (K = 1, 2, 3, 5, 6, 7 against four filters a
// tile; 1, 4, 9, 29 and 50 taps against six), and grids and planes laid out unlike
// the layers': no padding or more than the taps need, dilated taps, a row wider than
// one vector, a row one pixel wide.
TEST_F(Conv2dPlanesBf16WeightGrad, OddShapes) {
  const std::vector<ConvCase> cases = {
      {"one_channel_K5", 2, 1, 9, 11, 5, 3, 3, kPad1},
      {"three_channels_K1", 2, 3, 8, 6, 1, 3, 3, kPad1},
      {"kernel_3x2", 2, 5, 7, 9, 6, 3, 2, make_params(1, 1, 1, 0)},
      {"no_padding", 2, 4, 10, 10, 7, 3, 3, make_params(1, 1, 0, 0)},
      {"pad2_5x5", 2, 2, 9, 8, 5, 5, 5, make_params(1, 1, 2, 2)},
      {"padding_beyond_the_taps", 2, 3, 6, 7, 4, 3, 3, make_params(1, 1, 3, 2)},
      {"dilation_2", 2, 6, 11, 10, 9, 3, 3, make_params(1, 1, 2, 2, 2, 2)},
      {"unequal_dilation", 2, 5, 9, 12, 6, 3, 2, make_params(1, 1, 1, 2, 2, 3)},
      {"pointwise_1x1", 3, 29, 5, 6, 10, 1, 1, make_params(1, 1, 0, 0)},
      {"pointwise_four_channels", 2, 4, 6, 5, 7, 1, 1, make_params(1, 1, 0, 0)},
      {"a_single_tap", 2, 1, 5, 7, 3, 1, 1, make_params(1, 1, 0, 0)},
      {"rows_wider_than_a_vector", 1, 2, 4, 45, 3, 3, 3, kPad1},
      {"one_pixel_wide", 2, 3, 9, 1, 2, 3, 1, make_params(1, 1, 1, 0)},
  };
  unsigned seed = 100;
  for (const ConvCase& k : cases) check(k, seed += 10);
}

// Stride 2: the planes split into four phases (two down or across only), each tap
// reading its own; odd sizes and paddings leave the phases of unequal sizes, and a
// row of 45 or 70 values splits over more than one load.
TEST_F(Conv2dPlanesBf16WeightGrad, StrideTwo) {
  const std::vector<ConvCase> cases = {
      {"resnet_16to32_s2", 2, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)},
      {"odd_image", 2, 9, 27, 25, 10, 3, 3, make_params(2, 2, 1, 1)},
      {"no_padding", 2, 8, 11, 13, 8, 3, 3, make_params(2, 2, 0, 0)},
      {"rows_of_70", 1, 3, 6, 70, 5, 3, 3, make_params(2, 2, 1, 1)},
      {"rows_of_45_odd_pad", 2, 4, 7, 45, 6, 3, 3, make_params(2, 2, 1, 2)},
      {"kernel_5x5_pad2", 2, 6, 15, 16, 9, 5, 5, make_params(2, 2, 2, 2)},
      {"dilated", 2, 5, 14, 13, 7, 3, 3, make_params(2, 2, 2, 2, 2, 2)},
      {"down_only", 2, 8, 12, 10, 8, 3, 3, make_params(2, 1, 1, 1)},
      {"across_only", 2, 8, 10, 12, 8, 3, 3, make_params(1, 2, 1, 1)},
  };
  unsigned seed = 150;
  for (const ConvCase& k : cases) check(k, seed += 10);
  check_exact({"resnet_16to32_s2_batch_64", 64, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)},
              320);
}

// The caller hands each thread a group of images: any [first, last) of the N.
TEST_F(Conv2dPlanesBf16WeightGrad, ASubRangeOfTheImages) {
  const ConvCase k{"resnet_16_10x10", 7, 16, 10, 10, 16, 3, 3, kPad1};
  check(k, 200, 2, 5);
  check(k, 200, 6, 7);
  check(k, 200, 0, 7);
}

// A whole batch of ResNet-20's first stage, and more images than one block of the
// scratch holds (the kernel's kBlockBytes): the lane sums of the first block are
// stored and resumed by the next. Exact, as n is large.
TEST_F(Conv2dPlanesBf16WeightGrad, LongSumsExactly) {
  check_exact({"resnet_16_batch_64", 64, 16, 28, 28, 16, 3, 3, kPad1}, 300);
  check_exact({"two_blocks_96x96", 19, 6, 96, 96, 6, 3, 3, kPad1}, 310);
}

// Nothing to sum: zeros, written over the NaN.
TEST_F(Conv2dPlanesBf16WeightGrad, AnEmptyRangeIsZero) {
  const ConvCase k{"empty", 2, 3, 5, 5, 4, 3, 3, kPad1};
  const Operands v = operands_of(k, 400);
  EXPECT_EQ(planes_weight_grad(k, v.x16.data(), v.g16.data(), 1, 1),
            std::vector<float>(std::size_t(numel_of(k.w_shape())), 0.0f));
}

// The bits are a function of the images in the range and the shape: the same call
// twice, and the same images at other indices of other arrays, agree bit for bit.
TEST_F(Conv2dPlanesBf16WeightGrad, SameBitsForTheSameImages) {
  const ConvCase k{"fashion_conv2_7x7", 6, 32, 7, 7, 64, 3, 3, kPad1};
  const Operands v = operands_of(k, 500);
  const std::vector<float> once = planes_weight_grad(k, v.x16.data(), v.g16.data(), 2, 5);
  EXPECT_EQ(bits(once), bits(planes_weight_grad(k, v.x16.data(), v.g16.data(), 2, 5)));
  const std::int64_t x_image = k.C * k.H * k.W, g_image = numel_of(k.y_shape()) / k.N;
  const std::vector<bfloat16> x_moved(v.x16.begin() + 2 * x_image, v.x16.end());
  const std::vector<bfloat16> g_moved(v.g16.begin() + 2 * g_image, v.g16.end());
  EXPECT_EQ(bits(once), bits(planes_weight_grad(k, x_moved.data(), g_moved.data(), 0, 3)));
}

// The checks can fail: the reference on the unrounded float32 operands, and the
// reference on a range one image short or one image later, lie outside the bound.
TEST_F(Conv2dPlanesBf16WeightGrad, ControlsUnroundedOperandsAndARangeOffByOne) {
  const ConvCase k{"resnet_16_6x6", 4, 16, 6, 6, 16, 3, 3, kPad1};
  const Operands v = operands_of(k, 600);
  const std::vector<float> got = planes_weight_grad(k, v.x16.data(), v.g16.data(), 1, 3);
  const std::vector<double> x = widen(widen(v.x16)), g = widen(widen(v.g16));
  const std::vector<double> scale =
      reference_weight_grad(k, magnitudes(widen(v.x16)), magnitudes(widen(v.g16)), 1, 3);
  const std::int64_t n = 2 * 6 * 6;
  ASSERT_TRUE(within_bound(got, reference_weight_grad(k, x, g, 1, 3), scale, n, 0.0));
  EXPECT_FALSE(
      within_bound(got, reference_weight_grad(k, widen(v.x), widen(v.g), 1, 3), scale, n, 0.0))
      << "the unrounded operands";
  EXPECT_FALSE(within_bound(got, reference_weight_grad(k, x, g, 1, 2), scale, n, 0.0))
      << "one image short";
  EXPECT_FALSE(within_bound(got, reference_weight_grad(k, x, g, 2, 4), scale, n, 0.0))
      << "one image later";
}

}  // namespace
}  // namespace towerlab::testing
