// Fused optimizer updates against the memory bandwidth they are bound by. Each
// update streams its buffers once, so its bytes/s is compared with a copy of the
// same size in the same run: on the CPU a plain memcpy, on CUDA the device-to-device
// cudaMemcpy (target: >= 85% of its bytes/s). Sizes: FashionNet's ~430k parameters
// (which fit in an H100's 50 MB L2) and 16M (which does not).
// Bytes per element: SGD with momentum 20 (p, g, v read; p, v written), RMSProp 28
// (36 centered), Adam 28, the copy 8.
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include "kernels/optimizer.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

// Times fn (one update of n elements, bench::time_calls) and reports
// bytes_per_element * n bytes per update.
template <typename Fn>
void run(benchmark::State& state, const Stream& stream, std::int64_t bytes_per_element, Fn&& fn) {
  bench::time_calls(state, stream, fn);
  state.SetBytesProcessed(state.iterations() * state.range(0) * bytes_per_element);
}

void BM_SgdMomentum(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape{state.range(0)};
  Tensor p = bench::random_tensor(shape, stream, 1), g = bench::random_tensor(shape, stream, 2);
  Tensor v = bench::random_tensor(shape, stream, 3);
  const SgdParams h{.lr = 0.01, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true};
  run(state, stream, 20, [&] { sgd_update(p, g, v, h, stream); });
}

void BM_Rmsprop(benchmark::State& state, Device device, bool centered) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape{state.range(0)};
  Tensor p = bench::random_tensor(shape, stream, 1), g = bench::random_tensor(shape, stream, 2);
  // The mean square is positive, and above the centered form's squared mean gradient.
  Tensor ms = bench::random_tensor(shape, stream, 3, 1.0f, 2.0f);
  Tensor mom = bench::random_tensor(shape, stream, 4);
  Tensor mg = centered ? bench::random_tensor(shape, stream, 5, -0.5f, 0.5f) : Tensor();
  const RmspropParams h{.lr = 0.01, .momentum = 0.9, .epsilon = 1.0, .centered = centered};
  run(state, stream, centered ? 36 : 28, [&] { rmsprop_update(p, g, ms, mom, mg, h, stream); });
}

void BM_Adam(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape{state.range(0)};
  Tensor p = bench::random_tensor(shape, stream, 1), g = bench::random_tensor(shape, stream, 2);
  Tensor m = bench::random_tensor(shape, stream, 3);
  Tensor v = bench::random_tensor(shape, stream, 4, 0.0f, 1.0f);  // a second moment: >= 0
  std::int64_t step = 0;
  run(state, stream, 28, [&] { adamw_update(p, g, m, v, ++step, {.weight_decay = 0.01}, stream); });
}

// The reference: copying n floats reads and writes 8 bytes per element.
void BM_CopyReference(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape{state.range(0)};
  Tensor a = Tensor::zeros(shape, stream), b = Tensor::zeros(shape, stream);
  bench::time_copy_reference(state, b, a, stream);
  state.SetBytesProcessed(state.iterations() * state.range(0) * 8);
}

constexpr std::int64_t kFashionNetParams = 430000;

}  // namespace

BENCHMARK_CAPTURE(BM_SgdMomentum, cpu, Device::cpu())->Arg(kFashionNetParams)->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Rmsprop, cpu, Device::cpu(), false)->Arg(kFashionNetParams)->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Rmsprop, cpu_centered, Device::cpu(), true)->Arg(kFashionNetParams);
BENCHMARK_CAPTURE(BM_Adam, cpu, Device::cpu())->Arg(kFashionNetParams)->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_CopyReference, cpu, Device::cpu())->Arg(kFashionNetParams)->Arg(1 << 22);

BENCHMARK_CAPTURE(BM_SgdMomentum, cuda, Device::cuda(0))
    ->Arg(kFashionNetParams)
    ->Arg(1 << 24)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Rmsprop, cuda, Device::cuda(0), false)
    ->Arg(kFashionNetParams)
    ->Arg(1 << 24)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Rmsprop, cuda_centered, Device::cuda(0), true)
    ->Arg(kFashionNetParams)
    ->Arg(1 << 24)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Adam, cuda, Device::cuda(0))
    ->Arg(kFashionNetParams)
    ->Arg(1 << 24)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_CopyReference, cuda, Device::cuda(0))
    ->Arg(kFashionNetParams)
    ->Arg(1 << 24)
    ->UseManualTime();
