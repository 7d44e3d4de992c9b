// conv2d with bfloat16 and float16 operands on CUDA: the implicit GEMM on tensor
// cores (kernels/cuda/conv2d_tc.cuh) for the forward, the input gradient and the
// weight gradient, against the plain reference (kernels/reference/conv2d.h) in
// double on the 16-bit-rounded operands, within the bound kernels/conv2d.h states:
//   |got - want| <= 2 (n + 2) 2^-24 (sum of |terms| + |the sentinel|)
// with n the pass's reduction length (C*R*S forward, K*R*S input gradient, N*P*Q
// weight gradient) and the sum of |terms| the reference run on |x|, |weight|,
// |bias|, |grad_y|. On cuda:0: the emulated GPUs in CI, a real one where present.
//
// The cases are FashionNet's and ResNet-20's layers (channels, kernels, strides,
// padding, the 1x1 stride-2 shortcut) at batch 1 or 2 on small images, and odd
// shapes with dilation and unequal strides; both dtypes. y is assigned over NaN;
// grad_weight and grad_bias accumulate onto sentinels; grad_x is assigned over
// NaN in half the cases and accumulates onto a sentinel in the others. Controls:
// the reference on the unrounded operands lies outside the bound, and so do the
// results with the sentinel left out. A grouped layer (which keeps the widening
// path) and the same bits on a second run close the file.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "conv2d_case.h"
#include "engine/half.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// Each value rounded to In and back.
template <typename In>
std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = static_cast<float>(In(x));
  return v;
}

template <typename In>
std::vector<In> narrowed(const std::vector<float>& v) {
  std::vector<In> out;
  out.reserve(v.size());
  for (float x : v) out.push_back(In(x));
  return out;
}

// The pass's results, as host vectors.
struct Results {
  std::vector<float> y, grad_x, grad_w, grad_b;
};

// The reduction lengths n of the bound, per pass.
struct Lengths {
  std::int64_t forward, data, weight;
};

Lengths lengths(const ConvCase& k) {
  const Shape ys = k.y_shape();
  return {k.C / k.params.groups * k.R * k.S, k.K / k.params.groups * k.R * k.S,
          k.N * ys[2] * ys[3]};
}

// |got - (want + sentinel)| <= 2 (n + 2) 2^-24 (scale + |sentinel|), element by element.
::testing::AssertionResult within_bound(const std::vector<float>& got,
                                        const std::vector<double>& want,
                                        const std::vector<double>& scale, std::int64_t n,
                                        double sentinel) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  const double unit = 2.0 * double(n + 2) * std::ldexp(1.0, -24);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double expected = want[i] + sentinel;
    const double bound = unit * (scale[i] + std::fabs(sentinel));
    if (!(std::fabs(double(got[i]) - expected) <= bound)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << " against " << expected << ", off by "
             << std::fabs(double(got[i]) - expected) << " > " << bound;
    }
  }
  return ::testing::AssertionSuccess();
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

  template <typename In>
  Tensor upload(const std::vector<float>& v, const Shape& shape) {
    return Tensor::from_host<In>(narrowed<In>(v), shape, stream());
  }
  Tensor filled(float value, const Shape& shape) {
    return Tensor::from_host<float>(std::vector<float>(std::size_t(numel_of(shape)), value), shape,
                                    stream());
  }

  // The three passes in In (x, w, g rounded to it; b float32): y over NaN,
  // grad_weight and grad_bias onto their sentinels, grad_x assigned over NaN or
  // accumulated onto its sentinel.
  template <typename In>
  Results run(const ConvCase& k, const std::vector<float>& x, const std::vector<float>& w,
              const std::vector<float>& b, const std::vector<float>& g, GradWrite grad_x_write) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Tensor y = filled(nan, k.y_shape());
    conv2d_forward(y, upload<In>(x, k.x_shape()), upload<In>(w, k.w_shape()),
                   Tensor::from_host<float>(b, {k.K}, stream()), k.params, stream());
    Tensor grad_x =
        filled(grad_x_write == GradWrite::Assign ? nan : kDataSentinel, k.x_shape());
    Tensor grad_w = filled(kWeightSentinel, k.w_shape());
    Tensor grad_b = filled(kBiasSentinel, {k.K});
    conv2d_backward(grad_x, grad_w, grad_b, upload<In>(g, k.y_shape()),
                    upload<In>(x, k.x_shape()), upload<In>(w, k.w_shape()), k.params, stream(),
                    grad_x_write);
    return {y.to_host<float>(stream()), grad_x.to_host<float>(stream()),
            grad_w.to_host<float>(stream()), grad_b.to_host<float>(stream())};
  }

  // One case in In against the reference on the rounded operands.
  template <typename In>
  void check(const ConvCase& k, unsigned seed, GradWrite grad_x_write) {
    SCOPED_TRACE(k.name + (std::is_same_v<In, bfloat16> ? " bfloat16" : " float16") +
                 (grad_x_write == GradWrite::Assign ? ", grad_x assigned" : ", grad_x added"));
    const auto x = rounded<In>(random_values(std::size_t(numel_of(k.x_shape())), seed));
    const auto w = rounded<In>(random_values(std::size_t(numel_of(k.w_shape())), seed + 1));
    const auto b = random_values(std::size_t(k.K), seed + 2);
    const auto g = rounded<In>(random_values(std::size_t(numel_of(k.y_shape())), seed + 3));
    const Results got = run<In>(k, x, w, b, g, grad_x_write);
    const Reference want = reference(k, widen(x), widen(w), widen(b), widen(g));
    const Reference scale =
        reference(k, magnitudes(x), magnitudes(w), magnitudes(b), magnitudes(g));
    const Lengths n = lengths(k);
    const double data_sentinel = grad_x_write == GradWrite::Assign ? 0.0 : kDataSentinel;
    EXPECT_TRUE(within_bound(got.y, want.y, scale.y, n.forward, 0.0)) << "y";
    EXPECT_TRUE(within_bound(got.grad_x, want.grad_x, scale.grad_x, n.data, data_sentinel))
        << "grad_x";
    EXPECT_TRUE(within_bound(got.grad_w, want.grad_w, scale.grad_w, n.weight, kWeightSentinel))
        << "grad_w";
    EXPECT_TRUE(within_bound(got.grad_b, want.grad_b, scale.grad_b, n.weight, kBiasSentinel))
        << "grad_b";
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

// Odd sizes: unequal strides, paddings and dilations, a 3x2 kernel, K and C that
// fill no tile; a 5x5 kernel with stride 3 (gaps in the input gradient).
TEST_F(Conv2dTensorCores, OddShapesStridesAndDilation) {
  const ConvCase odd{"odd", 3, 5, 7, 9, 6, 3, 2, make_params(2, 1, 1, 0, 1, 2)};
  const ConvCase gaps{"stride3_5x5", 2, 7, 13, 11, 37, 5, 5, make_params(3, 3, 2, 1)};
  check<bfloat16>(odd, 200, GradWrite::Assign);
  check<float16>(odd, 210, GradWrite::Accumulate);
  check<bfloat16>(gaps, 220, GradWrite::Accumulate);
}

// The checks can fail: the reference on the operands before rounding, and the
// expected values without the sentinels, lie outside the bound.
TEST_F(Conv2dTensorCores, ControlsUnroundedOperandsAndMissingSentinels) {
  const ConvCase k{"resnet_16", 2, 16, 6, 6, 16, 3, 3, make_params(1, 1, 1, 1)};
  const auto x = random_values(std::size_t(numel_of(k.x_shape())), 300);
  const auto w = random_values(std::size_t(numel_of(k.w_shape())), 301);
  const auto b = random_values(std::size_t(k.K), 302);
  const auto g = random_values(std::size_t(numel_of(k.y_shape())), 303);
  const Results got = run<bfloat16>(k, x, w, b, g, GradWrite::Accumulate);
  const Reference unrounded = reference(k, widen(x), widen(w), widen(b), widen(g));
  const Reference scale = reference(k, magnitudes(x), magnitudes(w), magnitudes(b), magnitudes(g));
  const Lengths n = lengths(k);
  EXPECT_FALSE(within_bound(got.y, unrounded.y, scale.y, n.forward, 0.0)) << "y";
  EXPECT_FALSE(within_bound(got.grad_x, unrounded.grad_x, scale.grad_x, n.data, kDataSentinel))
      << "grad_x";
  EXPECT_FALSE(within_bound(got.grad_w, unrounded.grad_w, scale.grad_w, n.weight, kWeightSentinel))
      << "grad_w";

  const Reference want = reference(k, widen(rounded<bfloat16>(x)), widen(rounded<bfloat16>(w)),
                                   widen(b), widen(rounded<bfloat16>(g)));
  EXPECT_TRUE(within_bound(got.grad_x, want.grad_x, scale.grad_x, n.data, kDataSentinel));
  EXPECT_FALSE(within_bound(got.grad_x, want.grad_x, scale.grad_x, n.data, 0.0))
      << "grad_x: the sentinel was not added";
  EXPECT_TRUE(within_bound(got.grad_w, want.grad_w, scale.grad_w, n.weight, kWeightSentinel));
  EXPECT_FALSE(within_bound(got.grad_w, want.grad_w, scale.grad_w, n.weight, 0.0))
      << "grad_w: the sentinel was not added";
}

// Groups > 1 keep the widening path (float32 kernels on widened copies), within the
// same bound; and a second run of the tensor-core passes gives the same bits.
TEST_F(Conv2dTensorCores, GroupedLayerAndRepeatedBits) {
  check<bfloat16>({"grouped", 2, 8, 6, 5, 12, 3, 3, make_params(1, 1, 1, 1, 1, 1, 4)}, 400,
                  GradWrite::Accumulate);
  const ConvCase k{"resnet_down_16_32", 1, 16, 9, 9, 32, 3, 3, make_params(2, 2, 1, 1)};
  const auto x = random_values(std::size_t(numel_of(k.x_shape())), 410);
  const auto w = random_values(std::size_t(numel_of(k.w_shape())), 411);
  const auto b = random_values(std::size_t(k.K), 412);
  const auto g = random_values(std::size_t(numel_of(k.y_shape())), 413);
  const Results first = run<float16>(k, x, w, b, g, GradWrite::Assign);
  const Results second = run<float16>(k, x, w, b, g, GradWrite::Assign);
  EXPECT_EQ(bits(first.y), bits(second.y));
  EXPECT_EQ(bits(first.grad_x), bits(second.grad_x));
  EXPECT_EQ(bits(first.grad_w), bits(second.grad_w));
}

}  // namespace
}  // namespace towerlab::testing
