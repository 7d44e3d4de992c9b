// Bias add against the memory bandwidth it is bound by, on FashionNet's conv
// outputs (batch 128: [128,32,28,28], [128,64,14,14]), a [32,64,56,56] layer and
// a fully connected [128,1024] one.
//
// "bytes": the in-place forward reads and writes x (2|x|); the backward reads
// grad_y (|x|). The reference is a copy of |x| (2|x| bytes: memcpy on the CPU,
// cudaMemcpy device-to-device on CUDA, target >= 85% of its bytes/s).
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include <string>

#include "kernels/bias.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

void BM_BiasAddForward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  Tensor x = bench::random_tensor(shape, stream, 1);
  Tensor bias = bench::random_tensor({shape[1]}, stream, 2, -1e-3f, 1e-3f);  // x drifts slowly
  bench::time_calls(state, stream, [&] { bias_add_forward(x, x, bias, stream); });
  bench::set_bytes(state, shape, 2);
}

void BM_BiasAddBackward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  Tensor grad_y = bench::random_tensor(shape, stream, 1);
  Tensor grad_bias = Tensor::zeros({shape[1]}, stream);
  bench::time_calls(state, stream, [&] { bias_add_backward(grad_bias, grad_y, stream); });
  bench::set_bytes(state, shape, 1);
}

// Bias add and the ReLU after it, forward and backward, fused or as two ops (the
// unfused form with the zero-fill of the gradient between them and the add of it
// into grad_x that ag::bias_add makes). Same bytes counted for both: the fused
// pair's traffic, forward 2|x| and backward 4|x| (grad_y, y, grad_x twice).
void BM_BiasAddReluStep(benchmark::State& state, Device device, bool fused) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  Tensor x = bench::random_tensor(shape, stream, 1),
         grad_y = bench::random_tensor(shape, stream, 2);
  Tensor y = Tensor::empty(shape, stream), grad_z = Tensor::zeros(shape, stream);
  Tensor grad_x = bench::random_tensor(shape, stream, 3);
  Tensor bias = bench::random_tensor({shape[1]}, stream, 4);
  Tensor grad_bias = Tensor::zeros({shape[1]}, stream);
  bench::time_calls(state, stream, [&] {
    if (fused) {
      bias_add_relu_forward(y, x, bias, stream);
      bias_add_relu_backward(grad_x, grad_bias, grad_y, y, stream);
    } else {
      bias_add_forward(y, x, bias, stream);
      relu_forward(y, y, stream);
      fill(grad_z, 0.0, stream);
      relu_backward(grad_z, grad_y, y, stream);
      axpy(grad_x, 1.0, grad_z, stream);
      bias_add_backward(grad_bias, grad_z, stream);
    }
  });
  bench::set_bytes(state, shape, 6);
}

// The activation shapes, and a fully connected layer's [128,1024].
void shapes(benchmark::internal::Benchmark* b) {
  bench::activation_shapes(b);
  b->Args({128, 1024, 0, 0});
  b->Args({128, 128, 0, 0});  // FashionNet's fc1 output
}

// The GPU's: the same, and the large activation (bench::gpu_activation_shapes).
void gpu_shapes(benchmark::internal::Benchmark* b) {
  shapes(b);
  b->Args({128, 64, 56, 56});
}

}  // namespace

namespace {

// The CPU's cases, then cuda:0's: the order of the listing and of the results' JSON.
const bool registered = [] {
  for (Device device : {Device::cpu(), Device::cuda(0)}) {
    const std::string on = bench::device_label(device);
    const bench::ShapesOf both{.cpu = shapes, .gpu = gpu_shapes};
    bench::register_memory_bound("BM_BiasAddForward/" + on, both, BM_BiasAddForward, device);
    bench::register_memory_bound("BM_BiasAddBackward/" + on, both, BM_BiasAddBackward, device);
    for (bool fused : {true, false}) {
      bench::register_memory_bound("BM_BiasAddReluStep/" + on + (fused ? "_fused" : "_unfused"),
                                   both, BM_BiasAddReluStep, device, fused);
    }
    bench::register_memory_bound("BM_CopyReference/" + on, both, bench::copy_reference, device);
  }
  return true;
}();

}  // namespace
