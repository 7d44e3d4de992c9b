// 2-D pooling against the memory bandwidth it is bound by, on FashionNet's pooling
// layers (2x2 windows, stride 2, after conv1 [128,32,28,28] and conv2
// [128,64,14,14]) and a [32,64,56,56] layer.
//
// "bytes" counts the unavoidable traffic: the forward reads x and writes y
// (|x| + |x|/4); the backward reads grad_y (|x|/4), reads x for the argmax (max
// only) and reads and writes grad_x (2|x|). The reference is the copy of the same
// number of bytes (memcpy on the CPU, cudaMemcpy device-to-device on CUDA, target
// >= 85% of its bytes/s) and, when TOWERLAB_HAVE_CUDNN, cudnnPoolingForward /
// cudnnPoolingBackward (max, 2x2 stride 2) counted with the same bytes.
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include <stdexcept>
#include <string>

#include "kernels/pool2d.h"
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

const Pool2dParams kPool = Pool2dParams::square(2, 2);

// Bytes moved, as multiples of |x| in quarters (the output is a quarter of x).
void set_bytes(benchmark::State& state, const Shape& shape, int quarters) {
  bench::set_bytes(state, shape, quarters / 4.0);
}

constexpr int kForwardQuarters = 5;       // x + y
constexpr int kMaxBackwardQuarters = 13;  // grad_y + x + grad_x read and written
constexpr int kAvgBackwardQuarters = 9;   // grad_y + grad_x read and written

void BM_MaxPoolForward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  Tensor x = bench::random_tensor(shape, stream, 1),
         y = Tensor::empty(pool2d_output_shape(shape, kPool), stream);
  bench::time_calls(state, stream, [&] { max_pool2d_forward(y, x, kPool, stream); });
  set_bytes(state, shape, kForwardQuarters);
}

void BM_MaxPoolBackward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  Tensor x = bench::random_tensor(shape, stream, 1),
         grad_x = bench::random_tensor(shape, stream, 2);
  Tensor grad_y = bench::random_tensor(pool2d_output_shape(shape, kPool), stream, 3);
  bench::time_calls(state, stream, [&] { max_pool2d_backward(grad_x, grad_y, x, kPool, stream); });
  set_bytes(state, shape, kMaxBackwardQuarters);
}

// Max pooling forward and backward (a training step of the layer): through a
// recorded argmax (the backward reads the argmax, a quarter of |x|, instead of x
// and compares nothing) or recomputing it from x. Same bytes counted for both: the
// recomputing pair's (forward, then backward with x).
void BM_MaxPoolStep(benchmark::State& state, Device device, bool argmax) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  const Shape ys = pool2d_output_shape(shape, kPool);
  Tensor x = bench::random_tensor(shape, stream, 1),
         grad_x = bench::random_tensor(shape, stream, 2);
  Tensor y = Tensor::empty(ys, stream), where = Tensor::empty(ys, stream);
  Tensor grad_y = bench::random_tensor(ys, stream, 3);
  bench::time_calls(state, stream, [&] {
    if (argmax) {
      max_pool2d_forward_with_argmax(y, where, x, kPool, stream);
      max_pool2d_backward_from_argmax(grad_x, grad_y, where, kPool, stream);
    } else {
      max_pool2d_forward(y, x, kPool, stream);
      max_pool2d_backward(grad_x, grad_y, x, kPool, stream);
    }
  });
  set_bytes(state, shape, kForwardQuarters + kMaxBackwardQuarters);
}

void BM_AvgPoolForward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  Tensor x = bench::random_tensor(shape, stream, 1),
         y = Tensor::empty(pool2d_output_shape(shape, kPool), stream);
  bench::time_calls(state, stream, [&] { avg_pool2d_forward(y, x, kPool, stream); });
  set_bytes(state, shape, kForwardQuarters);
}

void BM_AvgPoolBackward(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  Tensor grad_x = bench::random_tensor(shape, stream, 2);
  Tensor grad_y = bench::random_tensor(pool2d_output_shape(shape, kPool), stream, 3);
  bench::time_calls(state, stream, [&] { avg_pool2d_backward(grad_x, grad_y, kPool, stream); });
  set_bytes(state, shape, kAvgBackwardQuarters);
}

// The bandwidth reference: a copy moving as many bytes as the max-pool forward.
void BM_CopyReference(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = bench::nchw_shape(state);
  const std::int64_t n = numel_of(shape) * kForwardQuarters / 8;  // floats copied
  Tensor a = Tensor::zeros({n}, stream), b = Tensor::zeros({n}, stream);
  bench::time_copy_reference(state, b, a, stream);
  state.counters["bytes/s"] = benchmark::Counter(static_cast<double>(n) * sizeof(float) * 2,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

#if TOWERLAB_WITH_CUDA && TOWERLAB_HAVE_CUDNN
// The legacy pooling calls are deprecated in cuDNN 9 but remain the plain reference.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

struct CudnnPool {
  cudnnHandle_t handle{};
  cudnnTensorDescriptor_t x_desc{}, y_desc{};
  cudnnPoolingDescriptor_t pool{};
  CudnnPool(const Shape& x, const Shape& y, const Stream& stream) {
    CUDNN_CHECK(cudnnCreate(&handle));
    CUDNN_CHECK(cudnnSetStream(handle, static_cast<cudaStream_t>(stream.native_handle())));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_desc));
    CUDNN_CHECK(cudnnCreatePoolingDescriptor(&pool));
    auto set = [](cudnnTensorDescriptor_t d, const Shape& s) {
      CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                             static_cast<int>(s[0]), static_cast<int>(s[1]),
                                             static_cast<int>(s[2]), static_cast<int>(s[3])));
    };
    set(x_desc, x);
    set(y_desc, y);
    CUDNN_CHECK(cudnnSetPooling2dDescriptor(pool, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 2, 2,
                                            0, 0, 2, 2));
  }
  ~CudnnPool() {
    cudnnDestroyPoolingDescriptor(pool);
    cudnnDestroyTensorDescriptor(y_desc);
    cudnnDestroyTensorDescriptor(x_desc);
    cudnnDestroy(handle);
  }
};

void BM_CudnnMaxPoolForward(benchmark::State& state) {
  if (bench::skip_without(Device::cuda(0), state)) return;
  Stream stream(Device::cuda(0));
  const Shape shape = bench::nchw_shape(state), out = pool2d_output_shape(shape, kPool);
  CudnnPool p(shape, out, stream);
  Tensor x = bench::random_tensor(shape, stream, 1), y = Tensor::empty(out, stream);
  const float one = 1.0f, zero = 0.0f;
  bench::time_calls(state, stream, [&] {
    CUDNN_CHECK(cudnnPoolingForward(p.handle, p.pool, &one, p.x_desc, x.raw_data(), &zero, p.y_desc,
                                    y.raw_data()));
  });
  set_bytes(state, shape, kForwardQuarters);
}

void BM_CudnnMaxPoolBackward(benchmark::State& state) {
  if (bench::skip_without(Device::cuda(0), state)) return;
  Stream stream(Device::cuda(0));
  const Shape shape = bench::nchw_shape(state), out = pool2d_output_shape(shape, kPool);
  CudnnPool p(shape, out, stream);
  Tensor x = bench::random_tensor(shape, stream, 1), y = Tensor::empty(out, stream);
  Tensor grad_x = bench::random_tensor(shape, stream, 2);
  Tensor grad_y = bench::random_tensor(out, stream, 3);
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnPoolingForward(p.handle, p.pool, &one, p.x_desc, x.raw_data(), &zero, p.y_desc,
                                  y.raw_data()));
  bench::time_calls(state, stream, [&] {
    // cuDNN also reads y to find the argmax; beta = 1 accumulates like towerlab.
    CUDNN_CHECK(cudnnPoolingBackward(p.handle, p.pool, &one, p.y_desc, y.raw_data(), p.y_desc,
                                     grad_y.raw_data(), p.x_desc, x.raw_data(), &one, p.x_desc,
                                     grad_x.raw_data()));
  });
  set_bytes(state, shape, kMaxBackwardQuarters);
}

#pragma GCC diagnostic pop
#endif

}  // namespace

namespace {

// The CPU's cases, then cuda:0's: the order of the listing and of the results' JSON.
const bool registered = [] {
  for (Device device : {Device::cpu(), Device::cuda(0)}) {
    const std::string on = bench::device_label(device);
    const bench::ShapesOf shapes;
    bench::register_memory_bound("BM_MaxPoolForward/" + on, shapes, BM_MaxPoolForward, device);
    bench::register_memory_bound("BM_MaxPoolBackward/" + on, shapes, BM_MaxPoolBackward, device);
    for (bool argmax : {true, false}) {
      bench::register_memory_bound("BM_MaxPoolStep/" + on + (argmax ? "_argmax" : "_recompute"),
                                   shapes, BM_MaxPoolStep, device, argmax);
    }
    bench::register_memory_bound("BM_AvgPoolForward/" + on, shapes, BM_AvgPoolForward, device);
    bench::register_memory_bound("BM_AvgPoolBackward/" + on, shapes, BM_AvgPoolBackward, device);
    bench::register_memory_bound("BM_CopyReference/" + on, shapes, BM_CopyReference, device);
  }
  return true;
}();

}  // namespace

#if TOWERLAB_WITH_CUDA && TOWERLAB_HAVE_CUDNN
BENCHMARK(BM_CudnnMaxPoolForward)
    ->Name("BM_CudnnMaxPoolForward/cuda")
    ->Apply(bench::gpu_activation_shapes)
    ->UseManualTime();
BENCHMARK(BM_CudnnMaxPoolBackward)
    ->Name("BM_CudnnMaxPoolBackward/cuda")
    ->Apply(bench::gpu_activation_shapes)
    ->UseManualTime();
#endif
