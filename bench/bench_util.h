// Helpers every bench program shares: skipping CUDA cases where there is no GPU,
// the one timing loop (time_calls), the copy that memory-bound kernels are
// measured against, their bytes/s counter and their registration on both devices.
#pragma once

#include <benchmark/benchmark.h>

#include <string>
#include <utility>
#include <vector>

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

// The activation shapes the memory-bound CNN kernels are measured on: FashionNet's
// two conv outputs at batch 128 and a 64-channel 56x56 layer at batch 32, as
// benchmark arguments N, C, H, W (read back with nchw_shape). The registration
// adds the clock: UseRealTime() on the CPU, UseManualTime() on CUDA (time_calls).
inline void activation_shapes(benchmark::internal::Benchmark* b) {
  b->Args({128, 32, 28, 28})->Args({128, 64, 14, 14})->Args({32, 64, 56, 56});
  b->ArgNames({"N", "C", "H", "W"});
}

// The GPU's shapes: those, and a 64-channel 56x56 layer at batch 128 whose tensors
// (103 MB each) are twice the H100's 50 MB L2, so that a kernel and the copy it is
// measured against both stream through HBM: the "large tensor" of the memory-bound
// targets. On the smaller shapes the copy's source and destination stay in L2 in
// part or whole, and a kernel that moves more bytes than the copy is measured
// against L2's bandwidth instead of the device's.
inline void gpu_activation_shapes(benchmark::internal::Benchmark* b) {
  activation_shapes(b);
  b->Args({128, 64, 56, 56});
}

// The arguments a memory-bound kernel is measured on, per device (a function that
// adds them to a registration, as Benchmark::Apply takes).
struct ShapesOf {
  void (*cpu)(benchmark::internal::Benchmark*) = activation_shapes;
  void (*gpu)(benchmark::internal::Benchmark*) = gpu_activation_shapes;
};

// Registers fn(state, device, extra...) as `name` ("BM_Op/cpu", "BM_Op/cuda_fused":
// the names BENCHMARK_CAPTURE gives) with the device's shapes and clock:
// UseRealTime() on the CPU (the kernels use the thread pool), UseManualTime() on a
// GPU (time_calls' events).
template <typename Fn, typename... Extra>
benchmark::internal::Benchmark* register_memory_bound(const std::string& name,
                                                      const ShapesOf& shapes, Fn fn, Device device,
                                                      Extra... extra) {
  benchmark::internal::Benchmark* b =
      benchmark::RegisterBenchmark(name.c_str(), fn, device, extra...);
  if (device.is_cpu()) return b->Apply(shapes.cpu)->UseRealTime();
  return b->Apply(shapes.gpu)->UseManualTime();
}

// "cpu" or "cuda": the device part of a bench's name.
inline std::string device_label(Device device) {
  return device.is_cpu() ? "cpu" : "cuda";
}

// The "bytes/s" counter of a memory-bound kernel that moves `passes` times the
// float tensor of `shape` per call.
inline void set_bytes(benchmark::State& state, const Shape& shape, double passes) {
  state.counters["bytes/s"] =
      benchmark::Counter(static_cast<double>(numel_of(shape)) * sizeof(float) * passes,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// [N,C,H,W] from the benchmark's four arguments; H = 0 marks a fully connected [N,C].
inline Shape nchw_shape(const benchmark::State& state) {
  Shape s = {state.range(0), state.range(1), state.range(2), state.range(3)};
  if (s[2] == 0) s.resize(2);
  return s;
}

// Runs the benchmark loop with one call of fn per iteration, so that the time
// column is the time of one call and per-call counters (bytes, FLOPs) stay per
// iteration. fn only submits work to `streams` (the first one is the timing
// stream). Two calls first warm the caches and the allocator (and on a GPU load
// the modules and set up library handles).
//
// CPU: a stream is the calling thread, so a call has finished when it returns;
// the loop's own clock times it (register with UseRealTime() where fn uses the
// thread pool).
//
// CUDA (register with UseManualTime()): the calls go back to back, nothing waits
// between them, and one pair of CUDA events around the whole loop gives their GPU
// time. A synchronize per call would add the host's round trip to every call and
// leave the GPU idle between them. The last iteration waits for the GPU and hands
// Google Benchmark the loop's total in one SetIterationTime: the library adds up
// the times it is given, so each iteration gets its share (a time per iteration
// could only be measured with a synchronize per iteration). Waiting inside the
// loop also keeps the loop's wall-clock time right.
template <typename Fn>
void time_calls(benchmark::State& state, const std::vector<const Stream*>& streams, Fn&& fn) {
  constexpr int kWarmUpCalls = 2;
  for (int i = 0; i < kWarmUpCalls; ++i) fn();
  for (const Stream* s : streams) s->synchronize();
  const Stream& timing = *streams.front();
  if (timing.device().is_cpu()) {
    for (auto _ : state) {
      fn();
      benchmark::ClobberMemory();
    }
    return;
  }
  Event start(timing.device(), true), stop(timing.device(), true);
  std::vector<Event> done;  // the other streams' ends, for the timing stream to wait on
  for (std::size_t i = 1; i < streams.size(); ++i) done.emplace_back(streams[i]->device());
  benchmark::IterationCount left = state.max_iterations;
  start.record(timing);  // every stream is idle here, so nothing runs before start
  for (auto _ : state) {
    fn();
    if (--left > 0) continue;
    for (std::size_t i = 1; i < streams.size(); ++i) {
      done[i - 1].record(*streams[i]);
      timing.wait(done[i - 1]);
    }
    stop.record(timing);
    stop.synchronize();
    state.SetIterationTime(Event::elapsed_ms(start, stop) / 1e3);
  }
}

// time_calls on one stream.
template <typename Fn>
void time_calls(benchmark::State& state, const Stream& stream, Fn&& fn) {
  time_calls(state, std::vector<const Stream*>{&stream}, std::forward<Fn>(fn));
}

// A tensor of the values a bench times a kernel on: uniform in [low, high), drawn
// from `seed`. Never zeros: a kernel can run at another speed on zeros than on
// real data (hardware that compresses or skips zeros, branches that all go one
// way, max-pool windows that are all ties), and a zero output hides a kernel
// that wrote nothing.
inline Tensor random_tensor(const Shape& shape, const Stream& stream, std::uint64_t seed,
                            float low = -1.0f, float high = 1.0f) {
  Tensor t = Tensor::empty(shape, stream);
  random_uniform(t, seed, 0, low, high, stream);
  return t;
}

// The reference of the memory-bound kernels: copies of src into dst within the
// device (cudaMemcpyAsync device-to-device on a GPU, memmove on the CPU), timed
// as time_calls times the kernels. src is filled with random_tensor's values first.
inline void time_copy_reference(benchmark::State& state, const Tensor& dst, const Tensor& src,
                                const Stream& stream) {
  random_uniform(src, 0x5eed, 0, -1.0f, 1.0f, stream);
  time_calls(state, stream, [&] { copy_tensor(dst, src, stream); });
}

// The bench of that reference on the benchmark's [N,C,H,W]: a copy of one such
// tensor, 2 |x| bytes, registered as BM_CopyReference beside the kernels it bounds.
inline void copy_reference(benchmark::State& state, Device device) {
  if (skip_without(device, state)) return;
  Stream stream(device);
  const Shape shape = nchw_shape(state);
  Tensor a = Tensor::zeros(shape, stream), b = Tensor::zeros(shape, stream);
  time_copy_reference(state, b, a, stream);
  set_bytes(state, shape, 2);
}

}  // namespace towerlab::bench
