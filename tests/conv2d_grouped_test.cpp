// Grouped and depthwise conv2d (kernels/conv2d.h, "Groups") on every backend: the
// plain reference checked first against a dense convolution with a block-diagonal
// weight (and a control that the comparison can fail), then each backend against the
// reference on odd shapes with groups 1, 2, 4 and C (depthwise, with and without a
// channel multiplier), strides, padding and dilation; add-versus-assign sentinels,
// only the requested gradients, float64 on the CPU against the reference and by
// central differences, typed errors, the Conv2d layer with groups, and the cases
// tests/ops_vs_torch_test.py compares with torch's conv2d(groups=...).
#include <cmath>
#include <cstring>
#include <string>

#include "autograd/layers.h"
#include "conv2d_case.h"
#include "gradcheck.h"
#include "kernels/conv2d.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// Small shapes: the emulated GPUs run these too.
std::vector<ConvCase> grouped_cases() {
  return {
      {"g1_dense", 2, 4, 7, 6, 6, 3, 3, make_params(1, 1, 1, 1)},
      {"g2", 2, 6, 7, 9, 4, 3, 3, make_params(1, 1, 1, 1, 1, 1, 2)},
      {"g2_stride2_ragged_no_bias", 3, 4, 9, 8, 6, 3, 3, make_params(2, 2, 1, 0, 1, 1, 2), false},
      {"g4_1x1", 2, 8, 5, 7, 12, 1, 1, make_params(1, 1, 0, 0, 1, 1, 4)},
      {"g4_5x3_dilation2", 1, 4, 11, 9, 8, 5, 3, make_params(1, 2, 2, 1, 2, 1, 4)},
      {"depthwise_3x3", 2, 5, 9, 7, 5, 3, 3, make_params(1, 1, 1, 1, 1, 1, 5)},
      {"depthwise_x2_stride2", 3, 3, 11, 10, 6, 3, 3, make_params(2, 2, 1, 1, 1, 1, 3)},
      {"depthwise_x3_5x5_no_bias", 1, 2, 9, 13, 6, 5, 5, make_params(1, 1, 2, 2, 1, 1, 2), false},
      {"depthwise_stride3_dilation2", 2, 4, 13, 11, 4, 3, 2, make_params(3, 2, 1, 0, 2, 2, 4)},
  };
}

// The reference with groups, against the dense reference (groups 1) on a weight
// [K,C,R,S] that is the grouped weight inside the diagonal blocks and `off` outside:
// equal when off is 0 (a grouped convolution is a dense one that cannot see across
// groups), and different otherwise (the control).
TEST(Conv2dGroupedReference, IsADenseConvolutionWithABlockDiagonalWeight) {
  for (const ConvCase& k : grouped_cases()) {
    SCOPED_TRACE(k.name);
    const std::int64_t G = k.params.groups, Cg = k.C / G, Kg = k.K / G;
    const auto xv = widen(random_values(static_cast<std::size_t>(numel_of(k.x_shape())), 11));
    const auto wv = widen(random_values(static_cast<std::size_t>(numel_of(k.w_shape())), 12));
    const auto bv = widen(random_values(static_cast<std::size_t>(k.K), 13));
    const auto gv = widen(random_values(static_cast<std::size_t>(numel_of(k.y_shape())), 14));
    const Reference grouped = reference(k, xv, wv, bv, gv);
    for (const double off : {0.0, 0.25}) {
      ConvCase dense = k;
      dense.params.groups = 1;
      std::vector<double> dense_w(static_cast<std::size_t>(numel_of(dense.w_shape())), off);
      const std::int64_t RS = k.R * k.S;
      for (std::int64_t o = 0; o < k.K; ++o) {
        for (std::int64_t c = 0; c < Cg; ++c) {
          for (std::int64_t t = 0; t < RS; ++t) {
            dense_w[static_cast<std::size_t>((o * k.C + (o / Kg) * Cg + c) * RS + t)] =
                wv[static_cast<std::size_t>((o * Cg + c) * RS + t)];
          }
        }
      }
      const Reference want = reference(dense, xv, dense_w, bv, gv);
      // The dense weight gradient, read back in the grouped layout.
      std::vector<double> grad_w(wv.size());
      for (std::int64_t o = 0; o < k.K; ++o) {
        for (std::int64_t c = 0; c < Cg; ++c) {
          for (std::int64_t t = 0; t < RS; ++t) {
            grad_w[static_cast<std::size_t>((o * Cg + c) * RS + t)] =
                want.grad_w[static_cast<std::size_t>((o * k.C + (o / Kg) * Cg + c) * RS + t)];
          }
        }
      }
      const bool same = all_close(narrow(grouped.y), narrow(want.y), 1e-12, 0) &&
                        all_close(narrow(grouped.grad_x), narrow(want.grad_x), 1e-12, 0);
      EXPECT_EQ(same, off == 0.0 || G == 1) << "off " << off;
      // The weight and bias gradients do not depend on the weight.
      EXPECT_TRUE(all_close(narrow(grouped.grad_w), narrow(grad_w), 1e-12, 0));
      EXPECT_TRUE(all_close(narrow(grouped.grad_b), narrow(want.grad_b), 1e-12, 0));
    }
  }
}

class Conv2dGroupedTest : public ConvBackendTest {};
TL_INSTANTIATE_BACKENDS(Conv2dGroupedTest);

TEST_P(Conv2dGroupedTest, MatchesTheReferenceWithSentinels) {
  expect_reference_with_sentinels(grouped_cases(), 300,
                                  {1e-5, 1e-5, 1e-5, 1e-5, 1e-4, 1e-5, 1e-4, 1e-5});
}

TEST_P(Conv2dGroupedTest, AssignedGradXIsAccumulatingOntoZeros) {
  expect_assign_is_accumulating_onto_zeros(grouped_cases(), 700);
}

TEST_P(Conv2dGroupedTest, ComputesOnlyRequestedGradients) {
  for (const ConvCase& k :
       {ConvCase{"g2", 2, 4, 6, 5, 6, 3, 3, make_params(1, 1, 1, 1, 1, 1, 2)},
        ConvCase{"depthwise_x2", 2, 3, 6, 5, 6, 3, 3, make_params(1, 1, 1, 1, 1, 1, 3)}}) {
    SCOPED_TRACE(k.name);
    const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), 1);
    const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), 2);
    const auto gv = random_values(static_cast<std::size_t>(numel_of(k.y_shape())), 3);
    const Reference ref =
        reference(k, widen(xv), widen(wv), std::vector<double>(6, 0.0), widen(gv));
    Tensor x = make(xv, k.x_shape()), w = make(wv, k.w_shape()), grad_y = make(gv, k.y_shape());
    Tensor grad_w = Tensor::zeros(k.w_shape(), stream());
    conv2d_backward(Tensor(), grad_w, Tensor(), grad_y, x, w, k.params, stream());
    EXPECT_TRUE(all_close(host(grad_w), narrow(ref.grad_w), 1e-4, 1e-5));
    Tensor grad_x = Tensor::zeros(k.x_shape(), stream());
    conv2d_backward(grad_x, Tensor(), Tensor(), grad_y, x, w, k.params, stream());
    EXPECT_TRUE(all_close(host(grad_x), narrow(ref.grad_x), 1e-5, 1e-5));
    Tensor grad_b = Tensor::zeros({6}, stream());
    conv2d_backward(Tensor(), Tensor(), grad_b, grad_y, x, w, k.params, stream());
    EXPECT_TRUE(all_close(host(grad_b), narrow(ref.grad_b), 1e-4, 1e-5));
  }
}

TEST_P(Conv2dGroupedTest, RejectsChannelsThatGroupsDoNotDivide) {
  Tensor x = Tensor::zeros({2, 6, 5, 5}, stream());
  Tensor y = Tensor::zeros({2, 4, 3, 3}, stream());
  Tensor w = Tensor::zeros({4, 2, 3, 3}, stream());
  EXPECT_THROW_WITH(
      conv2d_forward(y, x, w, Tensor(), make_params(1, 1, 0, 0, 1, 1, 4), stream()), ShapeError,
      "conv2d: 4 groups do not divide the input's 6 channels and the weight's 4 filters (input "
      "float32[2,6,5,5], weight float32[4,2,3,3])");
  EXPECT_THROW_WITH(conv2d_backward(Tensor(), Tensor(), Tensor(), y, x, w,
                                    make_params(1, 1, 0, 0, 1, 1, 4), stream()),
                    ShapeError, "conv2d: 4 groups do not divide the input's 6 channels");
  EXPECT_THROW_WITH(
      conv2d_forward(y, x, w, Tensor(), make_params(1, 1, 0, 0, 1, 1, 2), stream()), ShapeError,
      "conv2d: input has 6 channels but weight expects 4 (2 per group x 2 groups) (input "
      "float32[2,6,5,5], weight float32[4,2,3,3])");
  EXPECT_THROW_WITH(conv2d_forward(y, x, w, Tensor(), make_params(1, 1, 0, 0, 1, 1, 0), stream()),
                    InvalidArgument, "conv2d: groups must be positive, got 0");
}

// float64 on the CPU: each path against the reference to double rounding.
TEST(Conv2dGroupedFloat64, MatchesTheReference) {
  const Stream& cpu = default_stream(Device::cpu());
  unsigned seed = 40;
  for (const ConvCase& k : grouped_cases()) {
    SCOPED_TRACE(k.name);
    Tensor x = random_double_tensor(k.x_shape(), ++seed);
    Tensor w = random_double_tensor(k.w_shape(), ++seed);
    Tensor b = random_double_tensor({k.K}, ++seed);
    Tensor g = random_double_tensor(k.y_shape(), ++seed);
    const auto xv = x.to_host<double>(cpu), wv = w.to_host<double>(cpu);
    const auto bv = b.to_host<double>(cpu), gv = g.to_host<double>(cpu);
    const Reference ref = reference(k, xv, wv, bv, gv);
    Tensor y = Tensor::empty(k.y_shape(), cpu, DType::Float64);
    conv2d_forward(y, x, w, k.bias ? b : Tensor(), k.params, cpu);
    Tensor grad_x = Tensor::zeros(k.x_shape(), cpu, DType::Float64);
    Tensor grad_w = Tensor::zeros(k.w_shape(), cpu, DType::Float64);
    Tensor grad_b = Tensor::zeros({k.K}, cpu, DType::Float64);
    conv2d_backward(grad_x, grad_w, grad_b, g, x, w, k.params, cpu);
    auto close = [](const std::vector<double>& a, const std::vector<double>& e) {
      bool ok = a.size() == e.size();
      for (std::size_t i = 0; ok && i < a.size(); ++i) ok = std::fabs(a[i] - e[i]) <= 1e-12;
      return ok;
    };
    EXPECT_TRUE(close(y.to_host<double>(cpu), ref.y)) << "y";
    EXPECT_TRUE(close(grad_x.to_host<double>(cpu), ref.grad_x)) << "grad_x";
    EXPECT_TRUE(close(grad_w.to_host<double>(cpu), ref.grad_w)) << "grad_weight";
    EXPECT_TRUE(close(grad_b.to_host<double>(cpu), ref.grad_b)) << "grad_bias";
  }
}

// Central differences of L = sum(g * conv2d(x, w, b)) against the backward, in float64.
TEST(Conv2dGroupedGradient, MatchesCentralDifferences) {
  for (const ConvCase& k :
       {ConvCase{"g2", 2, 4, 5, 6, 4, 3, 3, make_params(1, 1, 1, 1, 1, 1, 2)},
        ConvCase{"g4_stride2", 1, 4, 7, 6, 8, 3, 3, make_params(2, 2, 1, 0, 1, 1, 4)},
        ConvCase{"depthwise", 2, 3, 6, 5, 3, 3, 3, make_params(1, 1, 1, 1, 1, 1, 3)},
        ConvCase{"depthwise_x2_dilation2", 1, 2, 8, 7, 4, 3, 2,
                 make_params(2, 1, 1, 1, 2, 2, 2)}}) {
    expect_gradients_match(k);
  }
}

TEST(Conv2dGroupedLayer, DeclaresTheGroupedWeightAndRefusesBadGroups) {
  VariableSet vars;
  const Conv2d depthwise(vars, "dw", 8, 16, 3, Conv2dParams{.pad_h = 1, .pad_w = 1, .groups = 8});
  ASSERT_EQ(vars.specs().front().name, "dw/weight");
  EXPECT_EQ(vars.specs().front().shape, (Shape{16, 1, 3, 3}));
  EXPECT_EQ(depthwise.describe(), "dw: Conv2d 8->16 3x3 stride 1 pad 1 groups 8");
  EXPECT_THROW_WITH(Conv2d(vars, "bad", 6, 8, 3, Conv2dParams{.groups = 4}), InvalidArgument,
                    "Conv2d bad: 4 groups must divide both 6 input and 8 output channels");
}

// For tests/ops_vs_torch_test.py (family conv2d_grouped): per backend and dtype and
// case, x, weight, bias, grad_y, the parameters as [stride_h, stride_w, pad_h, pad_w,
// dilation_h, dilation_w, groups], then y and the three gradients (from zeros).
TEST(Conv2dGroupedVsTorch, WritesCases) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const TorchCaseBackend& backend : torch_case_backends()) {
    const Stream& stream = backend.stream();
    unsigned seed = 60;
    for (const ConvCase& k : grouped_cases()) {
      const Conv2dParams& p = k.params;
      const Tensor x =
          backend.make(random_values(std::size_t(numel_of(k.x_shape())), ++seed), k.x_shape());
      const Tensor w =
          backend.make(random_values(std::size_t(numel_of(k.w_shape())), ++seed), k.w_shape());
      const Tensor b = backend.make(random_values(std::size_t(k.K), ++seed), {k.K});
      const Tensor grad_y =
          backend.make(random_values(std::size_t(numel_of(k.y_shape())), ++seed), k.y_shape());
      const Tensor params =
          backend.make({float(p.stride_h), float(p.stride_w), float(p.pad_h), float(p.pad_w),
                        float(p.dilation_h), float(p.dilation_w), float(p.groups)},
                       {7});
      const Tensor y = Tensor::empty(k.y_shape(), stream, backend.dtype);
      conv2d_forward(y, x, w, b, p, stream);
      const Tensor grad_x = Tensor::zeros(k.x_shape(), stream, backend.dtype);
      const Tensor grad_w = Tensor::zeros(k.w_shape(), stream, backend.dtype);
      const Tensor grad_b = Tensor::zeros({k.K}, stream, backend.dtype);
      conv2d_backward(grad_x, grad_w, grad_b, grad_y, x, w, p, stream);
      for (const auto& [name, t] :
           std::vector<std::pair<std::string, Tensor>>{{"x", x},
                                                       {"weight", w},
                                                       {"bias", b},
                                                       {"grad_y", grad_y},
                                                       {"params", params},
                                                       {"y", y},
                                                       {"grad_x", grad_x},
                                                       {"grad_weight", grad_w},
                                                       {"grad_bias", grad_b}}) {
        out.emplace_back(backend.prefix + k.name + "/" + name, t);
      }
    }
  }
  write_torch_cases("conv2d_grouped.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
