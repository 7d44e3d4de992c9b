// Bias add on every backend: by hand, in place, a reference on odd shapes and
// ranks, accumulation into grad_bias, empty tensors, errors, and the gradient; and
// in bfloat16 and float16 (a float32 bias), plain and fused with ReLU, against the
// reference bit for bit.
#include "kernels/bias.h"
#include "cpu_isa.h"
#include "gradcheck.h"
#include "kernels/reference/bias.h"
#include "kernels/reference/relu.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class BiasTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(BiasTest);

TEST_P(BiasTest, ForwardByHand) {
  Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3});  // [N=2, C=3]
  Tensor y = Tensor::empty({2, 3}, stream());
  bias_add_forward(y, x, make({10, 20, 30}, {3}), stream());
  EXPECT_EQ(host(y), (std::vector<float>{11, 22, 33, 14, 25, 36}));

  Tensor img = make({1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 2, 2});   // [N=1, C=2, H=2, W=2]
  bias_add_forward(img, img, make({-1, 100}, {2}), stream());  // in place
  EXPECT_EQ(host(img), (std::vector<float>{0, 1, 2, 3, 105, 106, 107, 108}));
}

TEST_P(BiasTest, BackwardAccumulatesSums) {
  Tensor grad_y = make({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 2, 3});  // [N=2, C=2, S=3]
  Tensor grad_bias = make({0.5f, -0.5f}, {2});                               // sentinel
  bias_add_backward(grad_bias, grad_y, stream());
  // Channel 0: 1+2+3 + 7+8+9 = 30; channel 1: 4+5+6 + 10+11+12 = 48.
  EXPECT_EQ(host(grad_bias), (std::vector<float>{30.5f, 47.5f}));
}

TEST_P(BiasTest, MatchesReferenceOnOddShapes) {
  const std::vector<Shape> shapes = {{1, 1},          {7, 13},           {3, 5, 7, 11}, {2, 3, 5},
                                     {2, 3, 2, 3, 5}, {128, 32, 28, 28}, {1000, 37}};
  for (const Shape& shape : shapes) {
    const std::int64_t N = shape[0], C = shape[1], S = numel_of(shape) / (N * C);
    const auto n = static_cast<std::size_t>(numel_of(shape));
    const auto xv = random_values(n, 1), bv = random_values(C, 2);
    // The reference (kernels/reference/bias.h): the forward in float32, the sums in
    // double onto the sentinel 1.
    std::vector<float> expected(n);
    reference::bias_add_forward(expected.data(), xv.data(), bv.data(), N, C, S);
    const std::vector<double> x64(xv.begin(), xv.end());
    std::vector<double> sums(C, 1.0);
    reference::bias_add_backward(sums.data(), x64.data(), N, C, S);
    Tensor x = make(xv, shape), y = Tensor::empty(shape, stream());
    bias_add_forward(y, x, make(bv, {C}), stream());
    EXPECT_EQ(host(y), expected) << to_string(shape);
    Tensor grad_bias = make(std::vector<float>(C, 1.0f), {C});
    bias_add_backward(grad_bias, x, stream());
    std::vector<float> expected_gb;
    for (double s : sums) expected_gb.push_back(static_cast<float>(s));
    EXPECT_TRUE(all_close(host(grad_bias), expected_gb, 1e-4, 1e-5)) << to_string(shape);
  }
}

// A linear layer's [N,C] (S = 1): the CPU sums each channel's rows in order, as the
// reference does, reading along the rows sixteen channels at a time: the reference's
// bits, on channel counts below, at and past one group of sixteen and over threads'
// ranges, with a control that leaves a row out.
TEST(BiasCpu, LinearRowsGiveTheReferenceBits) {
  for (const Shape& shape : std::vector<Shape>{{1, 1}, {7, 13}, {5, 16}, {9, 17}, {3136, 128}}) {
    const std::int64_t N = shape[0], C = shape[1];
    const auto values = random_values(static_cast<std::size_t>(N * C), 4);
    std::vector<float> expected(C, 0.5f);
    reference::bias_add_backward(expected.data(), values.data(), N, C, 1);
    Tensor grad_bias = Tensor::from_host<float>(std::vector<float>(C, 0.5f), {C}, cpu());
    bias_add_backward(grad_bias, Tensor::from_host<float>(values, shape, cpu()), cpu());
    EXPECT_EQ(bits(grad_bias.to_host<float>(cpu())), bits(expected)) << to_string(shape);
    if (N > 1000) {  // control: without the last row the sums differ
      std::vector<float> control(C, 0.5f);
      reference::bias_add_backward(control.data(), values.data(), N - 1, C, 1);
      EXPECT_NE(bits(control), bits(expected));
    }
  }
}

// The CPU's float32 forward runs in vector lanes along whichever dimension is
// contiguous (the channels of a linear layer's [N,C], each channel's run of S
// otherwise): the reference's bits on every ISA, at widths below, at and past a
// group of lanes, out of place and in place. The control: a bias changed in its
// last channel changes the bits.
TEST(BiasCpu, Float32LanesGiveTheReferenceBits) {
  const std::vector<Shape> shapes = {{1, 1},     {3, 7},     {5, 8},        {4, 17},
                                     {6, 64},    {2, 3, 5},  {2, 9, 17},    {3, 16, 4, 4},
                                     {3136, 64}, {2, 33, 1}, {7, 5, 31, 1}, {2, 3, 1, 9}};
  for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
    for (const Shape& shape : shapes) {
      const std::int64_t N = shape[0], C = shape[1], S = numel_of(shape) / (N * C);
      const auto n = static_cast<std::size_t>(numel_of(shape));
      const auto xv = random_values(n, unsigned(n), -100.0f, 100.0f);
      auto bv = random_values(std::size_t(C), unsigned(C) + 7);
      std::vector<float> expected(n);
      reference::bias_add_forward(expected.data(), xv.data(), bv.data(), N, C, S);
      Tensor x = Tensor::from_host<float>(xv, shape, cpu()), y = Tensor::empty(shape, cpu());
      const Tensor bias = Tensor::from_host<float>(bv, {C}, cpu());
      bias_add_forward(y, x, bias, cpu());
      EXPECT_EQ(bits(y.to_host<float>(cpu())), bits(expected)) << isa << ", " << to_string(shape);
      bias_add_forward(x, x, bias, cpu());  // in place
      EXPECT_EQ(bits(x.to_host<float>(cpu())), bits(expected))
          << isa << ", in place, " << to_string(shape);
      bv.back() += 1.0f;  // control: the last channel's values move
      std::vector<float> control(n);
      reference::bias_add_forward(control.data(), xv.data(), bv.data(), N, C, S);
      EXPECT_NE(bits(y.to_host<float>(cpu())), bits(control)) << isa << ", " << to_string(shape);
    }
  });
}

// The fused bias add + ReLU's float32 forward runs in the same lanes, each sum then
// through ReLU's "v < 0 ? +0 : v": the reference pair's bits (bias_add_forward, then
// relu_forward) on every ISA, out of place and in place, with NaN, infinities and
// -0 among the inputs and about half the sums negative; the plain bias add's sums
// on the same inputs are the reference's too (a -0 bias kept in every lane). Two
// controls: a ReLU that drops NaN (v > 0 ? v : 0) differs on these inputs, and so
// do the sums without the ReLU.
TEST(BiasCpu, FusedReluFloat32LanesGiveTheReferenceBits) {
  const std::vector<Shape> shapes = {{1, 1},    {3, 7},     {5, 8},        {4, 17},
                                     {64, 512}, {2, 9, 17}, {3, 16, 4, 4}, {7, 5, 31, 1}};
  for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
    for (const Shape& shape : shapes) {
      const std::int64_t N = shape[0], C = shape[1], S = numel_of(shape) / (N * C);
      const auto n = static_cast<std::size_t>(numel_of(shape));
      const auto xv = values_with_specials(n, unsigned(n) + 3);
      auto bv = random_values(std::size_t(C), unsigned(C) + 5);
      // x[3] is -0 (values_with_specials): with a bias of -0 in its channel the sum
      // is -0, which ReLU keeps.
      if (n > 3) bv[std::size_t((3 / S) % C)] = -0.0f;
      std::vector<float> sums(n), expected(n);
      reference::bias_add_forward(sums.data(), xv.data(), bv.data(), N, C, S);
      reference::relu_forward(expected.data(), sums.data(), numel_of(shape));
      Tensor x = Tensor::from_host<float>(xv, shape, cpu()), y = Tensor::empty(shape, cpu());
      const Tensor bias = Tensor::from_host<float>(bv, {C}, cpu());
      bias_add_forward(y, x, bias, cpu());  // the plain add keeps the -0 too
      EXPECT_EQ(bits(y.to_host<float>(cpu())), bits(sums)) << isa << ", " << to_string(shape);
      bias_add_relu_forward(y, x, bias, cpu());
      EXPECT_EQ(bits(y.to_host<float>(cpu())), bits(expected)) << isa << ", " << to_string(shape);
      bias_add_relu_forward(x, x, bias, cpu());  // in place
      EXPECT_EQ(bits(x.to_host<float>(cpu())), bits(expected))
          << isa << ", in place, " << to_string(shape);
      if (n < 6) continue;  // the specials need six values
      std::vector<float> drops_nan(n);
      for (std::size_t i = 0; i < n; ++i) drops_nan[i] = sums[i] > 0.0f ? sums[i] : 0.0f;
      EXPECT_NE(bits(drops_nan), bits(expected)) << "control, " << to_string(shape);
      EXPECT_NE(bits(sums), bits(expected)) << "control, " << to_string(shape);
    }
  });
}

// Views may start at any element: x and y one float past an aligned start take
// CUDA's float path on planes that would go in float4s, with the same results.
TEST_P(BiasTest, MisalignedViewsMatchAligned) {
  const Shape shape = {3, 4, 2, 6};  // S = 12
  const std::int64_t C = 4, n = numel_of(shape);
  const auto xv = random_values(static_cast<std::size_t>(n), 81);
  std::vector<float> padded(xv);
  padded.insert(padded.begin(), 0.0f);
  Tensor x = make(xv, shape), x_view = make(padded, {n + 1}).view(1, shape);
  Tensor bias = make(random_values(C, 82), {C});
  Tensor y = Tensor::empty(shape, stream()),
         y_view = Tensor::zeros({n + 1}, stream()).view(1, shape);
  bias_add_forward(y, x, bias, stream());
  bias_add_forward(y_view, x_view, bias, stream());
  EXPECT_EQ(host(y_view), host(y));
  Tensor grad_bias = Tensor::zeros({C}, stream()), grad_bias_view = Tensor::zeros({C}, stream());
  bias_add_backward(grad_bias, x, stream());
  bias_add_backward(grad_bias_view, x_view, stream());
  EXPECT_TRUE(all_close(host(grad_bias_view), host(grad_bias), 1e-5, 1e-6));
}

TEST_P(BiasTest, EmptyTensors) {
  Tensor x = Tensor::zeros({0, 3, 4, 4}, stream());
  bias_add_forward(x, x, make({1, 2, 3}, {3}), stream());
  Tensor grad_bias = make({1, 2, 3}, {3});
  bias_add_backward(grad_bias, x, stream());
  EXPECT_EQ(host(grad_bias), (std::vector<float>{1, 2, 3}));  // nothing added
}

TEST_P(BiasTest, RejectsBadShapes) {
  Tensor x = Tensor::zeros({2, 3, 4, 4}, stream());
  EXPECT_THROW_WITH(bias_add_forward(x, x, Tensor::zeros({4}, stream()), stream()), ShapeError,
                    "bias_add_forward: bias is float32[4]");
  EXPECT_THROW_WITH(bias_add_forward(x, x, Tensor::zeros({4}, stream()), stream()), ShapeError,
                    "has 3 channels (expected [3])");
  EXPECT_THROW_WITH(bias_add_forward(Tensor::zeros({2, 3, 4, 5}, stream()), x,
                                     Tensor::zeros({3}, stream()), stream()),
                    ShapeError, "y is float32[2,3,4,5]");
  EXPECT_THROW_WITH(
      bias_add_backward(Tensor::zeros({3}, stream()), Tensor::zeros({6}, stream()), stream()),
      ShapeError, "bias_add_backward: grad_y must be [N,C] or [N,C,H,W]");
}

class BiasSixteenBitTest : public SixteenBitTest {};
TL_INSTANTIATE_SIXTEEN_BIT(BiasSixteenBitTest);

// The shapes of the 16-bit cases: a plane in float4 units ({2,3,4,4}), an odd one,
// [N,C] with few rows (CUDA's column kernel) and with many (its per-channel split).
const std::vector<Shape> kSixteenBitShapes = {{2, 3, 4, 4}, {3, 5, 7, 11}, {7, 13}, {2100, 3}};

// y = round(x + bias), the float32 sum rounded once, and the fused ReLU of it: the
// reference's bits. The control: a kernel that rounded the bias to 16 bits first
// (a second rounding) would give other bits, and the comparison sees them.
TEST_P(BiasSixteenBitTest, ForwardAndFusedReluAreTheReferenceBitForBit) {
  for (const Shape& shape : kSixteenBitShapes) {
    const std::int64_t N = shape[0], C = shape[1], S = numel_of(shape) / (N * C);
    const auto xv = values_with_specials(static_cast<std::size_t>(numel_of(shape)), 21);
    const auto bv = random_values(static_cast<std::size_t>(C), 22);
    Tensor x = make(xv, shape), bias = make32(bv, {C});
    Tensor y = Tensor::empty(shape, stream(), dtype()), z = Tensor::empty(shape, stream(), dtype());
    bias_add_forward(y, x, bias, stream());
    bias_add_relu_forward(z, x, bias, stream());
    typed([&]<typename T>() {
      const std::vector<T> x16 = narrow<T>(xv);
      std::vector<T> expected(x16.size()), relu(x16.size()), twice(x16.size());
      reference::bias_add_forward(expected.data(), x16.data(), bv.data(), N, C, S);
      reference::relu_forward(relu.data(), expected.data(), numel_of(shape));
      EXPECT_EQ(bits(host(y)), bits(widen(expected))) << to_string(shape);
      EXPECT_EQ(bits(host(z)), bits(widen(relu))) << to_string(shape);
      const std::vector<float> b16 = widen(narrow<T>(bv));
      reference::bias_add_forward(twice.data(), x16.data(), b16.data(), N, C, S);
      EXPECT_NE(bits(widen(twice)), bits(host(y))) << "control, " << to_string(shape);
    });
  }
}

// grad_bias (float32, a sentinel of 1) += the per-channel sums of the 16-bit grad_y;
// fused with ReLU, grad_x (a 16-bit sentinel) += the masked gradient, rounded once,
// the reference's bits, and grad_bias sums the masked values.
TEST_P(BiasSixteenBitTest, BackwardAddsFloat32SumsAndRoundsGradXOnce) {
  for (const Shape& shape : kSixteenBitShapes) {
    const std::int64_t N = shape[0], C = shape[1], S = numel_of(shape) / (N * C),
                       n = numel_of(shape);
    const auto n_values = static_cast<std::size_t>(n);
    const auto yv = random_values(n_values, 23), gyv = random_values(n_values, 24);
    const auto sentinel = random_values(n_values, 25, -8.0f, 8.0f);
    Tensor y = make(yv, shape), grad_y = make(gyv, shape), grad_x = make(sentinel, shape);
    Tensor grad_bias = make32(std::vector<float>(C, 1.0f), {C});
    Tensor fused_bias = make32(std::vector<float>(C, 1.0f), {C});
    bias_add_backward(grad_bias, grad_y, stream());
    bias_add_relu_backward(grad_x, fused_bias, grad_y, y, stream());
    typed([&]<typename T>() {
      const std::vector<T> y16 = narrow<T>(yv), gy16 = narrow<T>(gyv);
      std::vector<float> sums(C, 1.0f), masked_sums(C, 1.0f);
      reference::bias_add_backward(sums.data(), gy16.data(), N, C, S);
      std::vector<T> masked(n_values), gx = narrow<T>(sentinel);
      reference::relu_backward(masked.data(), gy16.data(), y16.data(), n, GradWrite::Assign);
      reference::relu_backward(gx.data(), gy16.data(), y16.data(), n, GradWrite::Accumulate);
      reference::bias_add_backward(masked_sums.data(), masked.data(), N, C, S);
      EXPECT_TRUE(all_close(host(grad_bias), sums, 1e-4, 1e-5)) << to_string(shape);
      EXPECT_TRUE(all_close(host(fused_bias), masked_sums, 1e-4, 1e-5)) << to_string(shape);
      EXPECT_EQ(bits(host(grad_x)), bits(widen(gx))) << to_string(shape);
      EXPECT_NE(bits(widen(gx)), bits(widen(masked))) << "control: added, not assigned";
    });
  }
}

TEST_P(BiasSixteenBitTest, ASixteenBitBiasIsAShapeError) {
  Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor bias16 = make({1, 2, 3}, {3});
  EXPECT_THROW_WITH(bias_add_forward(x, x, bias16, stream()), ShapeError,
                    std::string("bias_add_forward: bias is ") + dtype_name(dtype()) + "[3] on " +
                        device().str() + " but x is " + dtype_name(dtype()) + "[2,3] on " +
                        device().str() + ", whose bias is float32");
  EXPECT_THROW_WITH(bias_add_backward(bias16, x, stream()), ShapeError,
                    "a 16-bit tensor's bias stays float32");
}

TEST(BiasGradient, MatchesCentralDifferences) {
  const Stream& cpu = default_stream(Device::cpu());
  const Shape shape = {3, 4, 2, 3};
  Tensor x = random_double_tensor(shape, 5), bias = random_double_tensor({4}, 6);
  Tensor g = random_double_tensor(shape, 7);
  auto loss = [&](const std::vector<Tensor>& in) {
    Tensor y = Tensor::empty(shape, cpu, DType::Float64);
    bias_add_forward(y, in[0], in[1], cpu);
    return weighted_sum(g, y);
  };
  // dL/dx = g (passes straight through); dL/dbias from the backward.
  Tensor grad_bias = Tensor::zeros({4}, cpu, DType::Float64);
  bias_add_backward(grad_bias, g, cpu);
  EXPECT_TRUE(check_gradient(loss, {x, bias}, {g.clone(cpu), grad_bias}));
}

// CUDA against the CPU on larger odd shapes (skips without a GPU).
TEST(BiasCudaVsCpu, ForwardAndBackward) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // float4 planes, odd planes, and [N, C] matrices with few rows (the column
  // kernel) and with many (the per-channel split).
  for (const Shape& shape : std::vector<Shape>{
           {128, 64, 14, 14}, {5, 3, 4, 6}, {33, 7, 13, 17}, {1000, 37}, {128, 1024}, {3000, 10}}) {
    const std::int64_t C = shape[1];
    const auto xv = random_values(static_cast<std::size_t>(numel_of(shape)), 70);
    const auto bv = random_values(static_cast<std::size_t>(C), 71);
    std::vector<std::vector<float>> results[2];
    for (int k = 0; k < 2; ++k) {
      Stream stream(k == 0 ? Device::cpu() : Device::cuda(0));
      Tensor x = Tensor::from_host<float>(xv, shape, stream);
      Tensor bias = Tensor::from_host<float>(bv, {C}, stream);
      Tensor y = Tensor::empty(shape, stream);
      bias_add_forward(y, x, bias, stream);
      bias_add_backward(bias, x, stream);  // accumulates onto the bias values
      results[k].push_back(y.to_host<float>(stream));
      results[k].push_back(bias.to_host<float>(stream));
    }
    EXPECT_EQ(results[1][0], results[0][0]) << to_string(shape);
    EXPECT_TRUE(all_close(results[1][1], results[0][1], 1e-3, 1e-5)) << to_string(shape);
  }
}

}  // namespace
}  // namespace towerlab::testing
