// Elementwise kernels against the memory bandwidth they are bound by: on the CPU
// the bytes/s of a plain memcpy of the same size, on CUDA the device-to-device
// cudaMemcpy (target: >= 85% of it, checked on a GPU in the GPU issue).
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
