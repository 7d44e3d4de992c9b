// How fast this CPU issues vdpbf16ps against vfmadd231ps on zmm registers: the
// question behind Bf16GemmKernel::Auto (engine/settings.h). Each loop runs 24
// independent accumulators (no memory operands, one thread) and prints the thread
// CPU time per instruction, three times. At the FMAs' rate vdpbf16ps doubles the
// GEMM's peak (32 multiply-adds an instruction against 16); at a quarter of it (the
// Intel Xeon of bench/results/matmul_bf16_42302f6.md) it halves it. Decided: Auto
// takes vdpbf16ps on AMD CPUs with avx512_bf16, where the Zen 5 of
// bench/results/matmul_bf16_zen5_5dac9fd.md ran both at 0.118-0.129 ns.
//
// Build and run by hand on the machine to measure:
//   g++ -O2 -o /tmp/dot_rate bench/experiments/decided/dot_rate.cpp && /tmp/dot_rate
#include <immintrin.h>

#include <cstdio>
#include <ctime>

namespace {

constexpr int kChains = 24;
constexpr long kIterations = 20000000;

double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx512f,avx512bf16"))) double dot_ns() {
  __m512 acc[kChains];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a;
  const double start = thread_seconds();
  for (long it = 0; it < kIterations; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));  // keeps the loop from being folded
  }
  const double seconds = thread_seconds() - start;
  float sum = 0;
  for (const __m512& v : acc) sum += v[0];
  if (sum == 1.0f) std::puts("");
  return seconds / (kIterations * kChains) * 1e9;
}

__attribute__((target("avx512f,fma"))) double fma_ns() {
  __m512 acc[kChains];
  for (__m512& v : acc) v = _mm512_setzero_ps();
  __m512 a = _mm512_set1_ps(1.0f);
  const __m512 b = _mm512_set1_ps(1e-9f);
  const double start = thread_seconds();
  for (long it = 0; it < kIterations; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    __asm__ volatile("" : "+v"(a));
  }
  const double seconds = thread_seconds() - start;
  float sum = 0;
  for (const __m512& v : acc) sum += v[0];
  if (sum == 1.0f) std::puts("");
  return seconds / (kIterations * kChains) * 1e9;
}

}  // namespace

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::fprintf(stderr, "dot_rate: this CPU does not report avx512_bf16\n");
    return 2;
  }
  for (int run = 0; run < 3; ++run) {
    std::printf("vdpbf16ps zmm %.3f ns   vfmadd231ps zmm %.3f ns\n", dot_ns(), fma_ns());
  }
}
