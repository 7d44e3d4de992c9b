// GEMM against its peers, in the three layouts of training a linear layer
// (NN forward, NT grad of the input, TN grad of the weight), square M = N = K.
//
// CPU: towerlab's blocked GEMM beside OpenBLAS cblas_sgemm in the same process.
// Target: >= 80% of OpenBLAS at 256-2048. Run OpenBLAS at its best (PEERS.md):
//   OPENBLAS_NUM_THREADS=2 OPENBLAS_CORETYPE=<best kernel for the CPU> \
//     ./matmul_bench --benchmark_filter=cpu
// (SkylakeX on AVX-512 machines; on AVX2-only CPUs such as Zen 3, Haswell or Zen
// reach the FMA peak and SkylakeX is not selectable). towerlab uses
// num_threads() threads, hardware_concurrency by default, or TOWERLAB_NUM_THREADS.
// On a shared machine add --benchmark_repetitions=10
// --benchmark_enable_random_interleaving=true and compare the "max" rows.
// Results with their machine and commit: bench/results/matmul_cpu.md.
//
// CUDA: towerlab's kernel beside cuBLAS SGEMM (TF32 off), both through matmul()
// with set_gemm_backend, timed with CUDA events around back-to-back launches
// (bench::time_calls).
// Targets: >= 90% of cuBLAS at 4096, >= 75% at 512-1024.
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/thread_pool.h"
#include "kernels/matmul.h"
#include "towerlab.h"

#if TOWERLAB_HAVE_CBLAS
#include <cblas.h>
#endif

using namespace towerlab;

namespace {

enum class Layout { NN, NT, TN };
bool transpose_a(Layout l) {
  return l == Layout::TN;
}
bool transpose_b(Layout l) {
  return l == Layout::NT;
}

void set_flops(benchmark::State& state, std::int64_t n) {
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

struct Operands {
  Tensor a, b, c;
  Operands(std::int64_t n, const Stream& stream) {
    a = Tensor::empty({n, n}, stream);
    b = Tensor::empty({n, n}, stream);
    c = Tensor::empty({n, n}, stream);
    random_uniform(a, 1, 0, -1.0f, 1.0f, stream);
    random_uniform(b, 2, 0, -1.0f, 1.0f, stream);
    fill(c, 0.0, stream);
  }
};

void BM_CpuTowerlab(benchmark::State& state, Layout layout) {
  const std::int64_t n = state.range(0);
  const Stream& stream = default_stream(Device::cpu());
  Operands x(n, stream);
  for (auto _ : state) {
    matmul(x.c, x.a, x.b, transpose_a(layout), transpose_b(layout), 1.0f, 0.0f, stream);
    benchmark::ClobberMemory();
  }
  set_flops(state, n);
  state.SetLabel(std::to_string(num_threads()) + " threads");
}

#if TOWERLAB_HAVE_CBLAS
void BM_CpuOpenblas(benchmark::State& state, Layout layout) {
  const int n = static_cast<int>(state.range(0));
  const Stream& stream = default_stream(Device::cpu());
  Operands x(n, stream);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, transpose_a(layout) ? CblasTrans : CblasNoTrans,
                transpose_b(layout) ? CblasTrans : CblasNoTrans, n, n, n, 1.0f, x.a.data<float>(),
                n, x.b.data<float>(), n, 0.0f, x.c.data<float>(), n);
    benchmark::ClobberMemory();
  }
  set_flops(state, n);
}
#endif

void BM_Cuda(benchmark::State& state, Layout layout, GemmBackend backend) {
  if (cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const std::int64_t n = state.range(0);
  Stream stream(Device::cuda(0));
  Operands x(n, stream);
  set_gemm_backend(backend);
  bench::time_calls(state, stream, [&] {
    matmul(x.c, x.a, x.b, transpose_a(layout), transpose_b(layout), 1.0f, 0.0f, stream);
  });
  set_gemm_backend(GemmBackend::Towerlab);
  set_flops(state, n);
}

// The fastest repetition is the one least disturbed by other processes, for both
// contenders: run with --benchmark_repetitions=N and compare FLOP/s in the "max"
// rows (their time column is the slowest repetition's; ignore it).
double max_of(const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
}

// Wall time: both libraries run several threads, so CPU time of the main thread
// would flatter them.
void cpu_sizes(benchmark::internal::Benchmark* b) {
  for (int n : {256, 512, 1024, 2048}) b->Arg(n);
  b->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("max", max_of);
}
void cuda_sizes(benchmark::internal::Benchmark* b) {
  for (int n : {512, 1024, 4096}) b->Arg(n);
  b->UseManualTime()->Unit(benchmark::kMillisecond)->ComputeStatistics("max", max_of);
}

// TOWERLAB_NUM_THREADS=n sets towerlab's thread count (to match OPENBLAS_NUM_THREADS).
const bool threads_from_env = [] {
  if (const char* n = std::getenv("TOWERLAB_NUM_THREADS")) set_num_threads(std::atoi(n));
  return true;
}();

}  // namespace

// Peer beside towerlab for each layout, so that the two run back to back.
#if TOWERLAB_HAVE_CBLAS
#define TL_CPU_PAIR(L)                                                     \
  BENCHMARK_CAPTURE(BM_CpuOpenblas, cpu_##L, Layout::L)->Apply(cpu_sizes); \
  BENCHMARK_CAPTURE(BM_CpuTowerlab, cpu_##L, Layout::L)->Apply(cpu_sizes)
#else
#define TL_CPU_PAIR(L) BENCHMARK_CAPTURE(BM_CpuTowerlab, cpu_##L, Layout::L)->Apply(cpu_sizes)
#endif
TL_CPU_PAIR(NN);
TL_CPU_PAIR(NT);
TL_CPU_PAIR(TN);

#define TL_CUDA_PAIR(L)                                                                      \
  BENCHMARK_CAPTURE(BM_Cuda, cublas_##L, Layout::L, GemmBackend::Cublas)->Apply(cuda_sizes); \
  BENCHMARK_CAPTURE(BM_Cuda, cuda_##L, Layout::L, GemmBackend::Towerlab)->Apply(cuda_sizes)
TL_CUDA_PAIR(NN);
TL_CUDA_PAIR(NT);
TL_CUDA_PAIR(TN);
