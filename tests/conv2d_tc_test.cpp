// conv2d with bfloat16 and float16 operands, and float32 ones under
// Float32Math::Tf32, on CUDA: the implicit GEMM on tensor cores
// (kernels/cuda/conv2d_tc.cuh) for the forward, the input gradient and the weight
// gradient, against the plain reference (kernels/reference/conv2d.h) in double on
// the operands rounded to 16 bits or to TF32 (reference::round_tf32), within the
// bound kernels/conv2d.h states:
//   |got - want| <= 2 (n + 2) 2^-24 (sum of |terms| + |the sentinel|)
// with n the pass's reduction length (C*R*S forward, K*R*S input gradient, N*P*Q
// weight gradient) and the sum of |terms| the reference run on |x|, |weight|,
// |bias|, |grad_y|. On cuda:0: the emulated GPUs in CI, a real one where present.
//
// The cases are FashionNet's and ResNet-20's layers (channels, kernels, strides,
// padding, the 1x1 stride-2 shortcut) at batch 1 or 2 on small images, and odd
// shapes with dilation and unequal strides; the three operand types (TF32's
// float32 tensors are uploaded unrounded: the kernel rounds). y is assigned over
// NaN; grad_weight and grad_bias accumulate onto sentinels; grad_x is assigned over
// NaN in half the cases and accumulates onto a sentinel in the others. Controls:
// the reference on the unrounded operands lies outside the bound (for TF32 so do
// the float32 kernels' results), and so do the results with the sentinel left out.
// Grouped layers (which keep the widening path, and float32 under Tf32) and the
// same bits on a second run, Tf32 on the CPU (float32's bits) and a Tf32 tape's
// ag::conv2d close the file.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "conv2d_case.h"
#include "conv2d_gemm_bound.h"
#include "engine/half.h"
#include "kernels/reference/matmul.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// The operand types In: bfloat16 and float16 tensors, or Tf32: float32 tensors
// multiplied under Float32Math::Tf32.
struct Tf32 {};

template <typename In>
constexpr Float32Math math_of() {
  return std::is_same_v<In, Tf32> ? Float32Math::Tf32 : Float32Math::Ieee;
}

template <typename In>
std::string name_of() {
  return std::is_same_v<In, bfloat16>  ? "bfloat16"
         : std::is_same_v<In, float16> ? "float16"
                                       : "tf32";
}

// Each value rounded as the kernel multiplies it: to In and back, or to TF32.
template <typename In>
std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) {
    if constexpr (std::is_same_v<In, Tf32>) {
      x = reference::round_tf32(x);
    } else {
      x = static_cast<float>(In(x));
    }
  }
  return v;
}

class Conv2dTensorCores : public ::testing::Test {
 protected:
  static constexpr float kWeightSentinel = 0.5f, kBiasSentinel = -0.25f, kDataSentinel = 0.75f;

  void SetUp() override {
    skip_without_cuda_device();
    if (IsSkipped() || HasFatalFailure()) return;
    stream_ = std::make_unique<Stream>(Device::cuda(0));
  }
  const Stream& stream() const { return *stream_; }

  // v as an operand of type In: rounded to 16 bits, or float32 as it is (TF32's
  // rounding is the kernel's).
  template <typename In>
  Tensor upload(const std::vector<float>& v, const Shape& shape) {
    if constexpr (std::is_same_v<In, Tf32>) {
      return Tensor::from_host<float>(v, shape, stream());
    } else {
      return Tensor::from_host<In>(narrow<In>(v), shape, stream());
    }
  }
  Tensor filled(float value, const Shape& shape) {
    return Tensor::from_host<float>(std::vector<float>(std::size_t(numel_of(shape)), value), shape,
                                    stream());
  }

  // The three passes in In (x, w, g as upload makes them; b float32), on `stream`
  // with `math`: y over NaN, grad_weight and grad_bias onto their sentinels,
  // grad_x assigned over NaN or accumulated onto its sentinel.
  template <typename In>
  ConvResults run(const ConvCase& k, const std::vector<float>& x, const std::vector<float>& w,
                  const std::vector<float>& b, const std::vector<float>& g, GradWrite grad_x_write,
                  Float32Math math = math_of<In>()) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Tensor y = filled(nan, k.y_shape());
    conv2d_forward(y, upload<In>(x, k.x_shape()), upload<In>(w, k.w_shape()),
                   Tensor::from_host<float>(b, {k.K}, stream()), k.params, stream(), math);
    Tensor grad_x = filled(grad_x_write == GradWrite::Assign ? nan : kDataSentinel, k.x_shape());
    Tensor grad_w = filled(kWeightSentinel, k.w_shape());
    Tensor grad_b = filled(kBiasSentinel, {k.K});
    conv2d_backward(grad_x, grad_w, grad_b, upload<In>(g, k.y_shape()), upload<In>(x, k.x_shape()),
                    upload<In>(w, k.w_shape()), k.params, stream(), grad_x_write, math);
    return {y.to_host<float>(stream()), grad_x.to_host<float>(stream()),
            grad_w.to_host<float>(stream()), grad_b.to_host<float>(stream())};
  }

  // One case in In against the reference on the rounded operands.
  template <typename In>
  void check(const ConvCase& k, unsigned seed, GradWrite grad_x_write) {
    SCOPED_TRACE(k.name + " " + name_of<In>() +
                 (grad_x_write == GradWrite::Assign ? ", grad_x assigned" : ", grad_x added"));
    const ConvOperands v = operands(k, seed);
    const ConvResults got = run<In>(k, v.x, v.w, v.b, v.g, grad_x_write);
    const auto x = rounded<In>(v.x), w = rounded<In>(v.w), g = rounded<In>(v.g);
    Reference want = reference(k, widen(x), widen(w), widen(v.b), widen(g));
    Reference scale = reference(k, magnitudes(x), magnitudes(w), magnitudes(v.b), magnitudes(g));
    if constexpr (std::is_same_v<In, Tf32>) {  // grad_bias sums the float32 grad_y, unrounded
      want.grad_b = bias_gradient(k, widen(v.g));
      scale.grad_b = bias_gradient(k, magnitudes(v.g));
    }
    const ConvLengths n = lengths(k);
    const double data_sentinel = grad_x_write == GradWrite::Assign ? 0.0 : kDataSentinel;
    EXPECT_TRUE(within_bound(got.y, want.y, scale.y, n.forward, 0.0)) << "y";
    EXPECT_TRUE(within_bound(got.grad_x, want.grad_x, scale.grad_x, n.data, data_sentinel))
        << "grad_x";
    EXPECT_TRUE(within_bound(got.grad_w, want.grad_w, scale.grad_w, n.weight, kWeightSentinel))
        << "grad_w";
    EXPECT_TRUE(within_bound(got.grad_b, want.grad_b, scale.grad_b, n.weight, kBiasSentinel))
        << "grad_b";
  }

  // The checks can fail, for operand type In: the reference on the operands before
  // rounding, and the expected values without the sentinels, lie outside the bound.
  template <typename In>
  void expect_controls(const ConvCase& k, unsigned seed) {
    SCOPED_TRACE(k.name + " " + name_of<In>());
    const ConvOperands v = operands(k, seed);
    const ConvResults got = run<In>(k, v.x, v.w, v.b, v.g, GradWrite::Accumulate);
    const Reference unrounded = reference(k, widen(v.x), widen(v.w), widen(v.b), widen(v.g));
    const Reference scale =
        reference(k, magnitudes(v.x), magnitudes(v.w), magnitudes(v.b), magnitudes(v.g));
    const ConvLengths n = lengths(k);
    EXPECT_FALSE(within_bound(got.y, unrounded.y, scale.y, n.forward, 0.0)) << "y";
    EXPECT_FALSE(within_bound(got.grad_x, unrounded.grad_x, scale.grad_x, n.data, kDataSentinel))
        << "grad_x";
    EXPECT_FALSE(
        within_bound(got.grad_w, unrounded.grad_w, scale.grad_w, n.weight, kWeightSentinel))
        << "grad_w";

    const Reference want = reference(k, widen(rounded<In>(v.x)), widen(rounded<In>(v.w)),
                                     widen(v.b), widen(rounded<In>(v.g)));
    EXPECT_TRUE(within_bound(got.grad_x, want.grad_x, scale.grad_x, n.data, kDataSentinel));
    EXPECT_FALSE(within_bound(got.grad_x, want.grad_x, scale.grad_x, n.data, 0.0))
        << "grad_x: the sentinel was not added";
    EXPECT_TRUE(within_bound(got.grad_w, want.grad_w, scale.grad_w, n.weight, kWeightSentinel));
    EXPECT_FALSE(within_bound(got.grad_w, want.grad_w, scale.grad_w, n.weight, 0.0))
        << "grad_w: the sentinel was not added";
  }

 private:
  std::unique_ptr<Stream> stream_;
};

// FashionNet: conv1 (1 -> 32, 3x3, padding 1) on a whole 28x28 image, conv2
// (32 -> 64) on a 4x4 crop. Its weight gradient reduces 784 pixels: three splits.
TEST_F(Conv2dTensorCores, FashionNetLayers) {
  const ConvCase conv1{"fashion_conv1", 1, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)};
  const ConvCase conv2{"fashion_conv2", 1, 32, 4, 4, 64, 3, 3, make_params(1, 1, 1, 1)};
  check<bfloat16>(conv1, 10, GradWrite::Assign);
  check<float16>(conv1, 20, GradWrite::Accumulate);
  check<bfloat16>(conv2, 30, GradWrite::Accumulate);
  check<float16>(conv2, 40, GradWrite::Assign);
}

// ResNet-20: the RGB stem (3 -> 16), a 16-channel block layer, the stride-2 3x3
// into 32 channels on an odd image, its 1x1 stride-2 shortcut, and a 64-channel
// layer on the last stage's small map.
TEST_F(Conv2dTensorCores, ResNet20Layers) {
  const std::vector<ConvCase> cases = {
      {"resnet_stem", 1, 3, 8, 8, 16, 3, 3, make_params(1, 1, 1, 1)},
      {"resnet_16", 2, 16, 6, 6, 16, 3, 3, make_params(1, 1, 1, 1)},
      {"resnet_down_16_32", 2, 16, 9, 9, 32, 3, 3, make_params(2, 2, 1, 1)},
      {"resnet_shortcut_32_64", 2, 32, 7, 7, 64, 1, 1, make_params(2, 2, 0, 0)},
      {"resnet_64", 1, 64, 3, 3, 64, 3, 3, make_params(1, 1, 1, 1)},
  };
  unsigned seed = 100;
  bool assign = true;
  for (const ConvCase& k : cases) {
    check<bfloat16>(k, seed += 10, assign ? GradWrite::Assign : GradWrite::Accumulate);
    assign = !assign;
  }
  check<float16>(cases[2], seed += 10, GradWrite::Assign);
}

// TF32: FashionNet's two layers (conv1's C = 1 included: no direct kernel under
// Tf32) and ResNet-20's, float32 tensors multiplied under Float32Math::Tf32.
TEST_F(Conv2dTensorCores, Tf32FashionNetAndResNet20Layers) {
  const std::vector<ConvCase> cases = {
      {"fashion_conv1", 1, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion_conv2", 1, 32, 4, 4, 64, 3, 3, make_params(1, 1, 1, 1)},
      {"resnet_stem", 1, 3, 8, 8, 16, 3, 3, make_params(1, 1, 1, 1)},
      {"resnet_down_16_32", 2, 16, 9, 9, 32, 3, 3, make_params(2, 2, 1, 1)},
      {"resnet_shortcut_32_64", 2, 32, 7, 7, 64, 1, 1, make_params(2, 2, 0, 0)},
      {"resnet_64", 1, 64, 3, 3, 64, 3, 3, make_params(1, 1, 1, 1)},
  };
  unsigned seed = 150;
  bool assign = true;
  for (const ConvCase& k : cases) {
    check<Tf32>(k, seed += 10, assign ? GradWrite::Assign : GradWrite::Accumulate);
    assign = !assign;
  }
}

// Odd sizes: unequal strides, paddings and dilations, a 3x2 kernel, K and C that
// fill no tile; a 5x5 kernel with stride 3 (gaps in the input gradient).
TEST_F(Conv2dTensorCores, OddShapesStridesAndDilation) {
  const ConvCase odd{"odd", 3, 5, 7, 9, 6, 3, 2, make_params(2, 1, 1, 0, 1, 2)};
  const ConvCase gaps{"stride3_5x5", 2, 7, 13, 11, 37, 5, 5, make_params(3, 3, 2, 1)};
  check<bfloat16>(odd, 200, GradWrite::Assign);
  check<float16>(odd, 210, GradWrite::Accumulate);
  check<bfloat16>(gaps, 220, GradWrite::Accumulate);
  check<Tf32>(odd, 230, GradWrite::Assign);
  check<Tf32>(gaps, 240, GradWrite::Accumulate);
}

// The checks can fail: for bfloat16 and for TF32, the reference on the operands
// before rounding, and the expected values without the sentinels, lie outside the
// bound.
TEST_F(Conv2dTensorCores, ControlsUnroundedOperandsAndMissingSentinels) {
  const ConvCase k{"resnet_16", 2, 16, 6, 6, 16, 3, 3, make_params(1, 1, 1, 1)};
  expect_controls<bfloat16>(k, 300);
  expect_controls<Tf32>(k, 310);
}

// Under Tf32 the float32 kernels (Float32Math::Ieee on the same float32 tensors)
// give results outside TF32's bound around the reference on the TF32-rounded
// operands, in all three passes: the check above sees which path ran.
TEST_F(Conv2dTensorCores, Tf32ControlFloat32ResultsAreOutsideTheTf32Bound) {
  const ConvCase k{"odd", 3, 5, 7, 9, 6, 3, 2, make_params(2, 1, 1, 0, 1, 2)};
  const ConvOperands v = operands(k, 320);
  const ConvResults ieee = run<Tf32>(k, v.x, v.w, v.b, v.g, GradWrite::Assign, Float32Math::Ieee);
  const Reference want = reference(k, widen(rounded<Tf32>(v.x)), widen(rounded<Tf32>(v.w)),
                                   widen(v.b), widen(rounded<Tf32>(v.g)));
  const Reference scale =
      reference(k, magnitudes(rounded<Tf32>(v.x)), magnitudes(rounded<Tf32>(v.w)), magnitudes(v.b),
                magnitudes(rounded<Tf32>(v.g)));
  const ConvLengths n = lengths(k);
  EXPECT_FALSE(within_bound(ieee.y, want.y, scale.y, n.forward, 0.0)) << "y";
  EXPECT_FALSE(within_bound(ieee.grad_x, want.grad_x, scale.grad_x, n.data, 0.0)) << "grad_x";
  EXPECT_FALSE(within_bound(ieee.grad_w, want.grad_w, scale.grad_w, n.weight, kWeightSentinel))
      << "grad_w";
}

// Groups > 1 keep the widening path (float32 kernels on widened copies), within the
// same bound, and under Tf32 the float32 kernels (Ieee's bits); a second run of the
// tensor-core passes gives the same bits, 16-bit and TF32.
TEST_F(Conv2dTensorCores, GroupedLayerAndRepeatedBits) {
  const ConvCase grouped{"grouped", 2, 8, 6, 5, 12, 3, 3, make_params(1, 1, 1, 1, 1, 1, 4)};
  check<bfloat16>(grouped, 400, GradWrite::Accumulate);
  const ConvOperands v = operands(grouped, 420);
  const ConvResults tf32 = run<Tf32>(grouped, v.x, v.w, v.b, v.g, GradWrite::Assign);
  const ConvResults ieee =
      run<Tf32>(grouped, v.x, v.w, v.b, v.g, GradWrite::Assign, Float32Math::Ieee);
  EXPECT_EQ(bits(tf32.y), bits(ieee.y));
  EXPECT_EQ(bits(tf32.grad_x), bits(ieee.grad_x));
  EXPECT_EQ(bits(tf32.grad_w), bits(ieee.grad_w));

  const ConvCase k{"resnet_down_16_32", 1, 16, 9, 9, 32, 3, 3, make_params(2, 2, 1, 1)};
  const ConvOperands u = operands(k, 410);
  const auto expect_repeats = [&]<typename In>() {
    SCOPED_TRACE(name_of<In>());
    const ConvResults first = run<In>(k, u.x, u.w, u.b, u.g, GradWrite::Assign);
    const ConvResults second = run<In>(k, u.x, u.w, u.b, u.g, GradWrite::Assign);
    EXPECT_EQ(bits(first.y), bits(second.y));
    EXPECT_EQ(bits(first.grad_x), bits(second.grad_x));
    EXPECT_EQ(bits(first.grad_w), bits(second.grad_w));
  };
  expect_repeats.template operator()<float16>();
  expect_repeats.template operator()<Tf32>();
}

// The CPU has no TF32 arithmetic: Tf32 there gives Ieee's bits, in all three passes.
TEST(Conv2dTf32, OnTheCpuIsFloat32) {
  const ConvCase k{"odd", 3, 5, 7, 9, 6, 3, 2, make_params(2, 1, 1, 0, 1, 2)};
  const ConvOperands v = operands(k, 500);
  const auto pass = [&](Float32Math math) {
    Tensor y = Tensor::empty(k.y_shape(), cpu());
    const Tensor x = Tensor::from_host<float>(v.x, k.x_shape(), cpu());
    const Tensor w = Tensor::from_host<float>(v.w, k.w_shape(), cpu());
    conv2d_forward(y, x, w, Tensor::from_host<float>(v.b, {k.K}, cpu()), k.params, cpu(), math);
    Tensor grad_x = Tensor::zeros(k.x_shape(), cpu());
    Tensor grad_w = Tensor::zeros(k.w_shape(), cpu());
    Tensor grad_b = Tensor::zeros({k.K}, cpu());
    conv2d_backward(grad_x, grad_w, grad_b, Tensor::from_host<float>(v.g, k.y_shape(), cpu()), x, w,
                    k.params, cpu(), GradWrite::Accumulate, math);
    return ConvResults{y.to_host<float>(), grad_x.to_host<float>(), grad_w.to_host<float>(),
                       grad_b.to_host<float>()};
  };
  const ConvResults tf32 = pass(Float32Math::Tf32), ieee = pass(Float32Math::Ieee);
  EXPECT_EQ(bits(tf32.y), bits(ieee.y));
  EXPECT_EQ(bits(tf32.grad_x), bits(ieee.grad_x));
  EXPECT_EQ(bits(tf32.grad_w), bits(ieee.grad_w));
  EXPECT_EQ(bits(tf32.grad_b), bits(ieee.grad_b));
}

// A tape's Float32Math reaches ag::conv2d's three passes: under Tf32, y and the
// gradients of x, weight and bias (from an output gradient) are within the bound of
// the reference on the TF32-rounded operands; the same tape under Ieee gives other
// bits.
TEST_F(Conv2dTensorCores, ATf32TapeRunsConv2dForwardAndBackwardOnTf32) {
  const ConvCase k{"resnet_down_16_32", 2, 16, 9, 9, 32, 3, 3, make_params(2, 2, 1, 1)};
  const ConvOperands v = operands(k, 600);
  const auto pass = [&](Float32Math math) {
    Tape tape(stream());
    tape.set_float32_math(math);
    const auto variable = [&](const std::vector<float>& values, const Shape& shape,
                              const char* name) {
      return tape.variable(Tensor::from_host<float>(values, shape, stream()), filled(0.0f, shape),
                           name);
    };
    const Var x = variable(v.x, k.x_shape(), "x");
    const Var w = variable(v.w, k.w_shape(), "w");
    const Var b = variable(v.b, {k.K}, "b");
    const Var y = ag::conv2d(x, w, b, k.params);
    tape.backward(y, Tensor::from_host<float>(v.g, k.y_shape(), stream()));
    return ConvResults{y.value().to_host<float>(stream()), x.grad().to_host<float>(stream()),
                       w.grad().to_host<float>(stream()), b.grad().to_host<float>(stream())};
  };
  const ConvResults tf32 = pass(Float32Math::Tf32);
  const auto x = rounded<Tf32>(v.x), w = rounded<Tf32>(v.w), g = rounded<Tf32>(v.g);
  Reference want = reference(k, widen(x), widen(w), widen(v.b), widen(g));
  Reference scale = reference(k, magnitudes(x), magnitudes(w), magnitudes(v.b), magnitudes(g));
  want.grad_b = bias_gradient(k, widen(v.g));  // grad_bias sums the float32 grad_y, unrounded
  scale.grad_b = bias_gradient(k, magnitudes(v.g));
  const ConvLengths n = lengths(k);
  EXPECT_TRUE(within_bound(tf32.y, want.y, scale.y, n.forward, 0.0)) << "y";
  EXPECT_TRUE(within_bound(tf32.grad_x, want.grad_x, scale.grad_x, n.data, 0.0)) << "grad_x";
  EXPECT_TRUE(within_bound(tf32.grad_w, want.grad_w, scale.grad_w, n.weight, 0.0)) << "grad_w";
  EXPECT_TRUE(within_bound(tf32.grad_b, want.grad_b, scale.grad_b, n.weight, 0.0)) << "grad_b";
  const ConvResults ieee = pass(Float32Math::Ieee);
  EXPECT_NE(bits(tf32.y), bits(ieee.y));
  EXPECT_NE(bits(tf32.grad_x), bits(ieee.grad_x));
  EXPECT_NE(bits(tf32.grad_w), bits(ieee.grad_w));
}

}  // namespace
}  // namespace towerlab::testing
