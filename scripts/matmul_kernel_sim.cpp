// Host simulation of gemm_kernel (kernels/cuda/matmul.cu); built and run by
// scripts/sim_matmul_kernel.sh, which extracts the kernel's text into
// kernel_body.inc. Each block runs as 256 std::threads; __shared__ arrays become
// statics (blocks run one at a time) and __syncthreads a std::barrier.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) {
  return {a, b, c, d};
}
struct Index3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Index3 threadIdx, blockIdx;
std::barrier<>* g_block_barrier = nullptr;
inline void __syncthreads() {
  g_block_barrier->arrive_and_wait();
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__

namespace sim {
#include "kernel_body.inc"
}  // namespace sim

namespace {

struct Case {
  int m, n, k, pad;  // an odd pad also shifts every pointer by one float
};

template <bool TA, bool TB>
void launch(int m, int n, int k, float alpha, const float* a, std::int64_t lda, const float* b,
            std::int64_t ldb, float beta, float* c, std::int64_t ldc, bool va, bool vb, bool vc) {
  const unsigned grid_x = (n + 127) / 128, grid_y = (m + 127) / 128;
  std::barrier<> barrier(256);
  g_block_barrier = &barrier;
  for (unsigned by = 0; by < grid_y; ++by) {
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      std::vector<std::thread> threads;
      for (unsigned t = 0; t < 256; ++t) {
        threads.emplace_back([&, t] {
          threadIdx.x = t;
          blockIdx.x = bx;
          blockIdx.y = by;
          sim::gemm_kernel<TA, TB>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, va, vb, vc);
        });
      }
      for (auto& thread : threads) thread.join();
    }
  }
}

bool aligned16(const void* p, std::int64_t ld) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && ld % 4 == 0;
}

}  // namespace

int main() {
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  int failures = 0;
  const Case cases[] = {{1, 1, 1, 0},      {7, 13, 31, 0},    {128, 128, 8, 0},  {257, 129, 65, 0},
                        {130, 131, 67, 1}, {1, 300, 1, 0},    {200, 4, 0, 0},    {64, 256, 20, 4},
                        {129, 1, 9, 3},    {260, 132, 68, 0}, {300, 200, 36, 0}, {4, 260, 130, 0}};
  for (const Case& d : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const std::int64_t a_rows = ta ? d.k : d.m, a_cols = ta ? d.m : d.k;
        const std::int64_t b_rows = tb ? d.n : d.k, b_cols = tb ? d.k : d.n;
        const std::int64_t lda = a_cols + d.pad, ldb = b_cols + d.pad, ldc = d.n + d.pad;
        std::vector<float> a_buf(a_rows * lda + 8), b_buf(b_rows * ldb + 8), c_buf(d.m * ldc + 8);
        for (float& x : a_buf) x = uniform(gen);
        for (float& x : b_buf) x = uniform(gen);
        for (float& x : c_buf) x = uniform(gen);
        const int shift = d.pad % 2;
        const float* a = a_buf.data() + shift;
        const float* b = b_buf.data() + shift;
        float* c = c_buf.data() + shift;
        const float alpha = 1.5f, beta = d.m % 2 ? 0.0f : -0.5f;
        if (beta == 0.0f) {  // beta == 0 must not read C
          for (std::int64_t i = 0; i < d.m; ++i)
            for (std::int64_t j = 0; j < d.n; ++j) c[i * ldc + j] = NAN;
        }
        const std::vector<float> c_before(c_buf);
        const bool va = aligned16(a, lda), vb = aligned16(b, ldb), vc = aligned16(c, ldc);
        if (!ta && !tb)
          launch<false, false>(d.m, d.n, d.k, alpha, a, lda, b, ldb, beta, c, ldc, va, vb, vc);
        if (!ta && tb)
          launch<false, true>(d.m, d.n, d.k, alpha, a, lda, b, ldb, beta, c, ldc, va, vb, vc);
        if (ta && !tb)
          launch<true, false>(d.m, d.n, d.k, alpha, a, lda, b, ldb, beta, c, ldc, va, vb, vc);
        if (ta && tb)
          launch<true, true>(d.m, d.n, d.k, alpha, a, lda, b, ldb, beta, c, ldc, va, vb, vc);
        int bad = 0;
        for (std::int64_t i = 0; i < d.m; ++i) {
          for (std::int64_t j = 0; j < ldc; ++j) {
            const std::size_t at = static_cast<std::size_t>(shift + i * ldc + j);
            const float got = c_buf[at];
            if (j >= d.n) {  // padding between rows: untouched
              if (!(got == c_before[at] || (std::isnan(got) && std::isnan(c_before[at])))) ++bad;
              continue;
            }
            double sum = 0.0;
            for (std::int64_t p = 0; p < d.k; ++p) {
              sum += double(ta ? a[p * lda + i] : a[i * lda + p]) *
                     double(tb ? b[j * ldb + p] : b[p * ldb + j]);
            }
            const double want = alpha * sum + (beta == 0.0f ? 0.0 : beta * c_before[at]);
            if (!(std::fabs(got - want) <= 1e-4 * (1.0 + std::fabs(want)))) {
              if (bad < 3)
                std::printf("  C(%ld,%ld) = %g, expected %g\n", long(i), long(j), got, want);
              ++bad;
            }
          }
        }
        std::printf("%4d x %4d x %4d pad %d %c%c float4 a/b/c %d%d%d: %s\n", d.m, d.n, d.k, d.pad,
                    ta ? 'T' : 'N', tb ? 'T' : 'N', va, vb, vc, bad ? "FAIL" : "ok");
        failures += bad != 0;
      }
    }
  }
  std::printf("%d failing cases\n", failures);
  return failures != 0 ? 1 : 0;
}
