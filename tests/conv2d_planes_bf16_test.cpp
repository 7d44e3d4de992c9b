// conv2d's bfloat16 passes from zero-padded planes (kernels/cpu/conv2d_planes_bf16.h),
// which Auto takes at stride 1 where the bfloat16 GEMM runs vdpbf16ps: the forward,
// the input gradient as a forward convolution of grad_y and, with 32 filters or
// fewer, the weight gradient (at a stride of 2 the forward and the weight gradient,
// from the planes' phases), each held to the bound
// of tests/conv2d_bf16_fixture.h around the plain reference in double on the
// bfloat16 values; the bfloat16 y the float32 y rounded once, bit for bit. They skip
// on a CPU without avx512_bf16.
//
// Cases: ResNet-20's 16- and 32-channel layers and FashionNet's conv2 (whose input
// gradient, 64 channels back to 32, the lowering leaves to col2im), rows longer than
// a tile, odd channel counts (a pair's high half zero), filters that fill no block of
// eight, a 3x2 and a 5x5 kernel, dilation down and across, padding below and above
// the taps, images of other heights than widths; at a stride of 2 ResNet-20's
// downsampling layer, odd images, no padding, a 5x5 kernel, dilation, and a stride of
// 2 down or across only; grad_x assigned over NaN and added
// onto a sentinel; one, two and three threads. Controls: the lowering gives other bits
// (so the checks see which ran), one image on two threads lowers, and which layers
// take the planes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "conv2d_bf16_fixture.h"
#include "conv2d_case.h"
#include "conv2d_cpu_case.h"
#include "engine/settings.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/conv2d_planes_bf16.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class Conv2dBf16Planes : public Conv2dBf16Fixture<Conv2dAlgorithm::Auto> {
 protected:
  // The case's forward takes the planes (and so, at stride 1, does its input gradient
  // where transposing applies), then its checks.
  // With fewer images than threads the forward lowers instead (its GEMMs spread over
  // the threads; FewerImagesThanThreadsLower): at most a thread an image here.
  void check_planes(const ConvCase& k, unsigned seed, GradWrite write) {
    ASSERT_TRUE(cpu::bf16_planes_apply(shape_of(k))) << k.name << " does not take the planes";
    const int saved = num_threads();
    set_num_threads(static_cast<int>(std::min<std::int64_t>(saved, k.N)));
    check(k, seed, write);
    set_num_threads(saved);
  }
  // Each case with grad_x assigned, then added, seeds from `seed` on.
  void check_each(const std::vector<ConvCase>& cases, unsigned seed) {
    for (const ConvCase& k : cases) {
      for (GradWrite write : {GradWrite::Assign, GradWrite::Accumulate}) {
        check_planes(k, seed += 10, write);
      }
    }
  }
};

TEST_F(Conv2dBf16Planes, ResNet20AndFashionNetLayers) {
  const std::vector<ConvCase> cases = {
      {"resnet_16_28x28", 2, 16, 28, 28, 16, 3, 3, make_params(1, 1, 1, 1)},
      {"resnet_32_14x14", 3, 32, 14, 14, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion_conv2", 3, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
  };
  check_each(cases, 700);
}

TEST_F(Conv2dBf16Planes, OddShapes) {
  const std::vector<ConvCase> cases = {
      {"rows_longer_than_a_tile", 2, 8, 5, 61, 8, 3, 3, make_params(1, 1, 1, 1)},
      {"odd_channels_odd_filters", 2, 7, 20, 19, 13, 3, 3, make_params(1, 1, 1, 1)},
      {"kernel_3x2_dilated", 2, 11, 16, 15, 9, 3, 2, make_params(1, 1, 2, 1, 2, 1)},
      {"dilated_across", 2, 8, 14, 16, 10, 3, 3, make_params(1, 1, 1, 2, 1, 2)},
      {"kernel_5x5_pad1", 2, 6, 24, 22, 10, 5, 5, make_params(1, 1, 1, 1)},
      {"padding_beyond_the_taps", 2, 8, 12, 10, 9, 3, 3, make_params(1, 1, 3, 2)},
      {"valid_no_padding", 2, 9, 18, 17, 17, 3, 3, make_params(1, 1, 0, 0)},
  };
  check_each(cases, 800);
  ConvCase no_bias{"no_bias", 3, 8, 14, 14, 16, 3, 3, make_params(1, 1, 1, 1)};
  no_bias.bias = false;
  check_planes(no_bias, 900, GradWrite::Assign);
}

// The forward and the weight gradient at a stride of 2, from the padded planes split
// into phases (the input gradient lowers).
TEST_F(Conv2dBf16Planes, StrideTwoForwardsAndWeightGradients) {
  const std::vector<ConvCase> cases = {
      {"resnet_16to32_s2", 2, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)},
      {"odd_image", 2, 9, 27, 25, 10, 3, 3, make_params(2, 2, 1, 1)},
      {"no_padding", 2, 8, 40, 41, 8, 3, 3, make_params(2, 2, 0, 0)},
      {"kernel_5x5_pad2", 2, 6, 30, 31, 9, 5, 5, make_params(2, 2, 2, 2)},
      {"dilated", 2, 8, 29, 28, 8, 3, 3, make_params(2, 2, 2, 2, 2, 2)},
      {"down_only", 2, 8, 20, 16, 8, 3, 3, make_params(2, 1, 1, 1)},
      {"across_only", 2, 8, 16, 20, 8, 3, 3, make_params(1, 2, 1, 1)},
  };
  check_each(cases, 1000);
}

TEST_F(Conv2dBf16Planes, SameBitsForAnyThreadCount) {
  expect_same_bits_for_any_thread_count(
      {"resnet_16", 7, 16, 14, 14, 16, 3, 3, make_params(1, 1, 1, 1)}, 910);
  expect_same_bits_for_any_thread_count(
      {"resnet_16to32_s2", 5, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)}, 915);
}

// The planes sum in another order than the lowering: other bits, both in the bound.
TEST_F(Conv2dBf16Planes, OtherBitsThanTheLowering) {
  const ConvCase k{"resnet_16", 2, 16, 12, 12, 16, 3, 3, make_params(1, 1, 1, 1)};
  const ConvCase s2{"resnet_16to32_s2", 2, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)};
  const ConvOperands v = operands(k, 920), v2 = operands(s2, 925);
  const ConvResults planes = run(k, v, GradWrite::Assign), planes2 = run(s2, v2, GradWrite::Assign);
  cpu::ScopedConv2dAlgorithm lowering(Conv2dAlgorithm::Im2col);
  const ConvResults lowered = run(k, v, GradWrite::Assign);
  EXPECT_NE(planes.y, lowered.y);
  EXPECT_NE(planes.grad_x, lowered.grad_x);
  EXPECT_NE(planes.grad_w, lowered.grad_w);
  // At a stride of 2 the forward and the weight gradient read the planes.
  const ConvResults lowered2 = run(s2, v2, GradWrite::Assign);
  EXPECT_NE(planes2.y, lowered2.y);
  EXPECT_EQ(planes2.grad_x, lowered2.grad_x);
  EXPECT_NE(planes2.grad_w, lowered2.grad_w);
}

// One image on two threads lowers (each image is one thread's on the planes, where
// the lowering's GEMMs spread over the threads): the bits of the lowering forced;
// on one thread the planes' own.
TEST_F(Conv2dBf16Planes, FewerImagesThanThreadsLower) {
  const ConvCase k{"resnet_16", 1, 16, 12, 12, 16, 3, 3, make_params(1, 1, 1, 1)};
  const ConvOperands v = operands(k, 930);
  const int saved = num_threads();
  set_num_threads(1);
  const ConvResults planes = run(k, v, GradWrite::Assign);
  set_num_threads(2);
  const ConvResults two_threads = run(k, v, GradWrite::Assign);
  ConvResults lowered;
  {
    cpu::ScopedConv2dAlgorithm lowering(Conv2dAlgorithm::Im2col);
    lowered = run(k, v, GradWrite::Assign);
  }
  set_num_threads(saved);
  EXPECT_EQ(two_threads.y, lowered.y);
  EXPECT_EQ(two_threads.grad_x, lowered.grad_x);
  EXPECT_NE(planes.y, lowered.y);
}

// Which layers take the planes: a stride of 1 or 2 with some lowering to save, under
// Auto (at a stride of 2 not the input gradient); not a stride of 3, a 1x1 layer
// without padding (x is already its patch matrix), a grid mostly thrown away (7x7
// outputs in rows of 9, or of 8 on phases), a single channel's nine taps, a single
// filter, grouped layers, or a forced Im2col.
TEST_F(Conv2dBf16Planes, WhichLayersTakeThem) {
  const auto takes = [](const ConvCase& k) { return cpu::bf16_planes_apply(shape_of(k)); };
  EXPECT_TRUE(takes({"resnet_16", 64, 16, 28, 28, 16, 3, 3, make_params(1, 1, 1, 1)}));
  EXPECT_TRUE(takes({"resnet_32", 64, 32, 14, 14, 32, 3, 3, make_params(1, 1, 1, 1)}));
  const ConvCase s2{"resnet_16to32_s2", 64, 16, 28, 28, 32, 3, 3, make_params(2, 2, 1, 1)};
  EXPECT_TRUE(takes(s2));
  EXPECT_TRUE(cpu::bf16_planes_weight_grad_applies(shape_of(s2)));
  EXPECT_FALSE(cpu::bf16_planes_weight_grad_applies(
      shape_of({"s2_64_filters", 64, 16, 28, 28, 64, 3, 3, make_params(2, 2, 1, 1)})))
      << "from 32 filters up the lowering's product runs level";
  EXPECT_FALSE(takes({"resnet_32to64_s2", 64, 32, 14, 14, 64, 3, 3, make_params(2, 2, 1, 1)}))
      << "7x7 outputs in rows of 8";
  EXPECT_FALSE(takes({"stride_3", 64, 16, 28, 28, 32, 3, 3, make_params(3, 3, 1, 1)}));
  EXPECT_FALSE(takes({"pointwise", 64, 16, 28, 28, 32, 1, 1, make_params(1, 1, 0, 0)}));
  EXPECT_FALSE(takes({"resnet_64_7x7", 64, 64, 7, 7, 64, 3, 3, make_params(1, 1, 1, 1)}));
  EXPECT_FALSE(takes({"one_channel", 64, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)}))
      << "9 taps: too short a sum";
  EXPECT_FALSE(takes({"one_filter", 64, 32, 28, 28, 1, 3, 3, make_params(1, 1, 1, 1)}))
      << "one filter of a block of eight";
  EXPECT_FALSE(takes({"grouped", 64, 16, 28, 28, 16, 3, 3, make_params(1, 1, 1, 1, 1, 1, 2)}));
  cpu::ScopedConv2dAlgorithm lowering(Conv2dAlgorithm::Im2col);
  EXPECT_FALSE(takes({"resnet_16", 64, 16, 28, 28, 16, 3, 3, make_params(1, 1, 1, 1)}));
}

}  // namespace
}  // namespace towerlab::testing
