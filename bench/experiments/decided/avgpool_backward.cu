// A GPU experiment, standalone (the CUDA runtime alone, nothing of towerlab): which
// form of average pooling's 2x2 backward, accumulating into grad_x [128,64,56,56]
// (twice the H100's L2), moves its bytes fastest? Five forms, each checked bit for
// bit against the first, then timed with CUDA events beside a device copy of the
// same bytes (pool2d_bench's reference):
//   v1      one output a thread, float2 rows of grad_x;
//   v2      two outputs a thread, both loads issued before either store (the
//           for_output_pairs loop of kernels/cuda/pool2d.cu), with and without
//           streaming cache hints (__ldcs/__stcs);
//   v3      two neighbouring windows a thread in float4 rows (Wo even), with and
//           without the hints.
// It decided avg_pool_2x2_backward_wide_kernel in kernels/cuda/pool2d.cu (the float4
// form, no hints); its output on an H100 is bench/results/gpu_h100_avgpool_experiment/.
//
// It is not built by CMake nor carried by scripts/gpu.py (a decided question; the
// library's tests cover the kernel it chose). On a GPU machine:
//   nvcc -O3 -arch=sm_90 bench/experiments/decided/avgpool_backward.cu && ./a.out
// prints, per form, how many values differ from v1, each round's time and the best
// round against the copy's bytes/s.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x)                                        \
  do {                                               \
    cudaError_t e = (x);                             \
    if (e != cudaSuccess) {                          \
      printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      exit(1);                                       \
    }                                                \
  } while (0)

__global__ void v1(unsigned n, float* __restrict__ gx, const float* __restrict__ gy, unsigned Ho,
                   unsigned Wo) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned r = i / Wo, wo = i - r * Wo, W = 2 * Wo, top = 2 * r * W + 2 * wo;
    float g = 0.0f + gy[i] / 4.0f;
    float2 a = *reinterpret_cast<float2*>(gx + top), b = *reinterpret_cast<float2*>(gx + top + W);
    *reinterpret_cast<float2*>(gx + top) = make_float2(a.x + g, a.y + g);
    *reinterpret_cast<float2*>(gx + top + W) = make_float2(b.x + g, b.y + g);
  }
}
template <bool kStream>
__global__ void v2(unsigned half, unsigned n, float* __restrict__ gx, const float* __restrict__ gy,
                   unsigned Ho, unsigned Wo) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < half; i += gridDim.x * blockDim.x) {
    unsigned j = min(i + half, n - 1), W = 2 * Wo;
    unsigned ri = i / Wo, ti = 2 * ri * W + 2 * (i - ri * Wo);
    unsigned rj = j / Wo, tj = 2 * rj * W + 2 * (j - rj * Wo);
    float2 a0, a1, b0, b1;
    float ga, gb;
    if (kStream) {
      a0 = __ldcs(reinterpret_cast<float2*>(gx + ti));
      a1 = __ldcs(reinterpret_cast<float2*>(gx + ti + W));
      b0 = __ldcs(reinterpret_cast<float2*>(gx + tj));
      b1 = __ldcs(reinterpret_cast<float2*>(gx + tj + W));
      ga = __ldcs(gy + i);
      gb = __ldcs(gy + j);
    } else {
      a0 = *reinterpret_cast<float2*>(gx + ti);
      a1 = *reinterpret_cast<float2*>(gx + ti + W);
      b0 = *reinterpret_cast<float2*>(gx + tj);
      b1 = *reinterpret_cast<float2*>(gx + tj + W);
      ga = gy[i];
      gb = gy[j];
    }
    ga = 0.0f + ga / 4.0f;
    gb = 0.0f + gb / 4.0f;
    float2 A0 = make_float2(a0.x + ga, a0.y + ga), A1 = make_float2(a1.x + ga, a1.y + ga);
    float2 B0 = make_float2(b0.x + gb, b0.y + gb), B1 = make_float2(b1.x + gb, b1.y + gb);
    if (kStream) {
      __stcs(reinterpret_cast<float2*>(gx + ti), A0);
      __stcs(reinterpret_cast<float2*>(gx + ti + W), A1);
      if (i + half < n) {
        __stcs(reinterpret_cast<float2*>(gx + tj), B0);
        __stcs(reinterpret_cast<float2*>(gx + tj + W), B1);
      }
    } else {
      *reinterpret_cast<float2*>(gx + ti) = A0;
      *reinterpret_cast<float2*>(gx + ti + W) = A1;
      if (i + half < n) {
        *reinterpret_cast<float2*>(gx + tj) = B0;
        *reinterpret_cast<float2*>(gx + tj + W) = B1;
      }
    }
  }
}
// Two horizontally adjacent windows per thread: float4 rows (Wo even).
template <bool kStream>
__global__ void v3(unsigned m, float* __restrict__ gx, const float* __restrict__ gy, unsigned Ho,
                   unsigned Wo) {
  for (unsigned p = blockIdx.x * blockDim.x + threadIdx.x; p < m; p += gridDim.x * blockDim.x) {
    unsigned i = 2 * p, W = 2 * Wo, r = i / Wo, top = 2 * r * W + 2 * (i - r * Wo);
    float4 a, b;
    float2 g;
    if (kStream) {
      a = __ldcs(reinterpret_cast<float4*>(gx + top));
      b = __ldcs(reinterpret_cast<float4*>(gx + top + W));
      g = __ldcs(reinterpret_cast<const float2*>(gy + i));
    } else {
      a = *reinterpret_cast<float4*>(gx + top);
      b = *reinterpret_cast<float4*>(gx + top + W);
      g = *reinterpret_cast<const float2*>(gy + i);
    }
    float g0 = 0.0f + g.x / 4.0f, g1 = 0.0f + g.y / 4.0f;
    float4 A = make_float4(a.x + g0, a.y + g0, a.z + g1, a.w + g1),
           B = make_float4(b.x + g0, b.y + g0, b.z + g1, b.w + g1);
    if (kStream) {
      __stcs(reinterpret_cast<float4*>(gx + top), A);
      __stcs(reinterpret_cast<float4*>(gx + top + W), B);
    } else {
      *reinterpret_cast<float4*>(gx + top) = A;
      *reinterpret_cast<float4*>(gx + top + W) = B;
    }
  }
}

int main() {
  const unsigned N = 128, C = 64, H = 56, W = 56, Ho = 28, Wo = 28;
  const size_t nx = size_t(N) * C * H * W, ny = nx / 4, ncopy = nx * 5 / 8;
  float *gx, *gx0, *gy, *ref, *src, *dst;
  CK(cudaMalloc(&gx, nx * 4));
  CK(cudaMalloc(&gx0, nx * 4));
  CK(cudaMalloc(&ref, nx * 4));
  CK(cudaMalloc(&gy, ny * 4));
  CK(cudaMalloc(&src, ncopy * 4));
  CK(cudaMalloc(&dst, ncopy * 4));
  std::vector<float> h(nx);
  for (size_t i = 0; i < nx; ++i) h[i] = float(rand()) / RAND_MAX - 0.5f;
  CK(cudaMemcpy(gx0, h.data(), nx * 4, cudaMemcpyHostToDevice));
  for (size_t i = 0; i < ny; ++i) h[i] = float(rand()) / RAND_MAX - 0.5f;
  CK(cudaMemcpy(gy, h.data(), ny * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(src, gx0, ncopy * 4, cudaMemcpyDeviceToDevice));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto grid = [&](size_t n) {
    size_t g = (n + 255) / 256;
    return unsigned(g < 32u * sms ? g : 32u * sms);
  };
  const unsigned n = ny, half = (n + 1) / 2, m = n / 2;
  auto run = [&](int v) {
    switch (v) {
      case 0:
        cudaMemcpyAsync(dst, src, ncopy * 4, cudaMemcpyDeviceToDevice);
        break;
      case 1:
        v1<<<grid(n), 256>>>(n, gx, gy, Ho, Wo);
        break;
      case 2:
        v2<false><<<grid(half), 256>>>(half, n, gx, gy, Ho, Wo);
        break;
      case 3:
        v2<true><<<grid(half), 256>>>(half, n, gx, gy, Ho, Wo);
        break;
      case 4:
        v3<false><<<grid(m), 256>>>(m, gx, gy, Ho, Wo);
        break;
      case 5:
        v3<true><<<grid(m), 256>>>(m, gx, gy, Ho, Wo);
        break;
    }
  };
  const char* names[] = {"copy",
                         "one output a thread",
                         "two outputs a thread (towerlab)",
                         "two outputs, streaming hints",
                         "float4, two windows",
                         "float4, streaming hints"};
  // correctness: one call of each from gx0 against v1
  CK(cudaMemcpy(ref, gx0, nx * 4, cudaMemcpyDeviceToDevice));
  v1<<<grid(n), 256>>>(n, ref, gy, Ho, Wo);
  std::vector<float> r(nx), o(nx);
  CK(cudaMemcpy(r.data(), ref, nx * 4, cudaMemcpyDeviceToHost));
  for (int v = 2; v <= 5; ++v) {
    CK(cudaMemcpy(gx, gx0, nx * 4, cudaMemcpyDeviceToDevice));
    run(v);
    CK(cudaGetLastError());
    CK(cudaMemcpy(o.data(), gx, nx * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < nx; ++i) bad += o[i] != r[i];
    printf("variant %d (%s): %zu values differ from one-output\n", v, names[v], bad);
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  double best[6] = {1e9, 1e9, 1e9, 1e9, 1e9, 1e9};
  for (int round = 0; round < 5; ++round) {
    for (int v = 0; v <= 5; ++v) {
      for (int w = 0; w < 3; ++w) run(v);
      cudaEventRecord(a);
      for (int k = 0; k < 50; ++k) run(v);
      cudaEventRecord(b);
      CK(cudaEventSynchronize(b));
      float ms;
      cudaEventElapsedTime(&ms, a, b);
      double us = ms * 1000 / 50;
      if (us < best[v]) best[v] = us;
      printf("round %d %-34s %7.1f us\n", round, names[v], us);
    }
  }
  const double copy_bps = 2.0 * ncopy * 4 / best[0];
  for (int v = 1; v <= 5; ++v) {
    const double bps = (nx * 2.0 + ny) * 4 / best[v];
    printf("BEST %-34s %7.1f us  %5.1f%% of the copy's bytes/s (copy %.1f us, %.2f TB/s)\n",
           names[v], best[v], 100 * bps / copy_bps, best[0], copy_bps / 1e6);
  }
}
