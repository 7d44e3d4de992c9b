// conv2d forward and backward on every backend: hand-computed cases, a naive
// seven-loop reference on odd shapes (1x1 and 5x5 kernels, ragged strided
// borders, dilation, C = 1 (the CPU's direct path), prime K, shapes that are not
// multiples of the CUDA tiles), accumulation into sentinel-filled gradients, empty
// batches, rejected shapes, the CUDA kernels against the CPU on full-GPU layers, and
// float64 gradient checks on the CPU. The CPU's own paths on every ISA are in
// conv2d_cpu_paths_test.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "conv2d_case.h"
#include "gradcheck.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

std::vector<ConvCase> odd_cases() {
  return {
      {"1x1", 3, 4, 5, 7, 5, 1, 1, make_params(1, 1, 0, 0)},
      {"1x1_stride2_pad1", 2, 3, 6, 5, 4, 1, 1, make_params(2, 2, 1, 1), false},
      {"5x5_pad2", 1, 3, 11, 9, 7, 5, 5, make_params(1, 1, 2, 2)},
      {"5x5_no_pad_no_bias", 3, 2, 9, 8, 3, 5, 5, make_params(1, 1, 0, 0), false},
      {"3x3_stride2_ragged", 3, 3, 10, 9, 5, 3, 3, make_params(2, 2, 1, 1)},
      {"3x5_stride2x1_pad0x2", 2, 2, 9, 7, 3, 3, 5, make_params(2, 1, 0, 2)},
      {"3x3_dilation2", 2, 3, 9, 8, 5, 3, 3, make_params(1, 1, 2, 2, 2, 2)},
      {"3x3_stride3_dilation2", 1, 2, 13, 11, 3, 3, 3, make_params(3, 3, 1, 0, 2, 2)},
      {"C1_K32", 3, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
      // One channel, 3x3, unit stride: the CPU's direct path (Q >= 8), with Q not a
      // multiple of 8, K not of 4, uneven padding, and Q = 8 exactly.
      {"C1_3x3_pad1x0_K5_no_bias", 2, 1, 9, 19, 5, 3, 3, make_params(1, 1, 1, 0), false},
      {"C1_3x3_Q8", 2, 1, 6, 10, 3, 3, 3, make_params(1, 1, 0, 0)},
      // One channel on CUDA's direct kernels: strides and dilation that leave input
      // pixels no tap reaches, and more channels than one block of them (32).
      {"C1_stride2x1_dilation2x1", 2, 1, 13, 12, 6, 3, 3, make_params(2, 1, 1, 2, 2, 1)},
      {"C1_2x2_K37", 3, 1, 9, 10, 37, 2, 2, make_params(1, 1, 0, 1)},
      // Channels a multiple of 8 both ways: CUDA's channel-inner reduction order,
      // through strides and dilation.
      {"C8_K16_stride2x1_dilation2x1", 2, 8, 11, 10, 16, 3, 3, make_params(2, 1, 1, 2, 2, 1)},
      {"K_prime_13", 3, 2, 7, 7, 13, 3, 3, make_params(1, 1, 1, 1)},
      {"batch1_odd", 1, 5, 13, 15, 11, 3, 3, make_params(1, 1, 1, 1), false},
      {"tiles_ragged", 5, 19, 17, 17, 67, 3, 3, make_params(1, 1, 1, 1)},
      {"C32_K64_14x14", 2, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
      // CUDA's pipelined channel-inner kernel on ragged row and column tiles through a
      // stride (40 forward columns, 24 backward-data), and FashionNet's 5x5 layer.
      {"C24_K40_stride2_ragged", 3, 24, 11, 13, 40, 3, 3, make_params(2, 2, 1, 1)},
      {"C32_K64_5x5_pad2", 2, 32, 14, 14, 64, 5, 5, make_params(1, 1, 2, 2)},
      // 3x3, unit stride, K a multiple of 32: the implicit weight gradient on AVX-512
      // (no padding; 784 pixels, more than one block of the GEMM's inner dimension).
      {"3x3_pad0_K32", 2, 3, 7, 9, 32, 3, 3, make_params(1, 1, 0, 0)},
      {"3x3_28x28_K32", 1, 2, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1), false},
      {"C67_K130_stride2", 2, 67, 9, 9, 130, 3, 3, make_params(2, 2, 1, 1)},
      // Batches that the CPU backward splits into 16 weight-gradient groups of 9 or
      // 10 images, both gradients in one pass over each group.
      {"batch150_groups", 150, 3, 6, 5, 4, 3, 3, make_params(1, 1, 1, 1)},
      {"1x1_batch147_groups", 147, 4, 3, 5, 6, 1, 1, make_params(1, 1, 0, 0), false},
  };
}

class Conv2dTest : public ConvBackendTest {};
TL_INSTANTIATE_BACKENDS(Conv2dTest);

TEST_P(Conv2dTest, HandComputedPaddedForward) {
  // x = [1 2; 3 4], weight = [1 2; 3 4], padding 1: every overlap of the two grids.
  Tensor x = make({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor w = make({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor b = make({1}, {1});
  Tensor y = Tensor::empty({1, 1, 3, 3}, stream());
  conv2d_forward(y, x, w, b, make_params(1, 1, 1, 1), stream());
  EXPECT_EQ(host(y), (std::vector<float>{5, 12, 7, 15, 31, 15, 7, 12, 5}));
}

TEST_P(Conv2dTest, HandComputedStridedForward) {
  std::vector<float> values(16);
  for (int i = 0; i < 16; ++i) values[static_cast<std::size_t>(i)] = static_cast<float>(i);
  Tensor x = make(values, {1, 1, 4, 4});
  Tensor w = make({2}, {1, 1, 1, 1});
  Tensor y = Tensor::empty({1, 1, 2, 2}, stream());
  conv2d_forward(y, x, w, Tensor(), make_params(2, 2, 0, 0), stream());
  EXPECT_EQ(host(y), (std::vector<float>{0, 4, 16, 20}));
}

TEST_P(Conv2dTest, HandComputedBackwardAccumulates) {
  // With grad_y = 1 everywhere each input pixel meets every kernel tap once and
  // each tap meets every pixel once: grad_x = sum(w), grad_w = sum(x), grad_b = 9.
  Tensor x = make({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor w = make({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor grad_y = make(std::vector<float>(9, 1.0f), {1, 1, 3, 3});
  Tensor grad_x = make({10, 10, 10, 10}, {1, 1, 2, 2});  // sentinels: must be added to
  Tensor grad_w = make({-1, -1, -1, -1}, {1, 1, 2, 2});
  Tensor grad_b = make({100}, {1});
  conv2d_backward(grad_x, grad_w, grad_b, grad_y, x, w, make_params(1, 1, 1, 1), stream());
  EXPECT_EQ(host(grad_x), (std::vector<float>{20, 20, 20, 20}));
  EXPECT_EQ(host(grad_w), (std::vector<float>{9, 9, 9, 9}));
  EXPECT_EQ(host(grad_b), (std::vector<float>{109}));
}

// y and grad_x within 3e-4 absolute: the CPU computes C32_K64_14x14's forward and
// input gradient with Winograd F(4x4,3x3), which rounds within some tens of float32
// roundings u of sum |w||x| (kernels/cpu/winograd.h), here about 72: up to 64 u is
// 2.7e-4. The other paths stay within 1e-4.
TEST_P(Conv2dTest, MatchesNaiveReferenceOnOddShapes) {
  expect_reference_with_sentinels(odd_cases(), 100,
                                  {3e-4, 1e-4, 3e-4, 1e-4, 2e-4, 1e-4, 2e-4, 1e-4});
}

// GradWrite::Assign on the odd shapes and the CPU's 3x3, 1x1 and Winograd paths.
TEST_P(Conv2dTest, AssignedGradXIsAccumulatingOntoZeros) {
  std::vector<ConvCase> cases = odd_cases();
  cases.push_back({"3x3_pad1_flat", 3, 5, 14, 14, 6, 3, 3, make_params(1, 1, 1, 1)});
  cases.push_back({"1x1_in_place", 2, 4, 5, 7, 3, 1, 1, make_params(1, 1, 0, 0)});
  // Winograd's backward-data on the CPU (Auto: 16 channels or more), both paddings.
  cases.push_back({"winograd_pad0", 2, 16, 9, 11, 16, 3, 3, make_params(1, 1, 0, 0)});
  cases.push_back({"winograd_pad1", 2, 16, 7, 10, 17, 3, 3, make_params(1, 1, 1, 1)});
  expect_assign_is_accumulating_onto_zeros(cases, 900);
}

TEST_P(Conv2dTest, WritesThroughUnalignedViews) {
  // Outputs that start one float into their storage: the CUDA kernels must fall
  // back from 16-byte vector stores.
  const ConvCase k{"", 2, 3, 8, 8, 5, 3, 3, make_params(1, 1, 1, 1)};
  const Shape ys = k.y_shape();
  const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), 31);
  const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), 32);
  const auto bv = random_values(5, 33);
  const auto gv = random_values(static_cast<std::size_t>(numel_of(ys)), 34);
  const Reference ref = reference(k, widen(xv), widen(wv), widen(bv), widen(gv));
  Tensor x = make(xv, k.x_shape()), w = make(wv, k.w_shape()), b = make(bv, {5});
  Tensor y_storage = Tensor::zeros({numel_of(ys) + 1}, stream());
  Tensor y = y_storage.view(1, ys);
  conv2d_forward(y, x, w, b, k.params, stream());
  EXPECT_TRUE(all_close(host(y), narrow(ref.y), 1e-4, 1e-4));
  Tensor gx_storage = Tensor::zeros({numel_of(k.x_shape()) + 1}, stream());
  Tensor grad_x = gx_storage.view(1, k.x_shape());
  conv2d_backward(grad_x, Tensor(), Tensor(), make(gv, ys), x, w, k.params, stream());
  EXPECT_TRUE(all_close(host(grad_x), narrow(ref.grad_x), 1e-4, 1e-4));
}

// Shapes big enough for the CUDA implicit GEMM's largest tiles and split reductions
// on a full GPU (pixel rows in the tens of thousands), checked against the CPU
// backend. Both backends are pinned to im2col / the implicit GEMM: Auto would give
// some of these passes to Winograd, whose looser rounding its own test checks
// against a tolerance scaled to the terms (conv2d_winograd_test.cpp).
TEST_P(Conv2dTest, CudaMatchesCpuOnLargeLayers) {
  if (device().is_cpu()) GTEST_SKIP() << "compares the CUDA kernels with the CPU backend";
  const cpu::ScopedConv2dAlgorithm gemm_only(Conv2dAlgorithm::Im2col);
  const Stream& cpu = default_stream(Device::cpu());
  const std::vector<ConvCase> cases = {
      {"C40_K96_64x64", 9, 40, 64, 64, 96, 3, 3, make_params(1, 1, 1, 1)},
      {"C5_K64_110x110", 3, 5, 110, 110, 64, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion2_b128", 128, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion1_b128", 128, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion1_b512", 512, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion1_b37", 37, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
  };
  unsigned seed = 500;
  for (const ConvCase& k : cases) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), ++seed);
    const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), ++seed);
    const auto bv = random_values(static_cast<std::size_t>(k.K), ++seed);
    const auto gv = random_values(static_cast<std::size_t>(numel_of(ys)), ++seed);
    auto run = [&](const Stream& on) {
      auto put = [&](const std::vector<float>& v, const Shape& shape) {
        return Tensor::from_host<float>(v, shape, on);
      };
      Tensor x = put(xv, k.x_shape()), w = put(wv, k.w_shape()), b = put(bv, {k.K});
      Tensor y = Tensor::empty(ys, on), grad_y = put(gv, ys);
      Tensor grad_x = Tensor::zeros(k.x_shape(), on), grad_w = Tensor::zeros(k.w_shape(), on);
      Tensor grad_b = Tensor::zeros({k.K}, on);
      conv2d_forward(y, x, w, b, k.params, on);
      conv2d_backward(grad_x, grad_w, grad_b, grad_y, x, w, k.params, on);
      return std::vector<std::vector<float>>{y.to_host<float>(on), grad_x.to_host<float>(on),
                                             grad_w.to_host<float>(on), grad_b.to_host<float>(on)};
    };
    const auto expected = run(cpu);
    const auto actual = run(stream());
    EXPECT_TRUE(all_close(actual[0], expected[0], 1e-4, 1e-4)) << "y";
    EXPECT_TRUE(all_close(actual[1], expected[1], 1e-4, 1e-4)) << "grad_x";
    // Sums over up to 10^5 terms: float rounding differs between the two orders.
    EXPECT_TRUE(all_close(actual[2], expected[2], 2e-3, 1e-4)) << "grad_weight";
    EXPECT_TRUE(all_close(actual[3], expected[3], 2e-3, 1e-4)) << "grad_bias";
  }
}

// Backward-weight on FashionNet's layers, whose few output tiles make the CUDA
// kernel split the reduction over (image, pixel) ranges (79 splits for fashion2
// at 132 SMs: the two-stage reduction): run twice into the same sentinel, the
// accumulated grad_weight must have the same bits (a fixed reduction order). The
// implicit GEMM is pinned: Auto gives fashion2's weight gradient to Winograd, whose
// bits conv2d_winograd_test.cpp checks the same way.
TEST_P(Conv2dTest, CudaBackwardWeightRepeatsTheBits) {
  if (device().is_cpu()) GTEST_SKIP() << "CUDA-only: the split backward-weight";
  const cpu::ScopedConv2dAlgorithm gemm_only(Conv2dAlgorithm::Im2col);
  for (const ConvCase& k :
       {ConvCase{"fashion1_b128", 128, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1), false},
        ConvCase{"fashion2_b128", 128, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1), false}}) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    Tensor x =
        make(random_values(static_cast<std::size_t>(numel_of(k.x_shape())), 71), k.x_shape());
    Tensor grad_y = make(random_values(static_cast<std::size_t>(numel_of(ys)), 72), ys);
    Tensor w = Tensor::zeros(k.w_shape(), stream());
    const auto sentinel = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), 73);
    auto run = [&] {
      Tensor grad_w = make(sentinel, k.w_shape());
      conv2d_backward(Tensor(), grad_w, Tensor(), grad_y, x, w, k.params, stream());
      return host(grad_w);
    };
    const auto first = run();
    EXPECT_NE(first, sentinel);
    EXPECT_EQ(run(), first);
  }
}

TEST_P(Conv2dTest, ComputesOnlyRequestedGradients) {
  const ConvCase k{"", 2, 3, 6, 6, 4, 3, 3, make_params(1, 1, 1, 1)};
  const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), 1);
  const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), 2);
  const auto gv = random_values(static_cast<std::size_t>(numel_of(k.y_shape())), 3);
  const Reference ref = reference(k, widen(xv), widen(wv), std::vector<double>(4, 0.0), widen(gv));
  Tensor x = make(xv, k.x_shape()), w = make(wv, k.w_shape()), grad_y = make(gv, k.y_shape());

  Tensor grad_w = Tensor::zeros(k.w_shape(), stream());
  conv2d_backward(Tensor(), grad_w, Tensor(), grad_y, x, w, k.params, stream());
  EXPECT_TRUE(all_close(host(grad_w), narrow(ref.grad_w), 1e-4, 1e-4));

  Tensor grad_x = Tensor::zeros(k.x_shape(), stream());
  conv2d_backward(grad_x, Tensor(), Tensor(), grad_y, x, w, k.params, stream());
  EXPECT_TRUE(all_close(host(grad_x), narrow(ref.grad_x), 1e-4, 1e-4));

  Tensor grad_b = Tensor::zeros({4}, stream());
  conv2d_backward(Tensor(), Tensor(), grad_b, grad_y, x, w, k.params, stream());
  EXPECT_TRUE(all_close(host(grad_b), narrow(ref.grad_b), 1e-4, 1e-4));
}

TEST_P(Conv2dTest, EmptyBatchIsANoOp) {
  Tensor x = Tensor::zeros({0, 3, 5, 5}, stream());
  Tensor w = make(random_values(4 * 3 * 9, 5), {4, 3, 3, 3});
  Tensor y = Tensor::zeros({0, 4, 5, 5}, stream());
  conv2d_forward(y, x, w, Tensor(), make_params(1, 1, 1, 1), stream());
  Tensor grad_w = make(std::vector<float>(4 * 3 * 9, 3.0f), {4, 3, 3, 3});
  Tensor grad_b = make({1, 2, 3, 4}, {4});
  Tensor grad_x = Tensor::zeros({0, 3, 5, 5}, stream());
  conv2d_backward(grad_x, grad_w, grad_b, y, x, w, make_params(1, 1, 1, 1), stream());
  EXPECT_EQ(host(grad_w), std::vector<float>(4 * 3 * 9, 3.0f));
  EXPECT_EQ(host(grad_b), (std::vector<float>{1, 2, 3, 4}));
}

TEST_P(Conv2dTest, RejectsBadShapesWithClearMessages) {
  Tensor x = Tensor::zeros({2, 3, 8, 8}, stream());
  Tensor w = Tensor::zeros({32, 1, 3, 3}, stream());
  Tensor y = Tensor::zeros({2, 32, 8, 8}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y, x, w, Tensor(), make_params(1, 1, 1, 1), stream()),
                    ShapeError,
                    "conv2d: input has 3 channels but weight expects 1 (input float32[2,3,8,8], "
                    "weight float32[32,1,3,3])");

  Tensor small = Tensor::zeros({1, 1, 4, 4}, stream());
  Tensor w5 = Tensor::zeros({1, 1, 5, 5}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y, small, w5, Tensor(), {}, stream()), ShapeError,
                    "conv2d: kernel 5x5 is larger than the padded input 4x4");
  Tensor w3 = Tensor::zeros({1, 1, 3, 3}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y, small, w3, Tensor(), make_params(1, 1, 0, 0, 2, 2), stream()),
                    ShapeError,
                    "conv2d: kernel 3x3 (dilated to 5x5) is larger than the padded input 4x4");
  EXPECT_THROW_WITH(conv2d_forward(y, small, w3, Tensor(), make_params(0, 1, 1, 1), stream()),
                    InvalidArgument, "conv2d: stride must be positive, got 0x1");
  EXPECT_THROW_WITH(conv2d_forward(y, small, w3, Tensor(), make_params(1, 1, -1, 0), stream()),
                    InvalidArgument, "conv2d: padding must not be negative");

  Tensor y_wrong = Tensor::zeros({1, 1, 3, 3}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y_wrong, small, w3, Tensor(), {}, stream()), ShapeError,
                    "conv2d_forward: y is float32[1,1,3,3] but should be [1,1,2,2]");
  Tensor y_ok = Tensor::zeros({1, 1, 2, 2}, stream());
  Tensor bias_wrong = Tensor::zeros({2}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y_ok, small, w3, bias_wrong, {}, stream()), ShapeError,
                    "conv2d_forward: bias is float32[2] but should be [1]");
  Tensor flat = Tensor::zeros({16}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y_ok, flat, w3, Tensor(), {}, stream()), ShapeError,
                    "conv2d: input must be 4-D [N,C,H,W] but is float32[16]");

  Tensor grad_w_wrong = Tensor::zeros({1, 1, 2, 2}, stream());
  EXPECT_THROW_WITH(
      conv2d_backward(Tensor(), grad_w_wrong, Tensor(), y_ok, small, w3, {}, stream()), ShapeError,
      "conv2d_backward: grad_weight is float32[1,1,2,2] but should be [1,1,3,3]");
  EXPECT_THROW_WITH(conv2d_backward(Tensor(), Tensor(), Tensor(), y_wrong, small, w3, {}, stream()),
                    ShapeError,
                    "conv2d_backward: grad_y is float32[1,1,3,3] but should be [1,1,2,2]");
}

TEST(Conv2dShape, OutputShapeFollowsTheFormula) {
  EXPECT_EQ(conv2d_output_shape({128, 1, 28, 28}, {32, 1, 3, 3}, make_params(1, 1, 1, 1)),
            (Shape{128, 32, 28, 28}));
  EXPECT_EQ(conv2d_output_shape({2, 3, 10, 9}, {5, 3, 3, 3}, make_params(2, 2, 1, 1)),
            (Shape{2, 5, 5, 5}));
  EXPECT_EQ(conv2d_output_shape({1, 1, 9, 8}, {1, 1, 3, 3}, make_params(1, 1, 2, 2, 2, 2)),
            (Shape{1, 1, 9, 8}));
  EXPECT_THROW_WITH(conv2d_output_shape({1, 3, 8, 8}, {4, 2, 3, 3}, {}), ShapeError,
                    "conv2d: input has 3 channels but weight expects 2 (input [1,3,8,8], weight "
                    "[4,2,3,3])");
}

// float64 exists on the CPU only (for gradient checks): a CUDA float64 tensor cannot
// be made, so no CUDA kernel ever sees one. (This test once built such tensors and
// expected conv2d to refuse them; it had never run until the emulated GPUs ran it.)
TEST(Conv2dShape, CudaHasNoFloat64Tensors) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Stream stream(Device::cuda(0));
  EXPECT_THROW_WITH(Tensor::zeros({1, 1, 4, 4}, stream, DType::Float64), NotSupported,
                    "float64 tensors live on the CPU only (asked for [1,1,4,4] on cuda:0)");
}

TEST(Conv2dGradient, MatchesCentralDifferences) {
  expect_gradients_match({"3x3_pad1", 2, 3, 5, 6, 4, 3, 3, make_params(1, 1, 1, 1)});
  expect_gradients_match({"3x3_stride2_ragged", 2, 2, 8, 7, 3, 3, 3, make_params(2, 2, 1, 1)});
  expect_gradients_match({"1x1", 2, 3, 4, 5, 2, 1, 1, make_params(1, 1, 0, 0)});
  expect_gradients_match({"5x5_pad2", 1, 2, 6, 7, 3, 5, 5, make_params(1, 1, 2, 2)});
  expect_gradients_match(
      {"3x2_dilation2_stride2x1", 2, 2, 9, 8, 3, 3, 2, make_params(2, 1, 1, 0, 2, 2)});
}

}  // namespace
}  // namespace towerlab::testing
