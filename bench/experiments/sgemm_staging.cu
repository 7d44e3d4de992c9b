// A GPU experiment, standalone (it links cuBLAS and includes the wide GEMM kernel's
// header, nothing else of towerlab), for issue 23's SGEMM target at 4096^3:
// does staging the operand that is not k-major pay?
//
// gemm_wide_kernel reads op(A) and op(B) as k-major slices. TN's operands already
// are (A stored [K,M], B stored [K,N]) and reach shared memory by cp.async; NN's A
// ([M,K]) and NT's A and B ([N,K]) go through registers and a transposing store,
// and ran behind TN on an H100 (bench/results/gpu_h100.md). Staged:
// one transpose kernel writes the operand k-major into scratch, then the TN kernel
// runs. The product's sums are the same in the same order, so the staged C must
// have the direct kernel's bits; the transpose costs a copy of the operand
// (64 MiB read + written at 4096^2, small beside the product's time).
//
//   sgemm_staging [SIZE [ROUNDS [CALLS]]]      (defaults 4096 5 10)
// prints, per layout, the direct kernel, the staged one and cuBLAS (TF32 off): the
// best and median of ROUNDS alternated rounds of CALLS calls, % of cuBLAS, and
// whether staged and direct agree bit for bit; exit status 1 if they do not, 2 on a
// CUDA or cuBLAS error. The benches' build makes it (build/<preset>/bench/experiments/
// sgemm_staging; scripts/gpu.py carries it); CI runs it on the emulated GPUs as
// `sgemm_staging 128 1 1`, which checks the bits and the program, not the speed.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cuda/matmul_wide.cuh"

using towerlab::cuda::gemm_detail::gemm_wide_kernel;
using towerlab::cuda::gemm_detail::GemmParams;
using towerlab::cuda::gemm_detail::WideTile;

#define CHECK(x)                                                        \
  do {                                                                  \
    if (auto e = (x); e != 0) {                                         \
      std::printf("%s failed (%d) at line %d\n", #x, int(e), __LINE__); \
      std::exit(2);                                                     \
    }                                                                   \
  } while (0)

// out [cols, rows] = in [rows, cols]^T, through a 32x33 shared tile (no bank
// conflicts), 32x8 threads each moving 4 values.
__global__ void transpose_kernel(float* __restrict__ out, const float* __restrict__ in, int rows,
                                 int cols) {
  __shared__ float tile[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * 32;
  for (int j = threadIdx.y; j < 32; j += 8) {
    if (r0 + j < rows && c < cols) tile[j][threadIdx.x] = in[std::size_t(r0 + j) * cols + c];
  }
  __syncthreads();
  const int r = r0 + threadIdx.x, c0 = blockIdx.x * 32;
  for (int j = threadIdx.y; j < 32; j += 8) {
    if (c0 + j < cols && r < rows) out[std::size_t(c0 + j) * rows + r] = tile[threadIdx.x][j];
  }
}

void transpose(float* out, const float* in, int rows, int cols) {
  transpose_kernel<<<dim3((cols + 31) / 32, (rows + 31) / 32), dim3(32, 8)>>>(out, in, rows, cols);
}

template <bool kTA, bool kTB>
void wide(int m, int n, int k, const float* a, const float* b, float* c) {
  GemmParams p{};
  p.m = m, p.n = n, p.k = k, p.alpha = 1.0f, p.beta = 0.0f;
  p.a = a, p.lda = kTA ? m : k, p.b = b, p.ldb = kTB ? k : n, p.c = c, p.ldc = n;
  p.k_per_split = k, p.split_stride = 0, p.vector_a = p.vector_b = p.vector_c = true;
  const dim3 grid((n + WideTile::kN - 1) / WideTile::kN, (m + WideTile::kM - 1) / WideTile::kM);
  gemm_wide_kernel<kTA, kTB><<<grid, WideTile::kThreads>>>(p);
}

struct Timing {
  double best = 1e30;
  std::vector<double> rounds;
  double median() const {
    std::vector<double> r = rounds;
    std::sort(r.begin(), r.end());
    return r[r.size() / 2];
  }
};

template <typename Fn>
void time_round(Timing& t, int calls, Fn fn) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  fn();
  CHECK(cudaEventRecord(start));
  for (int i = 0; i < calls; ++i) fn();
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaGetLastError());
  const double us = ms * 1000.0 / calls;
  t.rounds.push_back(us);
  t.best = std::min(t.best, us);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

int main(int argc, char** argv) {
  const int s = argc > 1 ? std::atoi(argv[1]) : 4096, m = s, n = s, k = s;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5, calls = argc > 3 ? std::atoi(argv[3]) : 10;
  if (s < 4 || s % 4 != 0 || rounds < 1 || calls < 1) {
    std::printf("usage: sgemm_staging [SIZE (a multiple of 4) [ROUNDS [CALLS]]]\n");
    return 2;
  }
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> host(std::size_t(s) * s);
  float *a, *b, *scratch_a, *scratch_b, *c_direct, *c_staged, *c_cublas;
  for (float** p : {&a, &b, &scratch_a, &scratch_b, &c_direct, &c_staged, &c_cublas}) {
    CHECK(cudaMalloc(p, host.size() * sizeof(float)));
  }
  for (float* p : {a, b}) {
    for (float& v : host) v = u(rng);
    CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  cublasHandle_t handle;
  CHECK(cublasCreate(&handle));
  CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));  // FP32, no TF32
  const float one = 1.0f, zero = 0.0f;
  bool all_same = true;
  std::printf("SGEMM %dx%dx%d on ", m, n, k);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s: us per call, best / median of %d rounds of %d\n", prop.name, rounds, calls);
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T for cuBLAS.
  for (const char* layout : {"NN", "NT", "TN"}) {
    const bool ta = layout[0] == 'T', tb = layout[1] == 'T';
    auto direct = [&] {
      if (!ta && !tb) wide<false, false>(m, n, k, a, b, c_direct);
      if (!ta && tb) wide<false, true>(m, n, k, a, b, c_direct);
      if (ta && !tb) wide<true, false>(m, n, k, a, b, c_direct);
    };
    auto staged = [&] {  // both operands k-major, then the TN kernel
      const float* ak = a;
      const float* bk = b;
      if (!ta) transpose(scratch_a, a, m, k), ak = scratch_a;  // [M,K] -> [K,M]
      if (tb) transpose(scratch_b, b, n, k), bk = scratch_b;   // [N,K] -> [K,N]
      wide<true, false>(m, n, k, ak, bk, c_staged);
    };
    auto cublas = [&] {
      CHECK(cublasSgemm(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                        m, k, &one, b, tb ? k : n, a, ta ? m : k, &zero, c_cublas, n));
    };
    Timing t_direct, t_staged, t_cublas;
    for (int round = 0; round < rounds; ++round) {
      time_round(t_direct, calls, direct);
      time_round(t_staged, calls, staged);
      time_round(t_cublas, calls, cublas);
    }
    std::vector<float> d(host.size()), st(host.size()), cb(host.size());
    CHECK(cudaMemcpy(d.data(), c_direct, d.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(st.data(), c_staged, st.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(cb.data(), c_cublas, cb.size() * 4, cudaMemcpyDeviceToHost));
    std::size_t differ = 0;
    double err = 0, ref = 0;
    for (std::size_t i = 0; i < d.size(); ++i) {
      differ += d[i] != st[i];
      err += double(d[i] - cb[i]) * (d[i] - cb[i]);
      ref += double(cb[i]) * cb[i];
    }
    all_same = all_same && differ == 0;
    std::printf(
        "%s  direct %8.1f / %8.1f (%5.1f%% of cuBLAS)  staged %8.1f / %8.1f (%5.1f%%)  "
        "cuBLAS %8.1f / %8.1f  staged = direct: %s (%zu differ)  |direct - cuBLAS| / "
        "|cuBLAS| %.1e\n",
        layout, t_direct.best, t_direct.median(), 100 * t_cublas.median() / t_direct.median(),
        t_staged.best, t_staged.median(), 100 * t_cublas.median() / t_staged.median(),
        t_cublas.best, t_cublas.median(), differ == 0 ? "yes" : "NO", differ, std::sqrt(err / ref));
  }
  cublasDestroy(handle);
  return all_same ? 0 : 1;
}
