// Ring all-reduce bus bandwidth on virtual devices (several towers on one device),
// beside the device-to-device copy bandwidth of the same device measured in the same
// run: the ring moves 2(n-1)/n of the buffer through every member, so its bus
// bandwidth (nccl-tests' definition: busbw = algbw * 2(n-1)/n, algbw = bytes / time)
// is compared with the bandwidth of a copy of all the members' bytes. Also the seeds' reduction to
// one device, and the ring with every chunk copied into a receive buffer before the add (the path
// of members without peer access), for comparison.
//
// Virtual devices share one memory, so the ring's time is bounded by the bytes it
// reads and writes there: per step the n members together touch one buffer length
// 3 times in the reduce-scatter in place (read theirs, read mine, write mine; 5
// through a receive buffer) and 2 times in the all-gather (a copy), over n-1 steps
// each. Counter `mem` is that traffic per second, beside the copy's (read + write
// = 2 x bytes): their ratio is how close the ring comes to the memory's speed.
// busbw cannot come close to the copy's bytes/s on one device: with the copy at
// memory speed, busbw / copy <= 4(n-1) / (n x passes), passes being the buffer
// lengths read and written, 5(n-1) in place: 0.40 for 2 members, 0.20 for 4 (any
// all-reduce that reads and writes each buffer once, 2n passes: 0.50 and 0.375).
// Between real GPUs busbw is the measure of the links.
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
      // Zeros, unlike the other benches' random values: the ring sums the members in
      // place, so any other values would grow n-fold a call, to infinity within a
      // few hundred calls.
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

// Bytes the ring reads and writes in one all-reduce of `bytes` per member when all
// members share one memory (the passes in parallel/ring_allreduce.h's opening
// comment): one launch reads every member once and writes every member once; the
// steps take 5 passes per member and step in place (3 to add, 2 to copy), 7 through
// a receive buffer.
double ring_traffic(std::int64_t bytes, int n, Device device, RingReads reads,
                    RingOnOneGpu one_gpu) {
  if (device.is_cuda() && reads == RingReads::InPlace && one_gpu == RingOnOneGpu::OneLaunch)
    return double(bytes) * 2 * n;
  const int reduce_scatter = reads == RingReads::InPlace ? 3 : 5, all_gather = 2;
  return double(bytes) * (n - 1) * (reduce_scatter + all_gather);
}

// `contributions`: the ring's reduce-scatter in float32, or in bfloat16 contributions
// (parallel/ring_contributions.h: a rounding pass, each owner's widening and adds,
// then the float32 all-gather), whose memory traffic is not the passes above: its
// `mem` counter is left out.
void BM_RingAllReduce(benchmark::State& state, Device device, RingReads reads, RingOnOneGpu one_gpu,
                      DType contributions = DType::Float32) {
  if (bench::skip_without(device, state)) return;
  const int n = int(state.range(0));
  const std::int64_t bytes = state.range(1);
  Members m(device, n, bytes / 4);
  Ring ring(m.raw, reads, one_gpu, contributions);
  bench::time_calls(state, m.raw, [&] { ring.allreduce(m.buffers); });
  report(state, bytes, n);
  if (contributions != DType::Float32) return;
  state.counters["mem"] = benchmark::Counter(ring_traffic(bytes, n, device, reads, one_gpu),
                                             benchmark::Counter::kIsIterationInvariantRate);
}

void BM_ReduceAndBroadcast(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  const int n = int(state.range(0));
  const std::int64_t bytes = state.range(1);
  Members m(device, n, bytes / 4);
  bench::time_calls(state, m.raw, [&] { reduce_and_broadcast(m.raw, m.buffers, 0); });
  report(state, bytes, n);
}

// The reference: one copy within the device of all the members' bytes together
// (n x bytes). The ring in one launch reads and writes every member once, as the
// copy reads and writes its buffer once, so on one memory this copy is the bound of
// any schedule, with the ring's footprint in the cache: a copy of one member's
// 16 MiB stays in an H100's 50 MB L2, where four members' 64 MiB do not, and
// would set a bound faster than the memory the ring has to use.
void BM_CopyReference(benchmark::State& state, Device device) {
  if (bench::skip_without(device, state)) return;
  const std::int64_t bytes = state.range(0) * state.range(1);
  Stream stream(device);
  Tensor a = Tensor::zeros({bytes / 4}, stream), b = Tensor::zeros({bytes / 4}, stream);
  bench::time_copy_reference(state, b, a, stream);
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["mem"] =
      benchmark::Counter(2.0 * double(bytes), benchmark::Counter::kIsIterationInvariantRate);
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

BENCHMARK_CAPTURE(BM_RingAllReduce, cpu, Device::cpu(), RingReads::InPlace, RingOnOneGpu::OneLaunch)
    ->Apply(cpu_args);
BENCHMARK_CAPTURE(BM_RingAllReduce, cpu_receive_buffer, Device::cpu(),
                  RingReads::ThroughReceiveBuffer, RingOnOneGpu::Steps)
    ->Apply(cpu_args);
BENCHMARK_CAPTURE(BM_RingAllReduce, cpu_bf16_contributions, Device::cpu(), RingReads::InPlace,
                  RingOnOneGpu::OneLaunch, DType::BFloat16)
    ->Apply(cpu_args);
BENCHMARK_CAPTURE(BM_ReduceAndBroadcast, cpu, Device::cpu())->Apply(cpu_args);
BENCHMARK_CAPTURE(BM_CopyReference, cpu, Device::cpu())->Apply(cpu_args);
BENCHMARK_CAPTURE(BM_RingAllReduce, cuda, Device::cuda(0), RingReads::InPlace,
                  RingOnOneGpu::OneLaunch)
    ->Apply(cuda_args);
BENCHMARK_CAPTURE(BM_RingAllReduce, cuda_steps, Device::cuda(0), RingReads::InPlace,
                  RingOnOneGpu::Steps)
    ->Apply(cuda_args);
BENCHMARK_CAPTURE(BM_RingAllReduce, cuda_bf16_contributions, Device::cuda(0), RingReads::InPlace,
                  RingOnOneGpu::OneLaunch, DType::BFloat16)
    ->Apply(cuda_args);
BENCHMARK_CAPTURE(BM_RingAllReduce, cuda_receive_buffer, Device::cuda(0),
                  RingReads::ThroughReceiveBuffer, RingOnOneGpu::Steps)
    ->Apply(cuda_args);
BENCHMARK_CAPTURE(BM_ReduceAndBroadcast, cuda, Device::cuda(0))->Apply(cuda_args);
BENCHMARK_CAPTURE(BM_CopyReference, cuda, Device::cuda(0))->Apply(cuda_args);
