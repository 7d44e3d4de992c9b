// conv2d's bfloat16 GEMM path on the CPU (kernels/cpu/conv2d_bf16.cpp, chosen where the
// bfloat16 GEMM runs vdpbf16ps): bfloat16 patches lowered by im2col and multiplied by
// the vdpbf16ps GEMM, the products exact and summed in float32, for the forward, the
// input gradient and the weight gradient, each held to the bound of
// tests/conv2d_bf16_fixture.h. The tests select the vdpbf16ps kernel themselves
// (set_bf16_gemm_kernel), so they run on every CPU with avx512_bf16, whichever kernel
// Auto takes there; elsewhere they skip.
//
// Im2col is forced so that every layer takes the lowering whatever Auto's rule
// (kernels/cpu/conv2d.h; WhichLayersTakeThePath checks it; the padded planes Auto
// takes at stride 1 are tests/conv2d_planes_bf16_test.cpp's). Cases: FashionNet's
// conv2 and ResNet-20's layers (a 16-channel 3x3, the stride-2 3x3, the 1x1 stride-2
// shortcut, a 1x1 stride-1 layer that needs no lowering) and odd shapes (unequal
// strides, padding and dilation, a 3x2 kernel, an odd C*R*S, a K that fills no tile),
// and runs of several images lowered into one forward product (37 and 38 images of
// 7x7 outputs, one and two threads). Controls: the reference on the unrounded
// operands and the expected values without the sentinels lie outside the bound, and
// the widening path gives other bits (so the checks see which ran).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "conv2d_bf16_fixture.h"
#include "conv2d_case.h"
#include "engine/settings.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

using Conv2dBf16Cpu = Conv2dBf16Fixture<Conv2dAlgorithm::Im2col>;

TEST_F(Conv2dBf16Cpu, FashionNetAndResNet20Layers) {
  const std::vector<ConvCase> cases = {
      {"fashion_conv2", 3, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
      {"resnet_16", 2, 16, 10, 10, 16, 3, 3, make_params(1, 1, 1, 1)},
      {"resnet_down_16_32", 2, 16, 9, 9, 32, 3, 3, make_params(2, 2, 1, 1)},
      {"resnet_shortcut_32_64", 2, 32, 7, 7, 64, 1, 1, make_params(2, 2, 0, 0)},
      {"pointwise_64_48", 2, 64, 5, 6, 48, 1, 1, make_params(1, 1, 0, 0)},
  };
  unsigned seed = 10;
  bool assign = true;
  for (const ConvCase& k : cases) {
    check(k, seed += 10, assign ? GradWrite::Assign : GradWrite::Accumulate);
    assign = !assign;
  }
}

TEST_F(Conv2dBf16Cpu, OddShapesStridesAndDilation) {
  check({"odd", 3, 5, 7, 9, 6, 3, 2, make_params(2, 1, 1, 0, 1, 2)}, 200, GradWrite::Assign);
  check({"stride3_5x5", 2, 7, 13, 11, 37, 5, 5, make_params(3, 3, 2, 1)}, 210,
        GradWrite::Accumulate);
  ConvCase no_bias{"no_bias_odd_crs", 17, 3, 6, 5, 13, 3, 3, make_params(1, 1, 1, 1)};
  no_bias.bias = false;
  check(no_bias, 220, GradWrite::Assign);
}

// Layers with few output pixels lower several images into one forward product (as
// many as fill 512 columns, eleven at 7x7); 37 and 38 images leave shorter last runs,
// with one and two threads (whose chunks of images end the runs elsewhere). The
// input gradient of a stride-1 layer with no more channels out than in is such a
// forward product too, on grad_y (the next test): its runs assigned and
// added.
TEST_F(Conv2dBf16Cpu, SeveralImagesInOneProduct) {
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    SCOPED_TRACE(std::to_string(threads) + " threads");
    check({"runs_7x7", 37, 16, 7, 7, 24, 3, 3, make_params(1, 1, 1, 1)}, 500,
          GradWrite::Accumulate);
    check({"runs_stride2", 38, 8, 14, 13, 16, 3, 3, make_params(2, 2, 1, 1)}, 510,
          GradWrite::Assign);
    for (GradWrite write : {GradWrite::Assign, GradWrite::Accumulate}) {
      check({"transposed_runs_7x7", 37, 24, 7, 7, 16, 3, 3, make_params(1, 1, 1, 1)}, 520, write);
    }
  }
  set_num_threads(saved);
}

// The input gradient as a forward convolution of grad_y (stride 1, K <= C: the
// weight flipped and transposed, grad_y padded by dilation*(R-1) - pad): padding
// below, at and (none: the other path) above dilation*(R-1), unequal dilations and
// kernel sides, and an output of at least 512 pixels, one image a product, added in
// place by the GEMM; each assigned and added.
TEST_F(Conv2dBf16Cpu, TheInputGradientOfAStrideOneLayerAsAConvolution) {
  const std::vector<ConvCase> cases = {
      {"transposed_dilated_valid", 3, 9, 13, 12, 7, 3, 2, make_params(1, 1, 0, 1, 2, 1)},
      {"transposed_5x5_pad1", 2, 12, 11, 9, 12, 5, 5, make_params(1, 1, 1, 1)},
      {"transposed_wide_24x24", 2, 16, 24, 24, 12, 3, 3, make_params(1, 1, 1, 1)},
      {"padding_beyond_the_taps", 2, 8, 6, 7, 8, 1, 3, make_params(1, 1, 1, 2)},
  };
  unsigned seed = 600;
  for (const ConvCase& k : cases) {
    for (GradWrite write : {GradWrite::Assign, GradWrite::Accumulate}) check(k, seed += 10, write);
  }
}

// The checks can fail: the reference on the unrounded operands, and the expected
// values without the sentinels, lie outside the bound; the widening path (the
// float32 algorithms on the same values) gives other bits.
TEST_F(Conv2dBf16Cpu, ControlsUnroundedOperandsSentinelsAndTheWideningPath) {
  const ConvCase k{"resnet_16", 2, 16, 6, 6, 16, 3, 3, make_params(1, 1, 1, 1)};
  const ConvOperands v = operands(k, 300);
  const ConvResults got = run(k, v, GradWrite::Accumulate);
  const Reference unrounded = reference(k, widen(v.x), widen(v.w), widen(v.b), widen(v.g));
  const Reference scale =
      reference(k, magnitudes(v.x), magnitudes(v.w), magnitudes(v.b), magnitudes(v.g));
  const ConvLengths n = lengths(k);
  EXPECT_FALSE(within_bound(got.y, unrounded.y, scale.y, n.forward, 0.0)) << "y";
  EXPECT_FALSE(within_bound(got.grad_x, unrounded.grad_x, scale.grad_x, n.data, kDataSentinel))
      << "grad_x";
  EXPECT_FALSE(within_bound(got.grad_w, unrounded.grad_w, scale.grad_w, n.weight, kWeightSentinel))
      << "grad_w";
  const Reference want = reference(k, widen(rounded_bf16(v.x)), widen(rounded_bf16(v.w)),
                                   widen(v.b), widen(rounded_bf16(v.g)));
  EXPECT_FALSE(within_bound(got.grad_x, want.grad_x, scale.grad_x, n.data, 0.0))
      << "grad_x: the sentinel was not added";
  EXPECT_FALSE(within_bound(got.grad_w, want.grad_w, scale.grad_w, n.weight, 0.0))
      << "grad_w: the sentinel was not added";

  set_bf16_gemm_kernel(Bf16GemmKernel::Widen);
  ASSERT_FALSE(
      conv2d_multiplies_16bit(k.x_shape(), k.w_shape(), DType::BFloat16, k.params, stream_));
  const ConvResults widened = run(k, v, GradWrite::Accumulate);
  EXPECT_NE(widened.y, got.y) << "the same bits as the widening path: which one ran?";
  EXPECT_NE(widened.grad_x, got.grad_x);
  EXPECT_NE(widened.grad_w, got.grad_w);
}

// The same bits whatever the threads: each image's products, and the weight
// gradient's fixed groups of images, do not depend on who runs them.
TEST_F(Conv2dBf16Cpu, SameBitsForAnyThreadCount) {
  expect_same_bits_for_any_thread_count(
      {"fashion_conv2", 20, 32, 7, 7, 64, 3, 3, make_params(1, 1, 1, 1)}, 400);
}

// Which layers take the path: bfloat16 with one group, every one of them under Auto
// and a forced Im2col (the 3x3 layers Winograd takes in float32, the stride-2 ones of
// the implicit weight gradient and a single-channel first layer included), none
// under a forced Winograd; float16 always widens.
TEST_F(Conv2dBf16Cpu, WhichLayersTakeThePath) {
  const Conv2dParams pad1 = make_params(1, 1, 1, 1), one = make_params(1, 1, 0, 0);
  const Shape x{2, 32, 8, 8}, w{64, 32, 3, 3}, w1x1{64, 32, 1, 1};
  const Shape first_x{2, 1, 28, 28}, first_w{32, 1, 3, 3};
  EXPECT_TRUE(conv2d_multiplies_16bit(x, w, DType::BFloat16, pad1, stream_)) << "forced Im2col";
  EXPECT_TRUE(conv2d_multiplies_16bit(first_x, first_w, DType::BFloat16, pad1, stream_));
  EXPECT_FALSE(conv2d_multiplies_16bit(x, w, DType::Float16, pad1, stream_));
  EXPECT_FALSE(conv2d_multiplies_16bit(x, w, DType::Float32, pad1, stream_));
  EXPECT_FALSE(conv2d_multiplies_16bit(x, {64, 16, 3, 3}, DType::BFloat16,
                                       make_params(1, 1, 1, 1, 1, 1, 2), stream_))
      << "groups";
  {
    cpu::ScopedConv2dAlgorithm automatic(Conv2dAlgorithm::Auto);
    EXPECT_TRUE(conv2d_multiplies_16bit(x, w1x1, DType::BFloat16, one, stream_)) << "1x1";
    EXPECT_TRUE(conv2d_multiplies_16bit(x, w1x1, DType::BFloat16, make_params(2, 2, 0, 0), stream_))
        << "1x1, stride 2";
    EXPECT_TRUE(conv2d_multiplies_16bit(x, w, DType::BFloat16, pad1, stream_))
        << "a 3x3 layer Winograd takes in float32";
    EXPECT_TRUE(conv2d_multiplies_16bit(x, w, DType::BFloat16, make_params(2, 2, 1, 1), stream_))
        << "3x3 stride 2 (the implicit weight gradient in float32)";
    EXPECT_TRUE(conv2d_multiplies_16bit(first_x, first_w, DType::BFloat16, pad1, stream_))
        << "a single-channel first layer (the direct kernels in float32)";
    EXPECT_FALSE(conv2d_multiplies_16bit(x, {64, 16, 3, 3}, DType::BFloat16,
                                         make_params(1, 1, 1, 1, 1, 1, 2), stream_))
        << "groups";
  }
  {
    cpu::ScopedConv2dAlgorithm winograd(Conv2dAlgorithm::Winograd);
    EXPECT_FALSE(conv2d_multiplies_16bit(x, w1x1, DType::BFloat16, one, stream_));
    EXPECT_FALSE(conv2d_multiplies_16bit(x, w, DType::BFloat16, pad1, stream_));
  }
  set_bf16_gemm_kernel(Bf16GemmKernel::Widen);
  EXPECT_FALSE(conv2d_multiplies_16bit(x, w, DType::BFloat16, pad1, stream_));
}

}  // namespace
}  // namespace towerlab::testing
