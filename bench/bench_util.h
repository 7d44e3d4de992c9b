// Helpers every bench program shares: skipping CUDA cases where there is no GPU,
// and the copy that memory-bound kernels are measured against.
#pragma once

#include <benchmark/benchmark.h>

#include "towerlab.h"

namespace towerlab::bench {

// True, with the benchmark marked skipped, when `device` is a GPU that is not here.
inline bool skip_without(Device device, benchmark::State& state) {
  if (device.is_cuda() && cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

// The reference of the memory-bound kernels: one copy of src into dst within the
// device (cudaMemcpyAsync device-to-device on a GPU, memmove on the CPU), waited for.
inline void copy_reference(const Tensor& dst, const Tensor& src, const Stream& stream) {
  copy_tensor(dst, src, stream);
  stream.synchronize();
  benchmark::ClobberMemory();
}

// The activation shapes the memory-bound CNN kernels are measured on: FashionNet's
// two conv outputs at batch 128 and a 64-channel 56x56 layer at batch 32, as
// benchmark arguments N, C, H, W (read back with nchw_shape).
inline void activation_shapes(benchmark::internal::Benchmark* b) {
  b->Args({128, 32, 28, 28})->Args({128, 64, 14, 14})->Args({32, 64, 56, 56});
  b->ArgNames({"N", "C", "H", "W"})->UseRealTime();
}

// [N,C,H,W] from the benchmark's four arguments; H = 0 marks a fully connected [N,C].
inline Shape nchw_shape(const benchmark::State& state) {
  Shape s = {state.range(0), state.range(1), state.range(2), state.range(3)};
  if (s[2] == 0) s.resize(2);
  return s;
}

// Times fn (one call) and reports `bytes` per call. On the CPU each iteration is one
// call; on CUDA each iteration is kCudaRepeats calls timed with events (register
// the benchmark with UseManualTime()), so the GPU never waits for the host.
constexpr int kCudaRepeats = 20;
template <typename Fn>
void time_calls(benchmark::State& state, const Stream& stream, std::int64_t bytes, Fn&& fn) {
  fn();  // warm-up
  stream.synchronize();
  std::int64_t calls = 0;
  if (stream.device().is_cpu()) {
    for (auto _ : state) {
      fn();
      benchmark::ClobberMemory();
    }
    calls = state.iterations();
  } else {
    Event start(stream.device(), true), end(stream.device(), true);
    for (auto _ : state) {
      start.record(stream);
      for (int r = 0; r < kCudaRepeats; ++r) fn();
      end.record(stream);
      end.synchronize();
      state.SetIterationTime(Event::elapsed_ms(start, end) / 1e3);
    }
    calls = state.iterations() * kCudaRepeats;
  }
  state.SetBytesProcessed(calls * bytes);
}

}  // namespace towerlab::bench
