// Ring all-reduce bus bandwidth on virtual devices (several towers on one device),
// beside the device-to-device copy bandwidth of the same device measured in the same
// run: the ring moves 2(n-1)/n of the buffer through every member, so its bus
// bandwidth (nccl-tests' definition: busbw = algbw * 2(n-1)/n, algbw = bytes / time)
// is compared with one copy's bandwidth. Target on a GPU: busbw >= 80% of the copy.
// Also the seeds' reduction to one device, for comparison.
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include <cstring>
#include <memory>

#include "towerlab.h"

#if TOWERLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif

using namespace towerlab;

namespace {

struct Members {
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<const Stream*> raw;
  std::vector<Tensor> buffers;
  Members(Device device, int n, std::int64_t floats) {
    for (int i = 0; i < n; ++i) {
      streams.push_back(std::make_unique<Stream>(device));
      raw.push_back(streams.back().get());
      buffers.push_back(Tensor::zeros({floats}, *streams.back()));
    }
  }
};

void report(benchmark::State& state, std::int64_t bytes, int n) {
  state.SetBytesProcessed(state.iterations() * bytes);  // algbw
  state.counters["busbw"] = benchmark::Counter(double(bytes) * 2.0 * (n - 1) / n,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["towers"] = n;
}

void BM_RingAllReduce(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  const int n = int(state.range(0));
  const std::int64_t bytes = state.range(1);
  Members m(device, n, bytes / 4);
  Ring ring(m.raw);
  bench::time_calls(state, m.raw, [&] { ring.allreduce(m.buffers); });
  report(state, bytes, n);
}

void BM_ReduceToOne(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  const int n = int(state.range(0));
  const std::int64_t bytes = state.range(1);
  Members m(device, n, bytes / 4);
  Ring ring(m.raw);
  bench::time_calls(state, m.raw, [&] { ring.reduce_to_one(m.buffers, 0); });
  report(state, bytes, n);
}

// The reference: one copy of the buffer within the device.
void BM_CopyReference(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  const std::int64_t bytes = state.range(1);
  Stream stream(device);
  Tensor a = Tensor::zeros({bytes / 4}, stream), b = Tensor::zeros({bytes / 4}, stream);
  bench::time_copy_reference(state, b, a, stream);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void cpu_args(benchmark::internal::Benchmark* b) {
  for (int n : {2, 4}) {
    for (std::int64_t mb : {1, 16, 64}) b->Args({n, mb << 20});
  }
  b->UseRealTime();
}

void cuda_args(benchmark::internal::Benchmark* b) {
  for (int n : {2, 4, 8}) {
    for (std::int64_t mb : {1, 4, 16, 64, 256}) b->Args({n, mb << 20});
  }
  b->UseManualTime();
}

}  // namespace

BENCHMARK_CAPTURE(BM_RingAllReduce, cpu, Device::cpu())->Apply(cpu_args);
BENCHMARK_CAPTURE(BM_ReduceToOne, cpu, Device::cpu())->Apply(cpu_args);
BENCHMARK_CAPTURE(BM_CopyReference, cpu, Device::cpu())->Apply(cpu_args);
BENCHMARK_CAPTURE(BM_RingAllReduce, cuda, Device::cuda(0))->Apply(cuda_args);
BENCHMARK_CAPTURE(BM_ReduceToOne, cuda, Device::cuda(0))->Apply(cuda_args);
BENCHMARK_CAPTURE(BM_CopyReference, cuda, Device::cuda(0))->Apply(cuda_args);
