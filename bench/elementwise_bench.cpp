// Elementwise kernels against the memory bandwidth they are bound by: on the CPU
// the bytes/s of a plain memcpy of the same size, on CUDA the device-to-device
// cudaMemcpy (target: >= 85% of it, checked on a GPU in the GPU issue). ReLU and
// GELU run in float32 and in bfloat16 side by side (kernels/relu.h,
// kernels/activation.h: 16-bit storage, float32 math).
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include "towerlab.h"

using namespace towerlab;

namespace {

// add(out, a, b): 12 bytes moved per element.
void BM_Add(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t n = state.range(0);
  Tensor a = bench::random_tensor({n}, stream, 1), b = bench::random_tensor({n}, stream, 2),
         c = Tensor::empty({n}, stream);
  bench::time_calls(state, stream, [&] { add(c, a, b, stream); });
  state.SetBytesProcessed(state.iterations() * n * 12);
}

// The reference: copying n floats reads and writes 8 bytes per element.
void BM_CopyReference(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t n = state.range(0);
  Tensor a = Tensor::zeros({n}, stream), b = Tensor::zeros({n}, stream);
  bench::time_copy_reference(state, b, a, stream);
  state.SetBytesProcessed(state.iterations() * n * 8);
}

void BM_Sum(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t n = state.range(0);
  Tensor a = bench::random_tensor({n}, stream, 1), out = Tensor::zeros({1}, stream);
  bench::time_calls(state, stream, [&] { sum(out, a, stream); });
  state.SetBytesProcessed(state.iterations() * n * 4);
}

// ReLU forward then its accumulating backward, in `dtype`: 6 tensor passes (x read,
// y written; grad_y, y and grad_x read, grad_x written), so 24 bytes per element in
// float32 and 12 in bfloat16 or float16. The 16-bit rows beside the
// float32 ones: "items/s" is elements per second, which a 16-bit kernel that keeps
// the memory's bytes/s doubles.
void BM_ReluStep(benchmark::State& state, Device device, DType dtype) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t n = state.range(0);
  Tensor x = cast(bench::random_tensor({n}, stream, 1), dtype, stream);
  Tensor grad_y = cast(bench::random_tensor({n}, stream, 2), dtype, stream);
  Tensor grad_x = cast(bench::random_tensor({n}, stream, 3), dtype, stream);
  Tensor y = Tensor::empty({n}, stream, dtype);
  bench::time_calls(state, stream, [&] {
    relu_forward(y, x, stream);
    relu_backward(grad_x, grad_y, y, stream);
  });
  state.SetBytesProcessed(state.iterations() * n * 6 * std::int64_t(dtype_size(dtype)));
  state.SetItemsProcessed(state.iterations() * n);
}

// GELU (the erf form) forward, out of place, in `dtype`: compute as well as bytes.
void BM_Gelu(benchmark::State& state, Device device, DType dtype) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const std::int64_t n = state.range(0);
  Tensor x = cast(bench::random_tensor({n}, stream, 1), dtype, stream);
  Tensor y = Tensor::empty({n}, stream, dtype);
  bench::time_calls(state, stream, [&] { activation_forward(y, x, ActivationOp::gelu(), stream); });
  state.SetBytesProcessed(state.iterations() * n * 2 * std::int64_t(dtype_size(dtype)));
  state.SetItemsProcessed(state.iterations() * n);
}

}  // namespace

BENCHMARK_CAPTURE(BM_Add, cpu, Device::cpu())->RangeMultiplier(16)->Range(1 << 12, 1 << 24);
BENCHMARK_CAPTURE(BM_CopyReference, cpu, Device::cpu())
    ->RangeMultiplier(16)
    ->Range(1 << 12, 1 << 24);
BENCHMARK_CAPTURE(BM_Sum, cpu, Device::cpu())->RangeMultiplier(16)->Range(1 << 12, 1 << 24);
BENCHMARK_CAPTURE(BM_Add, cuda, Device::cuda(0))
    ->RangeMultiplier(16)
    ->Range(1 << 16, 1 << 26)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_CopyReference, cuda, Device::cuda(0))
    ->RangeMultiplier(16)
    ->Range(1 << 16, 1 << 26)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Sum, cuda, Device::cuda(0))
    ->RangeMultiplier(16)
    ->Range(1 << 16, 1 << 26)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_ReluStep, cpu_float32, Device::cpu(), DType::Float32)
    ->RangeMultiplier(16)
    ->Range(1 << 12, 1 << 24)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ReluStep, cpu_bfloat16, Device::cpu(), DType::BFloat16)
    ->RangeMultiplier(16)
    ->Range(1 << 12, 1 << 24)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gelu, cpu_float32, Device::cpu(), DType::Float32)
    ->RangeMultiplier(16)
    ->Range(1 << 12, 1 << 24)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gelu, cpu_bfloat16, Device::cpu(), DType::BFloat16)
    ->RangeMultiplier(16)
    ->Range(1 << 12, 1 << 24)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ReluStep, cuda_float32, Device::cuda(0), DType::Float32)
    ->RangeMultiplier(16)
    ->Range(1 << 16, 1 << 26)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_ReluStep, cuda_bfloat16, Device::cuda(0), DType::BFloat16)
    ->RangeMultiplier(16)
    ->Range(1 << 16, 1 << 26)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Gelu, cuda_float32, Device::cuda(0), DType::Float32)
    ->RangeMultiplier(16)
    ->Range(1 << 16, 1 << 26)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Gelu, cuda_bfloat16, Device::cuda(0), DType::BFloat16)
    ->RangeMultiplier(16)
    ->Range(1 << 16, 1 << 26)
    ->UseManualTime();
