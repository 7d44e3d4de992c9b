// batched_matmul on the CPU at the products of the small ViT's attention (models/vit.h:
// 4 heads of width E = 16 over T = 49 tokens, one tower's 64 samples: B = 256 entries),
// in the six layouts of its forward and backward:
//   scores  S = Q K^T        NT  [B,T,E] x [B,T,E]^T -> [B,T,T]   (K = 16)
//   mix     O = P V          NN  [B,T,T] x [B,T,E]   -> [B,T,E]   (K = 49)
//   grad_q  = grad_S K       NN  (as mix)
//   grad_k  = grad_S^T Q     TN  [B,T,T]^T x [B,T,E] -> [B,T,E]
//   grad_p  = grad_O V^T     NT  (as scores)
//   grad_v  = P^T grad_O     TN  (as grad_k)
// on 1 thread (a tower's share when two towers train on two cores) and on 2. The six are
// three layouts at two shapes each: scores and grad_p (NT, K = 16), mix and grad_q (NN,
// K = 49), grad_k and grad_v (TN, K = 49); the bench runs each pair once.
//
// Each layout runs three ways: batched_matmul; matmul on views of each entry, one call
// per entry (what batched_matmul did before it handed the batch to the GEMM at once:
// the checks, views and dispatch per entry); and, as the limit, one square matmul of
// the same FLOPs (M = N = K = 2 B T T E ^ (1/3), rounded) on the same threads: the
// rate of the GEMM when its products are large. The clock is the process's CPU time
// (MeasureProcessCPUTime), so the FLOP/s counter (2 B M N K per call) is per CPU-second
// of all the threads: a shared machine's load stretches wall time, hardly CPU time, and
// on 2 threads the counter says how well the second thread is used, not how fast the call
// returns (the Time column is wall time).
//   ./batched_matmul_bench --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
// and compare the "max" FLOP/s rows (the fastest repetition is the least disturbed).
// Results: bench/results/vit_attention_cpu_*.md.
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>

#include "bench_util.h"
#include "kernels/batched_matmul.h"
#include "kernels/matmul.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

constexpr std::int64_t kBatch = 256, kTokens = 49, kWidth = 16;

// One product: op(A_i) [M,K], op(B_i) [K,N], C_i [M,N] for i < kBatch.
struct Layout {
  const char* name;
  bool transpose_a, transpose_b;
  std::int64_t m, n, k;
  Shape a() const { return transpose_a ? Shape{kBatch, k, m} : Shape{kBatch, m, k}; }
  Shape b() const { return transpose_b ? Shape{kBatch, n, k} : Shape{kBatch, k, n}; }
  double flops() const { return 2.0 * double(kBatch * m * n * k); }
};

const Layout kLayouts[] = {
    {"scores_NT", false, true, kTokens, kTokens, kWidth},
    {"mix_NN", false, false, kTokens, kWidth, kTokens},
    {"grad_k_TN", true, false, kTokens, kWidth, kTokens},
};

enum class Way { Batched, MatmulPerEntry, OneSquareGemm };

// The pool at `threads` for the benchmark's life, then back to what it was.
struct PoolSize {
  int saved = num_threads();
  explicit PoolSize(int threads) { set_num_threads(threads); }
  ~PoolSize() { set_num_threads(saved); }
};

void BM_AttentionProduct(benchmark::State& state, Layout layout, Way way) {
  const PoolSize pool(static_cast<int>(state.range(0)));
  const Stream& stream = default_stream(Device::cpu());
  if (way == Way::OneSquareGemm) {
    const auto side = static_cast<std::int64_t>(std::lround(std::cbrt(layout.flops() / 2.0)));
    Tensor a = bench::random_tensor({side, side}, stream, 1);
    Tensor b = bench::random_tensor({side, side}, stream, 2);
    Tensor c = Tensor::empty({side, side}, stream);
    bench::time_calls(state, stream, [&] { matmul(c, a, b, false, false, 1.0f, 0.0f, stream); });
    state.counters["FLOP/s"] = benchmark::Counter(2.0 * double(side * side * side),
                                                  benchmark::Counter::kIsIterationInvariantRate);
    return;
  }
  Tensor a = bench::random_tensor(layout.a(), stream, 1);
  Tensor b = bench::random_tensor(layout.b(), stream, 2);
  Tensor c = Tensor::empty({kBatch, layout.m, layout.n}, stream);
  const auto entry = [](const Tensor& x, std::int64_t i) {
    return x.view(i * x.size(1) * x.size(2), {x.size(1), x.size(2)});
  };
  bench::time_calls(state, stream, [&] {
    if (way == Way::Batched) {
      batched_matmul(c, a, b, layout.transpose_a, layout.transpose_b, 1.0f, 0.0f, stream);
      return;
    }
    for (std::int64_t i = 0; i < kBatch; ++i) {
      matmul(entry(c, i), entry(a, i), entry(b, i), layout.transpose_a, layout.transpose_b, 1.0f,
             0.0f, stream);
    }
  });
  state.counters["FLOP/s"] =
      benchmark::Counter(layout.flops(), benchmark::Counter::kIsIterationInvariantRate);
}

const int kRegistered = [] {
  for (const Layout& layout : kLayouts) {
    for (auto [way, label] :
         {std::pair{Way::Batched, "batched"}, std::pair{Way::MatmulPerEntry, "matmul_per_entry"},
          std::pair{Way::OneSquareGemm, "one_square_gemm"}}) {
      const std::string name = std::string("BM_AttentionProduct/") + layout.name + "/" + label;
      benchmark::RegisterBenchmark(name.c_str(), BM_AttentionProduct, layout, way)
          ->ArgName("threads")
          ->Arg(1)
          ->Arg(2)
          ->MeasureProcessCPUTime();
    }
  }
  return 0;
}();

}  // namespace
