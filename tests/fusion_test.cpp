// The fused kernels against the unfused compositions they replace, on every
// backend: batch norm + ReLU and bias add + ReLU (forward and backward), max
// pooling through a recorded argmax, and the cross-entropy backward from the
// forward's probabilities; and the backwards that may assign grad_x
// (GradWrite::Assign) against their accumulation into zeros. On the CPU each
// fused result is the unfused one bit for bit (float32 cross-entropy excepted,
// within the bound of kernels/loss.h); every comparison has a control showing it
// would catch a missing mask or a wrong index. Then gradients in float64, and
// FashionNet built with and without the fusions giving the same loss and gradients.
#include <cmath>

#include "batchnorm_args.h"
#include "gradcheck.h"
#include "models/fashion_net.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class FusionTest : public BackendTest {
 protected:
  // Equal on the CPU (the same operations in the same order); to float rounding
  // on CUDA, where the compiler may contract a fused kernel's arithmetic differently.
  void expect_same(const Tensor& fused, const Tensor& unfused, const std::string& what) {
    if (device().is_cpu()) {
      EXPECT_EQ(host(fused), host(unfused)) << what;
    } else {
      EXPECT_TRUE(all_close(host(fused), host(unfused), 1e-6, 1e-5)) << what;
    }
  }
};
TL_INSTANTIATE_BACKENDS(FusionTest);

// The fraction of values that are exactly 0: ReLU's clamped share.
double zero_share(const std::vector<float>& v) {
  std::size_t zeros = 0;
  for (float f : v) zeros += f == 0.0f;
  return static_cast<double>(zeros) / static_cast<double>(v.size());
}

TEST_P(FusionTest, BatchNormReluMatchesBatchNormThenRelu) {
  for (const Shape& shape :
       std::vector<Shape>{{3, 4, 5, 3}, {6, 5}, {2, 3, 17, 9}, {4, 3, 16, 12}}) {
    const std::int64_t C = shape[1];
    const auto n = static_cast<std::size_t>(numel_of(shape));
    Tensor x = make(random_values(n, 1, -2.0f, 3.0f), shape);
    Tensor grad_y = make(random_values(n, 2), shape);
    Tensor gamma = make(random_values(C, 3, 0.5f, 1.5f), {C});
    Tensor beta = make(random_values(C, 4, -0.5f, 0.5f), {C});
    auto moving = [&](float v) { return make(std::vector<float>(C, v), {C}); };

    auto forward = [&](Activation activation) {
      BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
      f.moving_mean = moving(0.5f);
      f.moving_var = moving(2.0f);
      f.momentum = 0.9;
      f.activation = activation;
      batchnorm_forward_training(f, stream());
      return f;
    };

    // Unfused: batch norm, ReLU; ReLU's backward into a zeroed gradient, then batch norm's.
    const BatchNormForwardTraining bn = forward(Activation::None);
    Tensor relu_y = Tensor::empty(shape, stream());
    relu_forward(relu_y, bn.y, stream());
    Tensor grad_bn = Tensor::zeros(shape, stream());
    relu_backward(grad_bn, grad_y, relu_y, stream());
    const auto sentinel = random_values(n, 5);  // the gradients accumulate
    Tensor grad_x = make(sentinel, shape), grad_gamma = moving(1.0f), grad_beta = moving(-1.0f);
    batchnorm_backward(backward_of(bn, grad_bn, grad_x, grad_gamma, grad_beta), stream());

    // Fused.
    const BatchNormForwardTraining fused = forward(Activation::ReLU);
    Tensor fgrad_x = make(sentinel, shape), fgrad_gamma = moving(1.0f), fgrad_beta = moving(-1.0f);
    batchnorm_backward(backward_of(fused, grad_y, fgrad_x, fgrad_gamma, fgrad_beta), stream());

    const std::string at = " on " + to_string(shape);
    const double zeros = zero_share(host(fused.y));
    EXPECT_GT(zeros, 0.2) << "the ReLU must clamp a good share" << at;
    EXPECT_LT(zeros, 0.8) << at;
    expect_same(fused.y, relu_y, "y" + at);
    expect_same(fused.save_mean, bn.save_mean, "mean" + at);
    expect_same(fused.save_inv_std, bn.save_inv_std, "inv_std" + at);
    expect_same(fused.moving_mean, bn.moving_mean, "moving_mean" + at);
    expect_same(fused.moving_var, bn.moving_var, "moving_var" + at);
    expect_same(fgrad_x, grad_x, "grad_x" + at);
    expect_same(fgrad_gamma, grad_gamma, "grad_gamma" + at);
    expect_same(fgrad_beta, grad_beta, "grad_beta" + at);

    // Assigned into a NaN-filled grad_x: the accumulation into zeros, never reading it.
    const std::vector<float> nans(n, NAN);
    Tensor assigned = make(nans, shape), zeroed = Tensor::zeros(shape, stream());
    BatchNormBackward assign = backward_of(fused, grad_y, assigned);
    assign.grad_x_write = GradWrite::Assign;
    batchnorm_backward(assign, stream());
    batchnorm_backward(backward_of(fused, grad_y, zeroed), stream());
    EXPECT_EQ(host(assigned), host(zeroed)) << "assign" << at;
    Tensor accumulated = make(nans, shape);  // control: accumulating keeps the NaNs
    batchnorm_backward(backward_of(fused, grad_y, accumulated), stream());
    EXPECT_TRUE(std::isnan(host(accumulated)[0])) << at;

    // Control: without the mask, the backward is another one.
    Tensor unmasked = make(sentinel, shape);
    BatchNormBackward plain = backward_of(fused, grad_y, unmasked);
    plain.activation = Activation::None;
    batchnorm_backward(plain, stream());
    EXPECT_FALSE(all_close(host(unmasked), host(grad_x), 1e-3, 1e-3)) << at;
  }
}

TEST_P(FusionTest, BatchNormReluInferenceAndInPlace) {
  const Shape shape = {4, 3, 2, 5};
  const auto n = static_cast<std::size_t>(numel_of(shape));
  const auto xv = random_values(n, 6, -2.0f, 2.0f);
  Tensor x = make(xv, shape), gamma = make({1.0f, 0.5f, 2.0f}, {3});
  Tensor beta = make({0.1f, -0.2f, 0.0f}, {3}), mm = make({0.1f, 0.0f, -0.3f}, {3});
  Tensor mv = make({1.0f, 2.0f, 0.5f}, {3});
  BatchNormForwardInference inference{.y = Tensor::empty(shape, stream()),
                                      .x = x,
                                      .gamma = gamma,
                                      .beta = beta,
                                      .moving_mean = mm,
                                      .moving_var = mv};
  batchnorm_forward_inference(inference, stream());
  const Tensor y = inference.y;
  relu_forward(y, y, stream());
  inference.y = inference.x = make(xv, shape);  // in place: y aliases x
  inference.activation = Activation::ReLU;
  batchnorm_forward_inference(inference, stream());
  expect_same(inference.y, y, "inference y");
  EXPECT_GT(zero_share(host(inference.y)), 0.2);
}

TEST_P(FusionTest, BatchNormSplitBackwardTakesTheReluOutput) {
  // The synchronized form's steps, masked the same way as the single call.
  const Shape shape = {5, 2, 3, 3};
  const auto n = static_cast<std::size_t>(numel_of(shape));
  Tensor x = make(random_values(n, 7), shape), grad_y = make(random_values(n, 8), shape);
  Tensor gamma = make({1.2f, 0.8f}, {2}), beta = make({0.0f, 0.3f}, {2});
  BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
  f.activation = Activation::ReLU;
  batchnorm_forward_training(f, stream());
  Tensor whole = Tensor::zeros(shape, stream());
  batchnorm_backward(backward_of(f, grad_y, whole), stream());
  BatchNormBackwardReduce reduce =
      reduce_of(f, grad_y, Tensor::empty({2}, stream()), Tensor::empty({2}, stream()));
  batchnorm_backward_reduce(reduce, stream());
  BatchNormBackwardApply apply = apply_of(reduce, Tensor::zeros(shape, stream()), 45);
  batchnorm_backward_apply(apply, stream());
  expect_same(apply.grad_x, whole, "split backward");
  // The mask is the forward's: the ReLU backward of y's unfused pair gives the same.
  Tensor grad_bn = Tensor::zeros(shape, stream());
  relu_backward(grad_bn, grad_y, f.y, stream());
  Tensor unfused = Tensor::zeros(shape, stream());
  BatchNormBackward plain = backward_of(f, grad_bn, unfused);
  plain.activation = Activation::None;
  batchnorm_backward(plain, stream());
  expect_same(whole, unfused, "against the unfused backward");
  reduce.beta = Tensor();
  EXPECT_THROW_WITH(batchnorm_backward_reduce(reduce, stream()), InvalidArgument,
                    "batchnorm_backward_reduce: the ReLU backward needs the forward's gamma and "
                    "beta (gamma is defined, beta is undefined)");
  apply.beta = Tensor::zeros({3}, stream());
  EXPECT_THROW_WITH(batchnorm_backward_apply(apply, stream()), ShapeError,
                    "batchnorm_backward_apply: beta is float32[3]");
}

TEST_P(FusionTest, BiasAddReluMatchesBiasAddThenRelu) {
  for (const Shape& shape : std::vector<Shape>{{7, 5}, {3, 4, 2, 3}, {128, 128}}) {
    const std::int64_t C = shape[1];
    const auto n = static_cast<std::size_t>(numel_of(shape));
    Tensor x = make(random_values(n, 9), shape), bias = make(random_values(C, 10), {C});
    Tensor grad_y = make(random_values(n, 11), shape);
    const auto sentinel_x = random_values(n, 12), sentinel_b = random_values(C, 13);

    Tensor y = Tensor::empty(shape, stream());
    bias_add_forward(y, x, bias, stream());
    relu_forward(y, y, stream());
    Tensor grad_z = Tensor::zeros(shape, stream());  // the gradient between the two ops
    relu_backward(grad_z, grad_y, y, stream());
    Tensor grad_x = make(sentinel_x, shape), grad_bias = make(sentinel_b, {C});
    axpy(grad_x, 1.0, grad_z, stream());  // what ag::bias_add adds into grad_x
    bias_add_backward(grad_bias, grad_z, stream());

    Tensor fy = Tensor::empty(shape, stream());
    bias_add_relu_forward(fy, x, bias, stream());
    Tensor fgrad_x = make(sentinel_x, shape), fgrad_bias = make(sentinel_b, {C});
    bias_add_relu_backward(fgrad_x, fgrad_bias, grad_y, fy, stream());

    const std::string at = " on " + to_string(shape);
    EXPECT_GT(zero_share(host(fy)), 0.2) << at;
    expect_same(fy, y, "y" + at);
    expect_same(fgrad_x, grad_x, "grad_x" + at);
    expect_same(fgrad_bias, grad_bias, "grad_bias" + at);
    // Either gradient alone is the same as with both.
    Tensor only_x = make(sentinel_x, shape), only_bias = make(sentinel_b, {C});
    bias_add_relu_backward(only_x, Tensor(), grad_y, fy, stream());
    bias_add_relu_backward(Tensor(), only_bias, grad_y, fy, stream());
    expect_same(only_x, grad_x, "grad_x alone" + at);
    expect_same(only_bias, grad_bias, "grad_bias alone" + at);
    // Control: the unmasked bias gradient differs.
    Tensor unmasked = make(sentinel_b, {C});
    bias_add_backward(unmasked, grad_y, stream());
    EXPECT_FALSE(all_close(host(unmasked), host(grad_bias), 1e-3, 1e-3)) << at;
  }
  Tensor x = Tensor::zeros({2, 3}, stream()), b = Tensor::zeros({3}, stream());
  EXPECT_THROW_WITH(bias_add_relu_backward(x, b, x, Tensor::zeros({3, 2}, stream()), stream()),
                    ShapeError, "bias_add_relu_backward: y is float32[3,2]");
  EXPECT_THROW_WITH(bias_add_relu_forward(x, x, Tensor::zeros({2}, stream()), stream()), ShapeError,
                    "bias_add_relu_forward: bias is float32[2]");
}

TEST_P(FusionTest, MaxPoolThroughArgmaxMatchesRecomputation) {
  struct Case {
    Shape x;
    Pool2dParams p;
  };
  // 2x2 stride 2 takes the CPU's vector form, four outputs at a time: Wo = 4 one
  // group, 14 and 7 with a last group overlapping the one before; Wo = 2 is scalar.
  const Case cases[] = {
      {{2, 3, 8, 8}, Pool2dParams::square(2, 2)},     {{2, 2, 6, 28}, Pool2dParams::square(2, 2)},
      {{1, 3, 14, 14}, Pool2dParams::square(2, 2)},   {{1, 2, 7, 5}, Pool2dParams::square(2, 2)},
      {{2, 1, 9, 8}, Pool2dParams::square(3, 2, 1)},  // overlapping windows
      {{1, 3, 6, 11}, Pool2dParams{3, 2, 1, 3, 1, 0}}};
  for (const Case& c : cases) {
    const Shape ys = pool2d_output_shape(c.x, c.p);
    const auto n = static_cast<std::size_t>(numel_of(c.x));
    auto xv = random_values(n, 14);
    for (std::size_t i = 7; i + 1 < n; i += 13) xv[i + 1] = xv[i];  // ties
    // NaNs at each position of a window, and two in one window (the first wins).
    const std::int64_t W = c.x[3];
    for (const std::int64_t i : {std::int64_t{5}, 2 * W + 2, 3 * W + 3, 4 * W + 5}) {
      xv[static_cast<std::size_t>(i)] = NAN;
    }
    xv[static_cast<std::size_t>(5 * W + 4)] = NAN;  // with 4*W + 5 in one 2x2 window
    Tensor x = make(xv, c.x), grad_y = make(random_values(numel_of(ys), 15), ys);
    const auto sentinel = random_values(n, 16);

    Tensor y = Tensor::empty(ys, stream()), grad_x = make(sentinel, c.x);
    max_pool2d_forward(y, x, c.p, stream());
    max_pool2d_backward(grad_x, grad_y, x, c.p, stream());
    Tensor fy = Tensor::empty(ys, stream()), argmax = Tensor::empty(ys, stream());
    Tensor fgrad_x = make(sentinel, c.x);
    max_pool2d_forward_with_argmax(fy, argmax, x, c.p, stream());
    max_pool2d_backward_from_argmax(fgrad_x, grad_y, argmax, c.p, stream());

    const std::string at = " on x" + to_string(c.x);
    const auto a = host(y), b = host(fy);
    for (std::size_t i = 0; i < a.size(); ++i) {  // NaN meets NaN
      EXPECT_TRUE(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) << i << at;
    }
    EXPECT_EQ(host(fgrad_x), host(grad_x)) << at;  // the same sums in the same order
    // The argmax names a position of y's value in its plane.
    const auto where = host(argmax);
    const std::int64_t plane_in = c.x[2] * c.x[3], plane_out = ys[2] * ys[3];
    for (std::size_t o = 0; o < where.size(); ++o) {
      const std::int64_t plane = static_cast<std::int64_t>(o) / plane_out;
      const float v = xv[static_cast<std::size_t>(plane * plane_in + std::int64_t(where[o]))];
      EXPECT_TRUE(v == b[o] || (std::isnan(v) && std::isnan(b[o]))) << o << at;
    }
    // Assigned into a NaN-filled buffer: the accumulation into zeros, never reading it.
    const std::vector<float> nans(n, NAN);
    Tensor assigned = make(nans, c.x), zeroed = Tensor::zeros(c.x, stream());
    max_pool2d_backward_from_argmax(assigned, grad_y, argmax, c.p, stream(), GradWrite::Assign);
    max_pool2d_backward_from_argmax(zeroed, grad_y, argmax, c.p, stream());
    EXPECT_EQ(host(assigned), host(zeroed)) << "assign" << at;
    // Control: accumulating into that buffer keeps its NaNs.
    Tensor accumulated = make(nans, c.x);
    max_pool2d_backward_from_argmax(accumulated, grad_y, argmax, c.p, stream());
    EXPECT_TRUE(std::isnan(host(accumulated)[0])) << at;
    // Control: a wrong argmax (every window's first position) gives another gradient.
    Tensor wrong = make(std::vector<float>(where.size(), 0.0f), ys), other = make(sentinel, c.x);
    max_pool2d_backward_from_argmax(other, grad_y, wrong, c.p, stream());
    EXPECT_NE(host(other), host(grad_x)) << at;
  }
  Tensor x = Tensor::zeros({1, 1, 4, 4}, stream()), y = Tensor::zeros({1, 1, 2, 2}, stream());
  EXPECT_THROW_WITH(max_pool2d_forward_with_argmax(y, Tensor::zeros({1, 1, 2, 3}, stream()), x,
                                                   Pool2dParams::square(2, 2), stream()),
                    ShapeError, "max_pool2d_forward_with_argmax: argmax is float32[1,1,2,3]");
  EXPECT_THROW_WITH(max_pool2d_backward_from_argmax(x, y, Tensor::zeros({4}, stream()),
                                                    Pool2dParams::square(2, 2), stream()),
                    ShapeError, "max_pool2d_backward_from_argmax: argmax is float32[4]");
}

TEST_P(FusionTest, CrossEntropyBackwardFromProbsMatchesRecomputation) {
  const std::int64_t N = 37, K = 10;
  Tensor logits = make(random_values(N * K, 17, -4.0f, 4.0f), {N, K});
  std::vector<float> ids;
  for (std::int64_t i = 0; i < N; ++i) ids.push_back(static_cast<float>((i * 3) % K));
  Tensor labels = make(ids, {N}), grad_loss = make({0.75f}, {1});
  Tensor loss = Tensor::empty({1}, stream()), probs = Tensor::empty({N, K}, stream());
  softmax_cross_entropy_forward(loss, probs, Tensor(), logits, labels, Reduction::Mean, stream());
  const auto sentinel = random_values(N * K, 18);
  Tensor grad = make(sentinel, {N, K}), fgrad = make(sentinel, {N, K});
  softmax_cross_entropy_backward(grad, grad_loss, logits, labels, Reduction::Mean, stream());
  softmax_cross_entropy_backward_from_probs(fgrad, grad_loss, probs, labels, Reduction::Mean,
                                            stream());
  // |grad_loss * r| * 2^-24 plus one rounding of a value below 2 in magnitude.
  const double bound = 0.75 / N * std::ldexp(1.0, -24) + std::ldexp(1.0, -23);
  EXPECT_TRUE(all_close(host(fgrad), host(grad), bound, 0.0));
  // Control: the gradient of the Sum reduction is another one.
  Tensor sum = make(sentinel, {N, K});
  softmax_cross_entropy_backward_from_probs(sum, grad_loss, probs, labels, Reduction::Sum,
                                            stream());
  EXPECT_FALSE(all_close(host(sum), host(grad), 1e-4, 1e-4));
  if (device().is_cpu()) {  // float64: the probabilities are the double ones, so exact
    const Stream& cpu = default_stream(Device::cpu());
    Tensor l64 = random_double_tensor({N, K}, 19, -4.0, 4.0);
    Tensor lab = Tensor::from_host<double>(std::vector<double>(ids.begin(), ids.end()), {N}, cpu);
    Tensor gl = Tensor::from_host<double>({0.75}, {1}, cpu);
    Tensor loss64 = Tensor::empty({1}, cpu, DType::Float64);
    Tensor p64 = Tensor::empty({N, K}, cpu, DType::Float64);
    softmax_cross_entropy_forward(loss64, p64, Tensor(), l64, lab, Reduction::Mean, cpu);
    Tensor g1 = Tensor::zeros({N, K}, cpu, DType::Float64);
    Tensor g2 = Tensor::zeros({N, K}, cpu, DType::Float64);
    softmax_cross_entropy_backward(g1, gl, l64, lab, Reduction::Mean, cpu);
    softmax_cross_entropy_backward_from_probs(g2, gl, p64, lab, Reduction::Mean, cpu);
    EXPECT_EQ(g2.to_host<double>(), g1.to_host<double>());
  }
}

// --- gradients in float64 ---------------------------------------------------------

const Stream& cpu_stream() {
  return default_stream(Device::cpu());
}

Tensor empty64(const Shape& shape) {
  return Tensor::empty(shape, cpu_stream(), DType::Float64);
}

Tensor zeros64(const Shape& shape) {
  return Tensor::zeros(shape, cpu_stream(), DType::Float64);
}

TEST(FusionGradient, BatchNormReluMatchesCentralDifferences) {
  for (const Shape& shape : std::vector<Shape>{{3, 2, 3, 2}, {6, 3}}) {
    const std::int64_t C = shape[1];
    Tensor x = random_double_tensor(shape, 20, -1.0, 2.0);
    Tensor gamma = random_double_tensor({C}, 21, 0.5, 1.5), beta = random_double_tensor({C}, 22);
    Tensor g = random_double_tensor(shape, 23);
    auto forward = [&](const std::vector<Tensor>& in) {
      BatchNormForwardTraining f = training_forward(in[0], in[1], in[2], cpu_stream());
      f.activation = Activation::ReLU;
      batchnorm_forward_training(f, cpu_stream());
      return f;
    };
    const BatchNormForwardTraining f = forward({x, gamma, beta});  // statistics for the backward
    Tensor grad_x = zeros64(shape), grad_gamma = zeros64({C}), grad_beta = zeros64({C});
    batchnorm_backward(backward_of(f, g, grad_x, grad_gamma, grad_beta), cpu_stream());
    GradcheckOptions options;
    options.atol = 1e-5;
    options.rtol = 1e-4;
    EXPECT_TRUE(check_gradient(
        [&](const std::vector<Tensor>& in) { return weighted_sum(g, forward(in).y); },
        {x, gamma, beta}, {grad_x, grad_gamma, grad_beta}, options))
        << to_string(shape);
  }
}

TEST(FusionGradient, BiasAddReluMatchesCentralDifferences) {
  const Shape shape = {3, 4, 2, 3};
  Tensor x = random_double_tensor(shape, 24), bias = random_double_tensor({4}, 25);
  Tensor g = random_double_tensor(shape, 26);
  auto forward = [&](const std::vector<Tensor>& in) {
    Tensor y = empty64(shape);
    bias_add_relu_forward(y, in[0], in[1], cpu_stream());
    return y;
  };
  Tensor y = forward({x, bias});
  Tensor grad_x = zeros64(shape), grad_bias = zeros64({4});
  bias_add_relu_backward(grad_x, grad_bias, g, y, cpu_stream());
  GradcheckOptions options;  // skip values at ReLU's kink
  const auto xs = x.to_host<double>(), bs = bias.to_host<double>();
  options.skip = [&](std::size_t input, std::int64_t i) {
    return input == 0 && std::abs(xs[static_cast<std::size_t>(i)] + bs[(i / 6) % 4]) < 1e-4;
  };
  EXPECT_TRUE(
      check_gradient([&](const std::vector<Tensor>& in) { return weighted_sum(g, forward(in)); },
                     {x, bias}, {grad_x, grad_bias}, options));
}

TEST(FusionGradient, MaxPoolThroughArgmaxMatchesCentralDifferences) {
  const Shape shape = {2, 2, 5, 6};
  const Pool2dParams p = Pool2dParams::square(3, 2, 1);
  const Shape ys = pool2d_output_shape(shape, p);
  Tensor x = random_double_tensor(shape, 27), g = random_double_tensor(ys, 28);
  Tensor argmax = empty64(ys);
  auto forward = [&](const std::vector<Tensor>& in) {
    Tensor y = empty64(ys);
    max_pool2d_forward_with_argmax(y, argmax, in[0], p, cpu_stream());
    return y;
  };
  forward({x});
  Tensor grad_x = zeros64(shape);
  max_pool2d_backward_from_argmax(grad_x, g, argmax, p, cpu_stream());
  EXPECT_TRUE(check_gradient(
      [&](const std::vector<Tensor>& in) { return weighted_sum(g, forward(in)); }, {x}, {grad_x}));
}

// --- the layers ------------------------------------------------------------------

// FashionNet's layers with the ReLUs and max pools as layers of their own: the
// unfused model.
Sequential unfused_fashion_net(VariableSet& vars) {
  Sequential net;
  const Conv2dParams same{.pad_h = 1, .pad_w = 1};
  net.add<Conv2d>(vars, "conv1", 1, 32, 3, same, false);
  net.add<BatchNorm>(vars, "bn1", 32);
  net.add<ReLU>();
  net.add<MaxPool2d>(Pool2dParams::square(2, 2));
  net.add<Conv2d>(vars, "conv2", 32, 64, 3, same, false);
  net.add<BatchNorm>(vars, "bn2", 64);
  net.add<ReLU>();
  net.add<MaxPool2d>(Pool2dParams::square(2, 2));
  net.add<Flatten>();
  net.add<Linear>(vars, "fc1", 3136, 128);
  net.add<ReLU>();
  net.add<Linear>(vars, "fc2", 128, 10);
  return net;
}

TEST(FusionLayers, FashionNetEqualsItsUnfusedLayers) {
  VariableSet vars;
  Sequential fused = models::fashion_net(vars);
  Sequential unfused = unfused_fashion_net(vars);  // the same variables
  EXPECT_NE(fused.describe().find(
                "bn1: BatchNorm 32 momentum 0.99 eps 0.001 + ReLU + MaxPool2d 2x2 stride 2"),
            std::string::npos)
      << fused.describe();
  EXPECT_EQ(fused.size() + 5, unfused.size());  // three ReLUs and two max pools fused
  const Stream& cpu = cpu_stream();
  Tensor images = Tensor::empty({8, 1, 28, 28}, cpu);
  random_normal(images, 3, 0, 0.0f, 1.0f, cpu);
  std::vector<float> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(static_cast<float>(i % 10));
  Tensor labels = Tensor::from_host<float>(ids, {8}, cpu);
  std::vector<std::vector<float>> grads[2];
  float losses[2];
  for (int k = 0; k < 2; ++k) {
    VariableStore store(vars, cpu);
    store.initialize(4, cpu);
    Tape tape(cpu);
    const Sequential& net = k == 0 ? fused : unfused;
    Var loss = ag::softmax_cross_entropy(net(Context{tape, store, true}, tape.constant(images)),
                                         tape.constant(labels));
    store.zero_grad(cpu);
    tape.backward(loss);
    losses[k] = loss.value().to_host<float>()[0];
    for (const VariableSpec& spec : vars.specs()) {
      if (spec.trainable) grads[k].push_back(store.grad(spec.name).to_host<float>());
    }
    grads[k].push_back(store.value("bn2/moving_variance").to_host<float>());
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_EQ(grads[0][i], grads[1][i]) << "variable " << i;
  }
  EXPECT_NE(grads[0].front(), std::vector<float>(grads[0].front().size(), 0.0f));
}

}  // namespace
}  // namespace towerlab::testing
