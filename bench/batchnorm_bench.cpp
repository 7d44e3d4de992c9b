// Batch normalization against the memory bandwidth it is bound by, on FashionNet's
// shapes (batch 128: [128,32,28,28] after conv1, [128,64,14,14] after conv2) and a
// ResNet-like [32,64,56,56] layer.
//
// "bytes" counts the traffic each op's algorithm must move at least: the
// training forward reads x once for the statistics and once to normalize, and
// writes y (3 x |x|: no kernel keeps a channel's values on chip between the two
// passes); the inference forward reads x and writes y (2 x |x|); the backward
// reads grad_y and x for its sums, then grad_y and x again and reads and writes
// grad_x (accumulated) for grad_x (6 x |x|). The reference is a copy of |x|
// (2 x |x| bytes): memcpy on the CPU, cudaMemcpy device-to-device on CUDA, where
// the target is >= 85% of the copy's bytes/s; and, when TOWERLAB_HAVE_CUDNN,
// cuDNN's cudnnBatchNormalizationForwardTraining / Backward (spatial mode) on the
// same tensors, counted with the same bytes. A second read that hits L2 (the
// elementwise passes walk the reduction's ranges backwards) counts all the same,
// so bytes/s above the copy's means L2 served part of it.
//
// Batch norm with its ReLU and FashionNet's 2x2 stride-2 max pool fused (CPU
// only) is measured against the unfused ops it replaces, on FashionNet's two
// layers at batch 128 and 64; its bytes are counted the same way (below).
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "towerlab.h"

#if TOWERLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif
#if TOWERLAB_WITH_CUDA && TOWERLAB_HAVE_CUDNN
#include <cudnn.h>

#include "cudnn_check.h"
#endif

using namespace towerlab;

namespace {

// Inputs with a non-trivial mean and spread, as a real activation has.
Tensor input(const Shape& shape, const Stream& stream, std::uint64_t subsequence = 0) {
  Tensor x = Tensor::empty(shape, stream);
  random_normal(x, 42, subsequence, 1.0f, 0.5f, stream);
  return x;
}

// One layer's arguments: x with a non-trivial mean and spread, gamma 1, beta 0,
// moving statistics and gradients 0; the backward reads the forward's x, gamma,
// beta and statistics.
struct BatchNormLayer {
  BatchNormForwardTraining forward;
  BatchNormBackward backward;

  BatchNormLayer(const Shape& shape, const Stream& stream) {
    const Shape channels{shape[1]};
    Tensor gamma = Tensor::empty(channels, stream);
    fill(gamma, 1.0, stream);
    forward = {.y = Tensor::empty(shape, stream),
               .save_mean = Tensor::empty(channels, stream),
               .save_inv_std = Tensor::empty(channels, stream),
               .moving_mean = Tensor::zeros(channels, stream),
               .moving_var = Tensor::zeros(channels, stream),
               .x = input(shape, stream),
               .gamma = gamma,
               .beta = Tensor::zeros(channels, stream),
               .eps = 1e-3,
               .momentum = 0.99};
    backward = {.grad_x = Tensor::zeros(shape, stream),
                .grad_gamma = Tensor::zeros(channels, stream),
                .grad_beta = Tensor::zeros(channels, stream),
                .grad_y = input(shape, stream, 1),
                .x = forward.x,
                .gamma = gamma,
                .beta = forward.beta,
                .save_mean = forward.save_mean,
                .save_inv_std = forward.save_inv_std};
  }
};

void BM_BatchNormForwardTraining(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  const BatchNormLayer layer(shape, stream);
  bench::time_calls(state, stream, [&] { batchnorm_forward_training(layer.forward, stream); });
  bench::set_bytes(state, shape, 3);  // x twice, y
}

void BM_BatchNormForwardInference(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  const std::int64_t C = shape[1];
  Tensor x = input(shape, stream), y = Tensor::empty(shape, stream);
  Tensor ones = Tensor::empty({C}, stream), zeros = Tensor::zeros({C}, stream);
  fill(ones, 1.0, stream);
  bench::time_calls(state, stream, [&] {
    batchnorm_forward_inference({.y = y,
                                 .x = x,
                                 .gamma = ones,
                                 .beta = zeros,
                                 .moving_mean = zeros,
                                 .moving_var = ones,
                                 .eps = 1e-3},
                                stream);
  });
  bench::set_bytes(state, shape, 2);
}

void BM_BatchNormBackward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  const BatchNormLayer layer(shape, stream);
  batchnorm_forward_training(layer.forward, stream);  // the statistics the backward reads
  bench::time_calls(state, stream, [&] { batchnorm_backward(layer.backward, stream); });
  bench::set_bytes(state, shape, 6);  // grad_y and x twice, grad_x read and written
}

// Batch norm and the ReLU after it, forward and backward (a training step of the
// pair), fused (Activation::ReLU: two passes fewer over |x|, and no gradient
// tensor between the ops) or as two ops, the unfused form including the zero-fill
// the tape gives the gradient between them. Same bytes counted for both (the
// fused pair's traffic), so bytes/s compares them directly.
void BM_BatchNormReluStep(benchmark::State& state, Device device, bool fused) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  BatchNormLayer layer(shape, stream);
  const Tensor grad_y = layer.backward.grad_y;
  Tensor relu_y = Tensor::empty(shape, stream), grad_bn = Tensor::zeros(shape, stream);
  if (fused) {
    layer.forward.activation = layer.backward.activation = Activation::ReLU;
  } else {
    layer.backward.grad_y = grad_bn;
  }
  bench::time_calls(state, stream, [&] {
    batchnorm_forward_training(layer.forward, stream);
    if (!fused) {
      relu_forward(relu_y, layer.forward.y, stream);
      fill(grad_bn, 0.0, stream);
      relu_backward(grad_bn, grad_y, relu_y, stream);
    }
    batchnorm_backward(layer.backward, stream);
  });
  bench::set_bytes(state, shape, 9);  // forward 3|x| + backward 6|x|
}

// FashionNet's two batch-norm layers, each followed by a 2x2 stride-2 max pool
// ([N,32,28,28] after conv1, [N,64,14,14] after conv2), at batch 128 and 64.
void fashionnet_pooled_shapes(benchmark::internal::Benchmark* b) {
  for (std::int64_t batch : {128, 64}) b->Args({batch, 32, 28, 28})->Args({batch, 64, 14, 14});
  b->ArgNames({"N", "C", "H", "W"});
}

// The tensors of batch norm + ReLU + max pool on one of those shapes, and the two
// ways of running each direction: fused (batchnorm_max_pool_forward_training,
// batchnorm_max_pool_backward) or the unfused sequence the fused pair equals bit
// for bit (batchnorm_forward_training with the ReLU, max_pool2d_forward_with_argmax;
// max_pool2d_backward_from_argmax assigning the [N,C,H,W] gradient between the ops,
// batchnorm_backward). Both backwards assign grad_x, as the first write of that
// gradient in a step does.
struct BatchNormMaxPool {
  static constexpr double kEps = 1e-3, kMomentum = 0.99;
  const Pool2dParams pool = Pool2dParams::square(2, 2);
  const Stream& stream;
  Shape shape, pooled;
  Tensor x, gamma, beta, mean, inv_std, mm, mv, y, grad_y, grad_x, grad_gamma, grad_beta;
  Tensor argmax;                     // both forms': the forward writes it, the backward reads it
  Tensor activated, grad_activated;  // the unfused form's tensors between the ops

  BatchNormMaxPool(const Shape& s, const Stream& st)
      : stream(st), shape(s), pooled(pool2d_output_shape(s, pool)) {
    const std::int64_t C = shape[1];
    x = input(shape, stream);
    grad_y = input(pooled, stream, 1);
    gamma = input({C}, stream, 2);  // around 1, and beta around 0, as in a trained layer
    beta = Tensor::empty({C}, stream);
    random_normal(beta, 42, 3, 0.0f, 0.5f, stream);
    mean = Tensor::empty({C}, stream);
    inv_std = Tensor::empty({C}, stream);
    mm = Tensor::zeros({C}, stream);
    mv = Tensor::zeros({C}, stream);
    y = Tensor::empty(pooled, stream);
    grad_x = Tensor::empty(shape, stream);
    grad_gamma = Tensor::zeros({C}, stream);
    grad_beta = Tensor::zeros({C}, stream);
    activated = Tensor::empty(shape, stream);
    argmax = Tensor::empty(pooled, stream);
    grad_activated = Tensor::empty(shape, stream);
  }
  void forward(bool fused) {
    if (fused) {
      batchnorm_max_pool_forward_training({.y = y,
                                           .argmax = argmax,
                                           .save_mean = mean,
                                           .save_inv_std = inv_std,
                                           .moving_mean = mm,
                                           .moving_var = mv,
                                           .x = x,
                                           .gamma = gamma,
                                           .beta = beta,
                                           .eps = kEps,
                                           .momentum = kMomentum,
                                           .pool = pool,
                                           .activation = Activation::ReLU},
                                          stream);
    } else {
      batchnorm_forward_training({.y = activated,
                                  .save_mean = mean,
                                  .save_inv_std = inv_std,
                                  .moving_mean = mm,
                                  .moving_var = mv,
                                  .x = x,
                                  .gamma = gamma,
                                  .beta = beta,
                                  .eps = kEps,
                                  .momentum = kMomentum,
                                  .activation = Activation::ReLU},
                                 stream);
      max_pool2d_forward_with_argmax(y, argmax, activated, pool, stream);
    }
  }
  // After forward(fused): each backward reads its own forward's argmax (the fused
  // one's is -1 where the ReLU zeroes the window).
  void backward(bool fused) {
    if (fused) {
      batchnorm_max_pool_backward({.grad_x = grad_x,
                                   .grad_gamma = grad_gamma,
                                   .grad_beta = grad_beta,
                                   .grad_y = grad_y,
                                   .argmax = argmax,
                                   .x = x,
                                   .gamma = gamma,
                                   .save_mean = mean,
                                   .save_inv_std = inv_std,
                                   .pool = pool,
                                   .grad_x_write = GradWrite::Assign},
                                  stream);
    } else {
      max_pool2d_backward_from_argmax(grad_activated, grad_y, argmax, pool, stream,
                                      GradWrite::Assign);
      batchnorm_backward({.grad_x = grad_x,
                          .grad_gamma = grad_gamma,
                          .grad_beta = grad_beta,
                          .grad_y = grad_activated,
                          .x = x,
                          .gamma = gamma,
                          .beta = beta,
                          .save_mean = mean,
                          .save_inv_std = inv_std,
                          .activation = Activation::ReLU,
                          .grad_x_write = GradWrite::Assign},
                         stream);
    }
  }
};

// The bench checks itself: one forward and backward each way must give the same
// outputs (the contract's bit-for-bit equality; argmax the same where the pooled
// y is > 0, and the fused one -1 elsewhere), or the row is an error.
bool fused_matches_unfused(benchmark::State& state, const Shape& shape, const Stream& stream) {
  std::vector<float> results[2], argmax[2], pooled;
  for (bool fused : {false, true}) {
    BatchNormMaxPool op(shape, stream);
    op.forward(fused);
    op.backward(fused);
    for (const Tensor* t : {&op.y, &op.mean, &op.inv_std, &op.mm, &op.mv, &op.grad_x,
                            &op.grad_gamma, &op.grad_beta}) {
      const std::vector<float> values = t->to_host<float>(stream);
      results[fused ? 1 : 0].insert(results[fused ? 1 : 0].end(), values.begin(), values.end());
    }
    argmax[fused ? 1 : 0] = op.argmax.to_host<float>(stream);
    if (!fused) pooled = op.y.to_host<float>(stream);
  }
  for (std::size_t i = 0; i < pooled.size(); ++i) {
    if (!(pooled[i] > 0.0f)) argmax[0][i] = -1.0f;  // the ReLU zeroes the window
  }
  if (results[0] == results[1] && argmax[0] == argmax[1]) return true;
  state.SkipWithError("the fused batch norm + max pool differs from the unfused ops");
  return false;
}

// Bytes, the fused pair's unavoidable traffic, counted for both forms so that
// bytes/s compares them directly: the forward reads x and writes y and argmax
// (|x| + 2|y| = 1.5|x| for the 2x2 stride-2 pool, |y| = |x|/4); the backward
// reads x, grad_y and argmax and writes grad_x (2|x| + 2|y| = 2.5|x|). argmax is
// counted at 4 bytes a value, as it is held in x's dtype (float32 here). The fused
// forward's statistics pass reads x once more, and its backward reads x, and
// grad_y and argmax, twice (sums, then grad_x), as batch norm's own do; the
// unfused forms add the [N,C,H,W] activation and its gradient, each written and
// read back. The limit is the copy's bytes/s on the same shape (BM_CopyReference).
void BM_BatchNormMaxPoolForward(benchmark::State& state, bool fused) {
  Stream stream(Device::cpu());
  const Shape shape = bench::nchw_shape(state);
  if (fused && !fused_matches_unfused(state, shape, stream)) return;
  BatchNormMaxPool op(shape, stream);
  bench::time_calls(state, stream, [&] { op.forward(fused); });
  bench::set_bytes(state, shape, 1.5);  // x, then y and argmax (|x|/4 each)
}

void BM_BatchNormMaxPoolBackward(benchmark::State& state, bool fused) {
  Stream stream(Device::cpu());
  const Shape shape = bench::nchw_shape(state);
  if (fused && !fused_matches_unfused(state, shape, stream)) return;
  BatchNormMaxPool op(shape, stream);
  op.forward(fused);
  bench::time_calls(state, stream, [&] { op.backward(fused); });
  bench::set_bytes(state, shape, 2.5);  // x and grad_x, then grad_y and argmax (|x|/4 each)
}

#if TOWERLAB_WITH_CUDA && TOWERLAB_HAVE_CUDNN
// The legacy batch-norm calls are deprecated in cuDNN 9 but remain the plain,
// fastest-to-set-up reference; silence the warning for them only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// A cuDNN handle and the two descriptors spatial batch norm needs.
struct CudnnBatchNorm {
  cudnnHandle_t handle{};
  cudnnTensorDescriptor_t x_desc{}, channel_desc{};
  CudnnBatchNorm(const Shape& s, const Stream& stream) {
    CUDNN_CHECK(cudnnCreate(&handle));
    CUDNN_CHECK(cudnnSetStream(handle, static_cast<cudaStream_t>(stream.native_handle())));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&channel_desc));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                           static_cast<int>(s[0]), static_cast<int>(s[1]),
                                           static_cast<int>(s[2]), static_cast<int>(s[3])));
    CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(channel_desc, x_desc, CUDNN_BATCHNORM_SPATIAL));
  }
  ~CudnnBatchNorm() {
    cudnnDestroyTensorDescriptor(channel_desc);
    cudnnDestroyTensorDescriptor(x_desc);
    cudnnDestroy(handle);
  }
};

void BM_CudnnBatchNormForwardTraining(benchmark::State& state) {
  if (bench::skip_without(Device::cuda(0), state)) return;
  Stream stream(Device::cuda(0));
  const Shape shape = bench::nchw_shape(state);
  const std::int64_t C = shape[1];
  CudnnBatchNorm bn(shape, stream);
  Tensor x = input(shape, stream), y = Tensor::empty(shape, stream);
  Tensor gamma = Tensor::empty({C}, stream), beta = Tensor::zeros({C}, stream);
  Tensor mm = Tensor::zeros({C}, stream), mv = Tensor::zeros({C}, stream);
  Tensor mean = Tensor::empty({C}, stream), inv_std = Tensor::empty({C}, stream);
  fill(gamma, 1.0, stream);
  const float one = 1.0f, zero = 0.0f;
  bench::time_calls(state, stream, [&] {
    CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
        bn.handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, bn.x_desc, x.raw_data(), bn.x_desc,
        y.raw_data(), bn.channel_desc, gamma.raw_data(), beta.raw_data(), 0.01, mm.raw_data(),
        mv.raw_data(), 1e-3, mean.raw_data(), inv_std.raw_data()));
  });
  bench::set_bytes(state, shape, 3);  // as BM_BatchNormForwardTraining
}

void BM_CudnnBatchNormBackward(benchmark::State& state) {
  if (bench::skip_without(Device::cuda(0), state)) return;
  Stream stream(Device::cuda(0));
  const Shape shape = bench::nchw_shape(state);
  const std::int64_t C = shape[1];
  CudnnBatchNorm bn(shape, stream);
  Tensor x = input(shape, stream), grad_y = input(shape, stream, 1);
  Tensor grad_x = Tensor::zeros(shape, stream);
  Tensor gamma = Tensor::empty({C}, stream), mean = Tensor::zeros({C}, stream);
  Tensor inv_std = Tensor::empty({C}, stream);
  Tensor grad_gamma = Tensor::zeros({C}, stream), grad_beta = Tensor::zeros({C}, stream);
  fill(gamma, 1.0, stream);
  fill(inv_std, 1.0, stream);
  // Blend factors 1, 1: accumulate like towerlab's backward (same bytes).
  const float one = 1.0f;
  bench::time_calls(state, stream, [&] {
    CUDNN_CHECK(cudnnBatchNormalizationBackward(
        bn.handle, CUDNN_BATCHNORM_SPATIAL, &one, &one, &one, &one, bn.x_desc, x.raw_data(),
        bn.x_desc, grad_y.raw_data(), bn.x_desc, grad_x.raw_data(), bn.channel_desc,
        gamma.raw_data(), grad_gamma.raw_data(), grad_beta.raw_data(), 1e-3, mean.raw_data(),
        inv_std.raw_data()));
  });
  bench::set_bytes(state, shape, 6);  // as BM_BatchNormBackward
}

#pragma GCC diagnostic pop
#endif

}  // namespace

namespace {

// The cases of both devices, on one: the listing (and the results' JSON) has the
// CPU's, then the CPU-only fused max pool's, then cuda:0's.
void register_on(Device device) {
  const std::string on = bench::device_label(device);
  const bench::ShapesOf shapes;
  bench::register_memory_bound("BM_BatchNormForwardTraining/" + on, shapes,
                               BM_BatchNormForwardTraining, device);
  bench::register_memory_bound("BM_BatchNormForwardInference/" + on, shapes,
                               BM_BatchNormForwardInference, device);
  bench::register_memory_bound("BM_BatchNormBackward/" + on, shapes, BM_BatchNormBackward, device);
  for (bool fused : {true, false}) {
    bench::register_memory_bound("BM_BatchNormReluStep/" + on + (fused ? "_fused" : "_unfused"),
                                 shapes, BM_BatchNormReluStep, device, fused);
  }
  bench::register_memory_bound("BM_CopyReference/" + on, shapes, bench::copy_reference, device);
}

const bool registered = [] {
  register_on(Device::cpu());
  auto fused_and_unfused = [](const std::string& name, void (*bm)(benchmark::State&, bool)) {
    for (bool fused : {true, false}) {
      benchmark::RegisterBenchmark((name + (fused ? "/cpu_fused" : "/cpu_unfused")).c_str(), bm,
                                   fused)
          ->Apply(fashionnet_pooled_shapes)
          ->UseRealTime();
    }
  };
  fused_and_unfused("BM_BatchNormMaxPoolForward", BM_BatchNormMaxPoolForward);
  fused_and_unfused("BM_BatchNormMaxPoolBackward", BM_BatchNormMaxPoolBackward);
  benchmark::RegisterBenchmark("BM_CopyReference/cpu_batch64", bench::copy_reference, Device::cpu())
      ->Args({64, 32, 28, 28})
      ->Args({64, 64, 14, 14})
      ->ArgNames({"N", "C", "H", "W"})
      ->UseRealTime();
  register_on(Device::cuda(0));
  return true;
}();

}  // namespace

#if TOWERLAB_WITH_CUDA && TOWERLAB_HAVE_CUDNN
BENCHMARK(BM_CudnnBatchNormForwardTraining)
    ->Name("BM_CudnnBatchNormForwardTraining/cuda")
    ->Apply(bench::gpu_activation_shapes)
    ->UseManualTime();
BENCHMARK(BM_CudnnBatchNormBackward)
    ->Name("BM_CudnnBatchNormBackward/cuda")
    ->Apply(bench::gpu_activation_shapes)
    ->UseManualTime();
#endif
