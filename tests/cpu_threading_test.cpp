// The CPU kernels that spread over the host thread pool give the same bits with
// 1, 2 and 3 threads (kernels/cpu/parallel.h): every op of a FashionNet step and the
// optimizers, on odd sizes above the size where the pool is used. The suite's name
// starts with "ThreadPool" so that the ThreadSanitizer stage of the CI runs it.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "batchnorm_args.h"
#include "kernels/cpu/parallel.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class ThreadPoolKernelsTest : public RestoresThreadCount {
 protected:
  Stream& stream() { return default_stream(Device::cpu()); }
  Tensor make(const Shape& shape, unsigned seed, float low = -1.0f, float high = 1.0f) {
    return Tensor::from_host<float>(random_values(std::size_t(numel_of(shape)), seed, low, high),
                                    shape, stream());
  }
  // A fresh copy of t (the outputs a kernel accumulates into start from it).
  Tensor clone(const Tensor& t) {
    Tensor c = Tensor::empty(t.shape(), stream());
    copy(c, t, stream());
    return c;
  }
  std::vector<float> host(const Tensor& t) { return t.to_host<float>(stream()); }

  // Runs `op` (which returns its outputs, concatenated) with 1, 2 and 3 threads, and
  // with 5 threads as the first of two towers' shares (3 threads), and expects the
  // same bits from each.
  void expect_same_bits(const std::function<std::vector<float>()>& op) {
    set_num_threads(1);
    const std::vector<float> one = op();
    ASSERT_FALSE(one.empty());
    auto expect_as_one = [&](const std::vector<float>& many, const char* how) {
      ASSERT_EQ(many.size(), one.size());
      EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(float)), 0)
          << "results with " << how << " differ from one thread";
    };
    set_num_threads(2);
    expect_as_one(op(), "2 threads");
    set_num_threads(3);
    expect_as_one(op(), "3 threads");
    set_num_threads(5);
    const ThreadShare share(0, 2);
    expect_as_one(op(), "a tower's share of 3 of 5 threads");
  }
};

// [N,C,H,W] with odd sizes and more values than cpu::kMinParallelValues, so that the
// pool is really used; C = 5 does not divide evenly over 2 or 3 threads.
const Shape kImages = {7, 5, 31, 37};

std::vector<float> concat(std::initializer_list<std::vector<float>> parts) {
  std::vector<float> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

TEST_F(ThreadPoolKernelsTest, SizesReachThePool) {
  EXPECT_GE(numel_of(kImages), 2 * cpu::kMinParallelValues);
}

// The control: the data is such that summing the same values in another order
// changes the bits, so a reduction split across threads would be caught.
TEST_F(ThreadPoolKernelsTest, ControlReductionOrderChangesBits) {
  const std::vector<float> v = random_values(std::size_t(numel_of(kImages)), 3);
  float forward = 0, halves_a = 0, halves_b = 0;
  for (float x : v) forward += x;
  for (std::size_t i = 0; i < v.size() / 2; ++i) halves_a += v[i];
  for (std::size_t i = v.size() / 2; i < v.size(); ++i) halves_b += v[i];
  EXPECT_NE(forward, halves_a + halves_b);
}

TEST_F(ThreadPoolKernelsTest, BatchNormForwardAndBackward) {
  const std::int64_t C = kImages[1];
  const Tensor x = make(kImages, 1, -2.0f, 3.0f), grad_y = make(kImages, 2);
  const Tensor gamma = make({C}, 3, 0.5f, 1.5f), beta = make({C}, 4);
  const Tensor grad_x0 = make(kImages, 5), grad_gamma0 = make({C}, 6), grad_beta0 = make({C}, 7);
  expect_same_bits([&] {
    BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
    f.moving_mean = make({C}, 8);
    f.moving_var = make({C}, 9, 0.5f, 2.0f);
    f.momentum = 0.9;
    batchnorm_forward_training(f, stream());
    // Sentinels: the gradients are accumulated onto these values.
    Tensor grad_x = clone(grad_x0), grad_gamma = clone(grad_gamma0), grad_beta = clone(grad_beta0);
    batchnorm_backward(backward_of(f, grad_y, grad_x, grad_gamma, grad_beta), stream());
    return concat({host(f.y), host(f.save_mean), host(f.save_inv_std), host(f.moving_mean),
                   host(f.moving_var), host(grad_x), host(grad_gamma), host(grad_beta)});
  });
}

TEST_F(ThreadPoolKernelsTest, BatchNormSplitStatsOn2D) {
  const Shape shape = {4099, 7};  // [N,C]: the statistics split over 7 channels
  const Tensor x = make(shape, 11, -1.0f, 5.0f);
  expect_same_bits([&] {
    Tensor mean = Tensor::empty({7}, stream()), m2 = Tensor::empty({7}, stream());
    batchnorm_stats({.mean = mean, .m2 = m2, .x = x}, stream());
    return concat({host(mean), host(m2)});
  });
}

TEST_F(ThreadPoolKernelsTest, BiasAddForwardAndBackward) {
  const std::int64_t C = kImages[1];
  const Tensor x = make(kImages, 1), bias = make({C}, 2), grad_y = make(kImages, 3);
  const Tensor grad_bias0 = make({C}, 4);
  expect_same_bits([&] {
    Tensor y = Tensor::empty(kImages, stream());
    bias_add_forward(y, x, bias, stream());
    Tensor grad_bias = clone(grad_bias0);
    bias_add_backward(grad_bias, grad_y, stream());
    return concat({host(y), host(grad_bias)});
  });
}

TEST_F(ThreadPoolKernelsTest, ReluForwardAndBackward) {
  const Tensor x = make(kImages, 1), grad_y = make(kImages, 2), grad_x0 = make(kImages, 3);
  expect_same_bits([&] {
    Tensor y = Tensor::empty(kImages, stream());
    relu_forward(y, x, stream());
    Tensor grad_x = clone(grad_x0);
    relu_backward(grad_x, grad_y, y, stream());
    return concat({host(y), host(grad_x)});
  });
}

TEST_F(ThreadPoolKernelsTest, PoolingForwardAndBackward) {
  // Overlapping 3x3 windows with stride 2 and padding: a plane's outputs share inputs.
  // In float32 and in 16 bits (the reference on each thread's planes).
  const Pool2dParams params = Pool2dParams::square(3, 2, 1);
  const Shape out_shape = pool2d_output_shape(kImages, params);
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = cast(make(kImages, 1), dtype, stream());
    const Tensor grad_y = cast(make(out_shape, 2), dtype, stream());
    const Tensor grad_x0 = cast(make(kImages, 3), dtype, stream());
    const auto wide = [&](const Tensor& t) { return host(cast(t, DType::Float32, stream())); };
    expect_same_bits([&] {
      Tensor max_y = Tensor::empty(out_shape, stream(), dtype);
      Tensor avg_y = Tensor::empty(out_shape, stream(), dtype);
      max_pool2d_forward(max_y, x, params, stream());
      avg_pool2d_forward(avg_y, x, params, stream());
      Tensor max_grad_x = cast(grad_x0, dtype, stream()),
             avg_grad_x = cast(grad_x0, dtype, stream());
      max_pool2d_backward(max_grad_x, grad_y, x, params, stream());
      avg_pool2d_backward(avg_grad_x, grad_y, params, stream());
      return concat({wide(max_y), wide(avg_y), wide(max_grad_x), wide(avg_grad_x)});
    });
  }
}

// The fused model's pooling: the maximum with its argmax, and the backward from it,
// both accumulating onto a sentinel and assigning (which zeroes each plane before its
// scatter). 2x2 stride 2 takes the vector path on x86-64; 3x3 stride 2 padded windows
// overlap, so one input gathers from several outputs of its plane.
TEST_F(ThreadPoolKernelsTest, PoolingWithArgmaxBothWrites) {
  for (const Pool2dParams& params : {Pool2dParams::square(2, 2), Pool2dParams::square(3, 2, 1)}) {
    const Shape out_shape = pool2d_output_shape(kImages, params);
    const Tensor x = make(kImages, 11), grad_y = make(out_shape, 12), grad_x0 = make(kImages, 13);
    expect_same_bits([&] {
      Tensor y = Tensor::empty(out_shape, stream()), argmax = Tensor::empty(out_shape, stream());
      max_pool2d_forward_with_argmax(y, argmax, x, params, stream());
      Tensor accumulated = clone(grad_x0), assigned = clone(grad_x0);
      max_pool2d_backward_from_argmax(accumulated, grad_y, argmax, params, stream());
      max_pool2d_backward_from_argmax(assigned, grad_y, argmax, params, stream(),
                                      GradWrite::Assign);
      return concat({host(y), host(argmax), host(accumulated), host(assigned)});
    });
  }
}

// Batch norm with its ReLU fused, backward assigning grad_x (the fused model's first
// write of that gradient).
TEST_F(ThreadPoolKernelsTest, FusedBatchNormReluBackwardAssigns) {
  const std::int64_t C = kImages[1];
  const Tensor x = make(kImages, 21, -2.0f, 3.0f), grad_y = make(kImages, 22);
  const Tensor gamma = make({C}, 23, 0.5f, 1.5f), beta = make({C}, 24);
  const Tensor grad_x0 = make(kImages, 25);
  expect_same_bits([&] {
    BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
    f.moving_mean = make({C}, 26);
    f.moving_var = make({C}, 27, 0.5f, 2.0f);
    f.momentum = 0.9;
    f.activation = Activation::ReLU;
    batchnorm_forward_training(f, stream());
    Tensor grad_x = clone(grad_x0), grad_gamma = Tensor::zeros({C}, stream()),
           grad_beta = Tensor::zeros({C}, stream());
    BatchNormBackward backward = backward_of(f, grad_y, grad_x, grad_gamma, grad_beta);
    backward.grad_x_write = GradWrite::Assign;
    batchnorm_backward(backward, stream());
    return concat({host(f.y), host(grad_x), host(grad_gamma), host(grad_beta)});
  });
}

TEST_F(ThreadPoolKernelsTest, ElementwiseOps) {
  const Tensor a = make(kImages, 1), b = make(kImages, 2), scalar = make({1}, 3);
  expect_same_bits([&] {
    Tensor sum_ab = Tensor::empty(kImages, stream()), diff = Tensor::empty(kImages, stream());
    Tensor prod = Tensor::empty(kImages, stream()), scaled = Tensor::empty(kImages, stream());
    add(sum_ab, a, b, stream());
    sub(diff, a, b, stream());
    mul(prod, a, b, stream());
    scale(scaled, a, 0.37, stream());
    Tensor acc = clone(b);
    axpy(acc, -1.3, a, stream());
    axpy_scalar(acc, 0.25, scalar, stream());
    Tensor filled = Tensor::empty(kImages, stream());
    fill(filled, 0.5, stream());
    Tensor copied = Tensor::empty(kImages, stream());
    copy(copied, a, stream());
    return concat({host(sum_ab), host(diff), host(prod), host(scaled), host(acc), host(filled),
                   host(copied)});
  });
}

TEST_F(ThreadPoolKernelsTest, LossGradients) {
  const std::int64_t N = 2053, K = 11;  // rows of logits, above the pool's size
  const Tensor logits = make({N, K}, 1, -4.0f, 4.0f);
  std::vector<float> ids(static_cast<std::size_t>(N));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = float((i * 7) % K);
  const Tensor labels = Tensor::from_host<float>(ids, {N}, stream());
  const Tensor pred = make(kImages, 2), target = make(kImages, 3), grad_loss = make({1}, 4);
  const Tensor grad0 = make({N, K}, 5), grad_pred0 = make(kImages, 6);
  expect_same_bits([&] {
    Tensor loss = Tensor::empty({1}, stream());
    softmax_cross_entropy_forward(loss, Tensor(), Tensor(), logits, labels, Reduction::Mean,
                                  stream());
    Tensor grad = clone(grad0);
    softmax_cross_entropy_backward(grad, grad_loss, logits, labels, Reduction::Mean, stream());
    Tensor mse = Tensor::empty({1}, stream());
    mse_forward(mse, pred, target, Reduction::Sum, stream());
    Tensor grad_pred = clone(grad_pred0), grad_target = clone(grad_pred0);
    mse_backward(grad_pred, grad_target, grad_loss, pred, target, Reduction::Mean, stream());
    Tensor grad_w = clone(grad_pred0);
    l2_loss_backward(grad_w, grad_loss, pred, 0.01, stream());
    return concat(
        {host(loss), host(grad), host(mse), host(grad_pred), host(grad_target), host(grad_w)});
  });
}

TEST_F(ThreadPoolKernelsTest, OptimizerUpdates) {
  const Shape shape = {100003};
  const Tensor p0 = make(shape, 1), g = make(shape, 2), m0 = make(shape, 3);
  const Tensor v0 = make(shape, 4, 0.0f, 1.0f);
  expect_same_bits([&] {
    Tensor p_adam = clone(p0), m = clone(m0), v = clone(v0);
    adam_update(p_adam, g, m, v, 3, AdamParams{.weight_decay = 0.01}, stream());
    Tensor p_sgd = clone(p0), velocity = clone(m0);
    sgd_update(p_sgd, g, velocity, SgdParams{.lr = 0.1, .momentum = 0.9, .nesterov = true},
               stream());
    Tensor p_rms = clone(p0), ms = clone(v0), mom = clone(m0), mg = clone(m0);
    scale(mg, mg, 0.01, stream());  // keeps ms - mg^2 positive
    rmsprop_update(p_rms, g, ms, mom, mg, RmspropParams{.momentum = 0.5, .centered = true},
                   stream());
    return concat({host(p_adam), host(m), host(v), host(p_sgd), host(velocity), host(p_rms),
                   host(ms), host(mom), host(mg)});
  });
}

// The weight gradient sums over images in fixed groups (kernels/cpu/conv2d_parts.h):
// batches above and below the group count, and a 1x1 convolution (no lowering).
TEST_F(ThreadPoolKernelsTest, Conv2dForwardAndBackward) {
  for (std::int64_t n : {3, 21}) {
    for (std::int64_t r : {1, 3}) {
      SCOPED_TRACE("batch " + std::to_string(n) + ", kernel " + std::to_string(r));
      const Conv2dParams params{.pad_h = r / 2, .pad_w = r / 2};
      const Tensor x = make({n, 3, 13, 11}, 21), w = make({6, 3, r, r}, 22), b = make({6}, 23);
      const Shape y_shape = conv2d_output_shape(x.shape(), w.shape(), params);
      const Tensor gy = make(y_shape, 24), gx0 = make(x.shape(), 25), gw0 = make(w.shape(), 26);
      const Tensor gb0 = make({6}, 27);
      expect_same_bits([&] {
        Tensor y = Tensor::empty(y_shape, stream());
        conv2d_forward(y, x, w, b, params, stream());
        Tensor gx = clone(gx0), gw = clone(gw0), gb = clone(gb0);
        conv2d_backward(gx, gw, gb, gy, x, w, params, stream());
        return concat({host(y), host(gx), host(gw), host(gb)});
      });
    }
  }
}

TEST_F(ThreadPoolKernelsTest, FirstNonfiniteIsTheSmallestIndex) {
  std::vector<float> values = random_values(100003, 1);
  const Tensor finite = Tensor::from_host<float>(values, {100003}, stream());
  values[70001] = std::numeric_limits<float>::infinity();  // in the last of 2 or 3 ranges
  values[40000] = std::numeric_limits<float>::quiet_NaN();
  values[99999] = std::numeric_limits<float>::quiet_NaN();
  const Tensor bad = Tensor::from_host<float>(values, {100003}, stream());
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    EXPECT_EQ(first_nonfinite(finite, stream()), -1) << threads << " threads";
    EXPECT_EQ(first_nonfinite(bad, stream()), 40000) << threads << " threads";
  }
}

}  // namespace
}  // namespace towerlab::testing
