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
// BF16 (issue 46): A and B bfloat16, C float32 (kernels/matmul.h's mixed
// precision; the vdpbf16ps kernel where the CPU has AVX-512 BF16), beside
// towerlab's own float32 GEMM of the same size, in the same layouts, at 512 and
// 1024. Target: >= 1.7x the float32 GEMM's FLOP/s on 2 threads. Run them alone,
// alternated:
//   TOWERLAB_NUM_THREADS=2 ./matmul_bench --benchmark_filter='cpu_(fp32|bf16)' \
//     --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true
// and compare the "max" rows. Results: bench/results/matmul_bf16_*.json.
//
// CUDA: towerlab's kernel beside cuBLAS SGEMM (TF32 off), both through matmul()
// with set_gemm_backend, timed with CUDA events around back-to-back launches
// (bench::time_calls).
// Targets: >= 90% of cuBLAS at 4096, >= 75% at 512-1024. Also FashionNet's fc1
// (3136 -> 128) at a tower's batch of 128 in the three layouts of y = x w^T:
// forward NT [128,128,3136] (one tile of C: the split-K path), grad_x NN
// [128,3136,128] and grad_w TN [128,3136,128] (args M/N/K).
//
// CUDA, 16-bit (issue 46): towerlab's tensor-core GEMM (kernels/cuda/matmul_tc.cu)
// beside cublasGemmEx, both with bfloat16 or float16 A and B, a float32 C and
// float32 sums (CUBLAS_COMPUTE_32F), NN, NT and TN at 512, 1024 and 4096. Targets
// (issue 44): >= 75 % of cuBLAS at 512-1024, >= 70 % at 4096, and >= 8x towerlab's
// own SGEMM at 4096 (the cuda_* rows above). Compare the "max" FLOP/s rows:
//   ./matmul_bench --benchmark_filter='(cublas|cuda)_(bf16|fp16)' --benchmark_repetitions=5
// On the emulated GPUs only towerlab's side builds (the emulated cuBLAS has no
// GemmEx); there `--benchmark_filter=cuda_bf16_NN/512` runs the kernel as a smoke
// test (slowly: every thread on the CPU).
//
// CUDA, TF32 (issue 46): the same kernel on float32 A, B and C with
// Float32Math::Tf32 (operands rounded to TF32, mma.sync m16n8k8, float32 sums)
// beside cublasSgemm under CUBLAS_TF32_TENSOR_OP_MATH, NN, NT and TN at 512, 1024
// and 4096; the cuda_* float32 rows above are the same products without TF32:
//   ./matmul_bench --benchmark_filter='(cublas|cuda)_tf32' --benchmark_repetitions=5
// Both sides build on the emulated GPUs (the emulated cuBLAS rounds to TF32 under
// that math mode), where they are smoke tests only.
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/thread_pool.h"
#include "kernels/matmul.h"
#include "towerlab.h"

#if TOWERLAB_HAVE_CBLAS
#include <cblas.h>
#endif
#if TOWERLAB_WITH_CUDA
#include <cublas_v2.h>  // the emulator's defines TOWERLAB_EMULATED_CUDA

#include "engine/cuda_check.h"
#if !defined(TOWERLAB_EMULATED_CUDA)
#define TL_BENCH_GEMM_EX 1
#endif
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

void set_flops(benchmark::State& state, std::int64_t m, std::int64_t n, std::int64_t k) {
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
}

// op(A) [M,K], op(B) [K,N], C [M,N], stored as the layout says.
struct Operands {
  Tensor a, b, c;
  Operands(std::int64_t m, std::int64_t n, std::int64_t k, Layout layout, const Stream& stream) {
    a = Tensor::empty(transpose_a(layout) ? Shape{k, m} : Shape{m, k}, stream);
    b = Tensor::empty(transpose_b(layout) ? Shape{n, k} : Shape{k, n}, stream);
    c = Tensor::empty({m, n}, stream);
    random_uniform(a, 1, 0, -1.0f, 1.0f, stream);
    random_uniform(b, 2, 0, -1.0f, 1.0f, stream);
    fill(c, 0.0, stream);
  }
};

void BM_CpuTowerlab(benchmark::State& state, Layout layout) {
  const std::int64_t n = state.range(0);
  const Stream& stream = default_stream(Device::cpu());
  Operands x(n, n, n, layout, stream);
  for (auto _ : state) {
    matmul(x.c, x.a, x.b, transpose_a(layout), transpose_b(layout), 1.0f, 0.0f, stream);
    benchmark::ClobberMemory();
  }
  set_flops(state, n, n, n);
  state.SetLabel(std::to_string(num_threads()) + " threads");
}

// The same product from bfloat16 A and B (rounded from the float32 operands), into
// a float32 C, or a bfloat16 one with `bf16_out`, with `kernel` (the vdpbf16ps
// kernel, or the values widened for the float32 one).
void BM_CpuTowerlabBf16(benchmark::State& state, Layout layout, bool bf16_out,
                        Bf16GemmKernel kernel) {
  const std::int64_t n = state.range(0);
  if (!bf16_gemm_kernel_supported(kernel)) {
    state.SkipWithError("this CPU does not report avx512_bf16");
    return;
  }
  const Bf16GemmKernel saved = bf16_gemm_kernel();
  set_bf16_gemm_kernel(kernel);
  const Stream& stream = default_stream(Device::cpu());
  Operands x(n, n, n, layout, stream);
  const Tensor a = cast(x.a, DType::BFloat16, stream), b = cast(x.b, DType::BFloat16, stream);
  const Tensor c = bf16_out ? cast(x.c, DType::BFloat16, stream) : x.c;
  for (auto _ : state) {
    matmul(c, a, b, transpose_a(layout), transpose_b(layout), 1.0f, 0.0f, stream);
    benchmark::ClobberMemory();
  }
  set_bf16_gemm_kernel(saved);
  set_flops(state, n, n, n);
  state.SetLabel(std::to_string(num_threads()) + " threads, " +
                 (kernel == Bf16GemmKernel::Avx512Bf16 ? "vdpbf16ps" : "widened to float32"));
}

#if TOWERLAB_HAVE_CBLAS
void BM_CpuOpenblas(benchmark::State& state, Layout layout) {
  const int n = static_cast<int>(state.range(0));
  const Stream& stream = default_stream(Device::cpu());
  Operands x(n, n, n, layout, stream);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, transpose_a(layout) ? CblasTrans : CblasNoTrans,
                transpose_b(layout) ? CblasTrans : CblasNoTrans, n, n, n, 1.0f, x.a.data<float>(),
                n, x.b.data<float>(), n, 0.0f, x.c.data<float>(), n);
    benchmark::ClobberMemory();
  }
  set_flops(state, n, n, n);
}
#endif

void BM_Cuda(benchmark::State& state, Layout layout, GemmBackend backend) {
  if (cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Stream stream(Device::cuda(0));
  Operands x(m, n, k, layout, stream);
  set_gemm_backend(backend);
  bench::time_calls(state, stream, [&] {
    matmul(x.c, x.a, x.b, transpose_a(layout), transpose_b(layout), 1.0f, 0.0f, stream);
  });
  set_gemm_backend(GemmBackend::Towerlab);
  set_flops(state, m, n, k);
}

#if TOWERLAB_WITH_CUDA
// A cuBLAS handle for the peer rows: on `stream`, in math mode `math`.
class BenchCublas {
 public:
  BenchCublas(const Stream& stream, cublasMath_t math) {
    TL_CUBLAS_CHECK(cublasCreate(&handle_));
    TL_CUBLAS_CHECK(cublasSetMathMode(handle_, math));
    TL_CUBLAS_CHECK(cublasSetStream(handle_, static_cast<cudaStream_t>(stream.native_handle())));
  }
  ~BenchCublas() {
    if (cublasDestroy(handle_) != CUBLAS_STATUS_SUCCESS)
      std::fprintf(stderr, "cublasDestroy failed\n");
  }
  BenchCublas(const BenchCublas&) = delete;
  BenchCublas& operator=(const BenchCublas&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};
#endif

// The 16-bit product, op(A) and op(B) in `dtype`, C float32: towerlab's matmul()
// (the tensor cores), or cublasGemmEx with `cublas`.
void BM_Cuda16(benchmark::State& state, Layout layout, DType dtype, bool cublas) {
  if (bench::skip_without(Device::cuda(0), state)) return;
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Stream stream(Device::cuda(0));
  Operands x(m, n, k, layout, stream);
  const Tensor a = cast(x.a, dtype, stream), b = cast(x.b, dtype, stream);
  const bool ta = transpose_a(layout), tb = transpose_b(layout);
  if (!cublas) {
    bench::time_calls(state, stream, [&] { matmul(x.c, a, b, ta, tb, 1.0f, 0.0f, stream); });
    set_flops(state, m, n, k);
    return;
  }
#if TL_BENCH_GEMM_EX
  const BenchCublas handle(stream, CUBLAS_DEFAULT_MATH);
  const cudaDataType_t type = dtype == DType::BFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major cuBLAS computes C^T = op(B)^T op(A)^T (kernels/cuda/matmul.cu).
  bench::time_calls(state, stream, [&] {
    TL_CUBLAS_CHECK(cublasGemmEx(
        handle.get(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
        static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b.raw_data(), type,
        static_cast<int>(b.size(1)), a.raw_data(), type, static_cast<int>(a.size(1)), &beta,
        x.c.raw_data(), CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  set_flops(state, m, n, k);
#else
  state.SkipWithError("no cublasGemmEx in this build (the emulated cuBLAS has SGEMM only)");
#endif
}

// The float32 product on TF32 tensor cores: towerlab's matmul() with
// Float32Math::Tf32, or cublasSgemm under CUBLAS_TF32_TENSOR_OP_MATH with `cublas`.
void BM_CudaTf32(benchmark::State& state, Layout layout, bool cublas) {
  if (bench::skip_without(Device::cuda(0), state)) return;
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Stream stream(Device::cuda(0));
  Operands x(m, n, k, layout, stream);
  const bool ta = transpose_a(layout), tb = transpose_b(layout);
  if (!cublas) {
    bench::time_calls(state, stream, [&] {
      matmul(x.c, x.a, x.b, ta, tb, 1.0f, 0.0f, stream, Float32Math::Tf32);
    });
    set_flops(state, m, n, k);
    return;
  }
#if TOWERLAB_WITH_CUDA
  const BenchCublas handle(stream, CUBLAS_TF32_TENSOR_OP_MATH);
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major cuBLAS computes C^T = op(B)^T op(A)^T (kernels/cuda/matmul.cu).
  bench::time_calls(state, stream, [&] {
    TL_CUBLAS_CHECK(
        cublasSgemm(handle.get(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                    static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha,
                    x.b.data<float>(), static_cast<int>(x.b.size(1)), x.a.data<float>(),
                    static_cast<int>(x.a.size(1)), &beta, x.c.data<float>(), static_cast<int>(n)));
  });
  set_flops(state, m, n, k);
#endif
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
void lowp_sizes(benchmark::internal::Benchmark* b) {
  for (int n : {512, 1024}) b->Arg(n);
  b->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("max", max_of);
}
void cuda_sizes(benchmark::internal::Benchmark* b) {
  for (int n : {512, 1024, 4096}) b->Args({n, n, n});
  b->UseManualTime()->Unit(benchmark::kMillisecond)->ComputeStatistics("max", max_of);
}
void fc1_forward(benchmark::internal::Benchmark* b) {
  b->Args({128, 128, 3136});
  b->UseManualTime()->Unit(benchmark::kMicrosecond)->ComputeStatistics("max", max_of);
}
void fc1_backward(benchmark::internal::Benchmark* b) {
  b->Args({128, 3136, 128});
  b->UseManualTime()->Unit(benchmark::kMicrosecond)->ComputeStatistics("max", max_of);
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

// BF16 beside towerlab's float32 GEMM, each layout: vdpbf16ps into float32 and
// into bfloat16, and the widening path.
#define TL_CPU_BF16(L)                                                           \
  BENCHMARK_CAPTURE(BM_CpuTowerlab, cpu_fp32_##L, Layout::L)->Apply(lowp_sizes); \
  BENCHMARK_CAPTURE(BM_CpuTowerlabBf16, cpu_bf16_##L, Layout::L, false,          \
                    Bf16GemmKernel::Avx512Bf16)                                  \
      ->Apply(lowp_sizes);                                                       \
  BENCHMARK_CAPTURE(BM_CpuTowerlabBf16, cpu_bf16_out_bf16_##L, Layout::L, true,  \
                    Bf16GemmKernel::Avx512Bf16)                                  \
      ->Apply(lowp_sizes);                                                       \
  BENCHMARK_CAPTURE(BM_CpuTowerlabBf16, cpu_bf16_widen_##L, Layout::L, false,    \
                    Bf16GemmKernel::Widen)                                       \
      ->Apply(lowp_sizes)
TL_CPU_BF16(NN);
TL_CPU_BF16(NT);
TL_CPU_BF16(TN);

#define TL_CUDA_PAIR(L)                                                                      \
  BENCHMARK_CAPTURE(BM_Cuda, cublas_##L, Layout::L, GemmBackend::Cublas)->Apply(cuda_sizes); \
  BENCHMARK_CAPTURE(BM_Cuda, cuda_##L, Layout::L, GemmBackend::Towerlab)->Apply(cuda_sizes)
TL_CUDA_PAIR(NN);
TL_CUDA_PAIR(NT);
TL_CUDA_PAIR(TN);

// FashionNet's fc1, each layout beside cuBLAS.
#define TL_CUDA_FC1(NAME, L, SHAPE)                                                   \
  BENCHMARK_CAPTURE(BM_Cuda, cublas_fc1_##NAME##_##L, Layout::L, GemmBackend::Cublas) \
      ->Apply(SHAPE);                                                                 \
  BENCHMARK_CAPTURE(BM_Cuda, cuda_fc1_##NAME##_##L, Layout::L, GemmBackend::Towerlab)->Apply(SHAPE)
TL_CUDA_FC1(forward, NT, fc1_forward);
TL_CUDA_FC1(grad_x, NN, fc1_backward);
TL_CUDA_FC1(grad_w, TN, fc1_backward);

// 16-bit inputs on the tensor cores beside cublasGemmEx, each layout and dtype.
#define TL_CUDA16_PAIR(L, NAME, DTYPE)                                                          \
  BENCHMARK_CAPTURE(BM_Cuda16, cublas_##NAME##_##L, Layout::L, DTYPE, true)->Apply(cuda_sizes); \
  BENCHMARK_CAPTURE(BM_Cuda16, cuda_##NAME##_##L, Layout::L, DTYPE, false)->Apply(cuda_sizes)
TL_CUDA16_PAIR(NN, bf16, DType::BFloat16);
TL_CUDA16_PAIR(NT, bf16, DType::BFloat16);
TL_CUDA16_PAIR(TN, bf16, DType::BFloat16);
TL_CUDA16_PAIR(NN, fp16, DType::Float16);
TL_CUDA16_PAIR(NT, fp16, DType::Float16);
TL_CUDA16_PAIR(TN, fp16, DType::Float16);

// float32 on TF32 tensor cores beside cublasSgemm in TF32 math mode, each layout.
#define TL_CUDA_TF32_PAIR(L)                                                           \
  BENCHMARK_CAPTURE(BM_CudaTf32, cublas_tf32_##L, Layout::L, true)->Apply(cuda_sizes); \
  BENCHMARK_CAPTURE(BM_CudaTf32, cuda_tf32_##L, Layout::L, false)->Apply(cuda_sizes)
TL_CUDA_TF32_PAIR(NN);
TL_CUDA_TF32_PAIR(NT);
TL_CUDA_TF32_PAIR(TN);
