// Bias add against the memory bandwidth it is bound by, on FashionNet's conv
// outputs (batch 128: [128,32,28,28], [128,64,14,14]), a [32,64,56,56] layer and
// a fully connected [128,1024] one.
//
// "bytes": the in-place forward reads and writes x (2|x|); the backward reads
// grad_y (|x|). The reference is a copy of |x| (2|x| bytes: memcpy on the CPU,
// cudaMemcpy device-to-device on CUDA, target >= 85% of its bytes/s). The
// forward and backward also run on bfloat16 tensors (a float32 bias), with the
// bytes of that dtype counted.
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include <string>

#include "kernels/bias.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

// x and grad_y in `dtype` (float32, or bfloat16 with a float32 bias: kernels/bias.h);
// "bytes/s" counts the bytes of that dtype, and "items/s" the elements, which is
// what a 16-bit kernel that keeps the bytes/s doubles.
void set_counters(benchmark::State& state, const Shape& shape, double passes, DType dtype) {
  bench::set_bytes(state, shape, passes * double(dtype_size(dtype)) / sizeof(float));
  state.counters["items/s"] = benchmark::Counter(static_cast<double>(numel_of(shape)),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_BiasAddForward(benchmark::State& state, Device device, DType dtype) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  Tensor x = cast(bench::random_tensor(shape, stream, 1), dtype, stream);
  Tensor bias = bench::random_tensor({shape[1]}, stream, 2, -1e-3f, 1e-3f);  // x drifts slowly
  bench::time_calls(state, stream, [&] { bias_add_forward(x, x, bias, stream); });
  set_counters(state, shape, 2, dtype);
}

void BM_BiasAddBackward(benchmark::State& state, Device device, DType dtype) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  Tensor grad_y = cast(bench::random_tensor(shape, stream, 1), dtype, stream);
  Tensor grad_bias = Tensor::zeros({shape[1]}, stream);
  bench::time_calls(state, stream, [&] { bias_add_backward(grad_bias, grad_y, stream); });
  set_counters(state, shape, 1, dtype);
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
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      // float32 keeps its names; the 16-bit rows are "..._bfloat16".
      const std::string suffix =
          dtype == DType::Float32 ? "" : std::string("_") + dtype_name(dtype);
      bench::register_memory_bound("BM_BiasAddForward/" + on + suffix, both, BM_BiasAddForward,
                                   device, dtype);
      bench::register_memory_bound("BM_BiasAddBackward/" + on + suffix, both, BM_BiasAddBackward,
                                   device, dtype);
    }
    for (bool fused : {true, false}) {
      bench::register_memory_bound("BM_BiasAddReluStep/" + on + (fused ? "_fused" : "_unfused"),
                                   both, BM_BiasAddReluStep, device, fused);
    }
    bench::register_memory_bound("BM_CopyReference/" + on, both, bench::copy_reference, device);
  }
  return true;
}();

}  // namespace
