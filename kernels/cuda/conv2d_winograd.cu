// Winograd F(4x4, 3x3) conv2d on CUDA, float32: the forward, backward-data and
// backward-weight of 3x3 layers with stride 1, dilation 1, padding 0 or 1 (Lavin &
// Gray, "Fast Algorithms for Convolutional Neural Networks", 2015).
//
// Why: on wide 3x3 layers (64-256 channels) the implicit GEMM runs at about half
// the H100's FP32 peak, and cuDNN's FFT and Winograd reach an effective 110-120
// TFLOP/s, which no direct method can. F(4x4,3x3) computes each 4x4 block of output pixels (a tile)
// from a 6x6 block of input with 36 products per channel pair instead of 144: 4x
// fewer multiplications. (F(2x2,3x3), the CPU's, saves 2.25x: not enough here.)
//
// With (interpolation points 0, +-1, +-2, infinity)
//   Bᵀ = [4  0 -5  0  1  0]   G = [ 1/4     0     0 ]   Aᵀ = [1  1  1  1  1  0]
//        [0 -4 -4  1  1  0]       [-1/6  -1/6  -1/6 ]        [0  1 -1  2 -2  0]
//        [0  4 -4 -1  1  0]       [-1/6   1/6  -1/6 ]        [0  1  1  4  4  0]
//        [0 -2 -1  2  1  0]       [1/24  1/12   1/6 ]        [0  1 -1  8 -8  1]
//        [0  2 -1 -2  1  0]       [1/24 -1/12   1/6 ]
//        [0  4  0 -5  0  1]       [ 0      0     1  ]
// the tile of output channel o is Aᵀ [ sum_c (G g[o,c] Gᵀ) ⊙ (Bᵀ d[c] B) ] A. Each of
// the 36 elements e of the 6x6 product sums over c on its own, so the whole layer
// is 36 independent matrix products. Four kernels, not fused:
//   1. weight transform  U[e][c][o] = (G g[o,c] Gᵀ)[e]           [36][Cr][ldCo]
//   2. input transform   V[e][c][t] = (Bᵀ d[t,c] B)[e]           [36][Cr][ldT]
//   3. batched GEMM      M[e][o][t] = sum_c U[e][c][o] V[e][c][t] [36][Co][ldT]
//   4. output transform  out tile (t, o) = Aᵀ m[t,o] A (+ bias; += for grad_x),
//                        clipped at the image's ragged edge
// Cr and Co are the correlation's input (reduced) and output channels: the layer's
// C and K forward; its K and C for backward-data, which is the correlation of grad_y
// padded by 2 - pad with the kernel turned 180 degrees (as kernels/cpu/winograd.h).
// t runs over every tile of every image, T = N * ceil(P/4) * ceil(Q/4); ldT and
// ldCo round T and Co up to 4 (zeros in the padding) so that the GEMM loads and
// stores whole float4s. The workspace (U, V and M: 36 * (Cr*ldCo + (Cr + Co)*ldT)
// floats) comes from the device's caching allocator, ordered on the stream.
//
// The weight gradient is the same algebra read backwards. The forward's tile is
// linear in g, y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A, so the gradient of a loss with respect to
// g, summed over the tiles, is
//   grad g[o,c] = Gᵀ [ sum_t (A dy[t,o] Aᵀ) ⊙ (Bᵀ d[t,c] B) ] G
// with dy the tile's 4x4 block of grad_y (zero past the image). Four kernels:
//   1. input transform   V[e][c][t] as above (the forward's own kernel)
//   2. grad_y transform  Y[e][o][t] = (A dy[t,o] Aᵀ)[e]            [36][Co][ldT]
//   3. batched GEMM      M[s][e][o][c] = sum_{t in split s} Y[e][o][t] V[e][c][t]
//   4. weight transform  grad_weight[o,c] += Gᵀ (sum_s M[s][e][o][c]) G
// Its reduction runs over the T tiles, long beside the channels (c256_28x28_b64: 3136
// tiles, 256 x 256 outputs per element), so it is cut into splits (weight_splits)
// that split_reduce sums in a fixed tree.
//
// The GEMM (winograd_gemm_kernel): forward and backward-data's operands are stored
// reduction-major and contiguous along their own dimension ([c][o] and [c][t]), so
// each 8-deep step of the reduction is loaded with float4s straight into shared
// memory as rows, no transpose and no gather; the weight gradient's are
// reduction-minor ([o][t] and [c][t], reduced over t), loaded as float4s along t
// and stored transposed (Operands, OperandTile). Either way: the classic SIMT
// SGEMM (a BM x BN block tile, BK = 8, 8x8 outputs per thread as four 4x4 quarters
// BM/2 rows and BN/2 columns apart, double-buffered shared memory filled from
// registers one step ahead, one barrier per step). A warp's 32 threads cover 8
// output rows x 4 output columns (of 4-wide groups), so each float4 read of a
// fragment from shared memory is 8 or 4 distinct addresses: one wavefront.
// blockIdx.z is the element e (and the split). Forward and backward-data: BM is 128
// for more than 64 output channels, else 64 (the 64-channel layers would waste half
// of a 128 tile), BN 128 tiles. Weight gradient: 128x128 where both channel counts
// exceed 64, 64x32 (one warp) where the input's are at most 32, else 64x64.
// ptxas (sm_90, no spills): 128x128: 256 threads, 128 registers (the cap of
// __launch_bounds__' two blocks per SM: 16 warps; reduction-minor 126), 16 KiB
// shared (16.5); 64x128: 128 threads, 155 registers, 12 KiB, three blocks per SM;
// 64x64 reduction-minor: 64 threads, 161 registers, 8.5 KiB; 64x32: 32 threads, 165
// registers (Nsight Compute on the H100), 6.7 KiB. The transforms: 40 to
// 56 registers, four blocks of 256 threads per SM.
//
// Cost on c256_28x28_b64 (forward): the GEMMs are 14.8 GFLOP (the implicit GEMM's
// 59), the workspace traffic about 0.4 GB (V and M written and read once each).
//
// Numerics: the transforms have entries up to 8 (Aᵀ) and 5 (Bᵀ) and fractions
// down to 1/24 (G), so F(4x4) rounds looser than F(2x2) and the direct methods:
// measured against a double-precision reference (tests/conv2d_winograd_test.cpp,
// on the emulated GPUs), relative to the sum of the magnitudes of each result's
// terms, sum |w||x|, the worst error is 0.08 to 8.8e-6 (up to about 150 units of
// float32 rounding u = 2^-24, backward-data with padding 0 on 15 images; the weight
// gradient's up to 1.3e-6, 21 u; the implicit GEMM's, on the same cases: under 5 u);
// the tests allow 256 u. Every output pixel and every weight is written by one
// thread in a fixed order, no atomics: the same bits every run.
//
// Each layer's speed on a GPU, pass by pass beside cuDNN: bench/results/gpu_h100.md.
#include "kernels/cuda/conv2d_winograd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "kernels/cpu/winograd.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/split_reduce.cuh"

namespace towerlab::cuda {

namespace {

constexpr int kElements = 36;  // a 6x6 transformed tile

// Auto's thresholds (winograd_chosen). The transforms and the workspace traffic
// grow with Cr + Co per tile, the GEMM's saving with Cr * Co; and the implicit
// GEMM is at its weakest on few output columns. FashionNet's conv2 (32 -> 64,
// 14x14) decided the rule on a GPU: its forward (reducing 32 channels into 64) was
// slower on Winograd at every batch, its backward-data (64 into 32) faster at the
// batches of one and two towers, its weight gradient faster at each (docs/kernels.md,
// "Winograd on CUDA"; bench/results/gpu_h100_winograd_gate/).
constexpr std::int64_t kMinAutoReduced = 64;   // forward, backward-data: Cr
constexpr std::int64_t kMinAutoProduced = 32;  // forward, backward-data: Co
constexpr std::int64_t kMinAutoWide = 64;      // weight gradient: the larger of C, K
constexpr std::int64_t kMinAutoNarrow = 32;    // weight gradient: the smaller

// One correlation with a 3x3 kernel, stride 1: out [N,Co,P,Q] from in [N,Cr,H,W]
// zero-padded by pad_h, pad_w (0 to 2), P = H + 2*pad_h - 2, Q likewise.
struct Geometry {
  int N, Cr, Co, H, W, P, Q, pad_h, pad_w;
  int tiles_h, tiles_w;  // ceil(P/4), ceil(Q/4) per image
  int T, ldT, ldCo;      // tiles of the batch; T and Co rounded up to 4
};

std::int64_t round_up4(std::int64_t v) {
  return (v + 3) / 4 * 4;
}

// The geometry in 64-bit arithmetic; Geometry's ints hold it when fits(z).
struct Sizes {
  std::int64_t N, Cr, Co, H, W, pad_h, pad_w, P, Q, tiles_h, tiles_w, T, ldT, ldCo;
};

Sizes sizes(std::int64_t N, std::int64_t Cr, std::int64_t Co, std::int64_t H, std::int64_t W,
            std::int64_t pad_h, std::int64_t pad_w) {
  Sizes z{N, Cr, Co, H, W, pad_h, pad_w, 0, 0, 0, 0, 0, 0, 0};
  z.P = H + 2 * pad_h - 2, z.Q = W + 2 * pad_w - 2;
  z.tiles_h = (z.P + 3) / 4, z.tiles_w = (z.Q + 3) / 4;
  z.T = N * z.tiles_h * z.tiles_w;
  z.ldT = round_up4(z.T), z.ldCo = round_up4(Co);
  return z;
}

// The kernels index one element's matrix (and the whole workspace, in 64 bits) with
// 32-bit ints: every matrix of the 36 must hold fewer than 2^31 floats.
bool fits(const Sizes& z) {
  constexpr std::int64_t kLimit = std::int64_t{1} << 31;
  return z.Cr * z.ldT < kLimit && z.Co * z.ldT < kLimit && z.Cr * z.ldCo < kLimit;
}

Geometry geometry(const Sizes& z) {
  auto i = [](std::int64_t v) { return static_cast<int>(v); };
  return {i(z.N),     i(z.Cr),    i(z.Co),      i(z.H),       i(z.W), i(z.P),   i(z.Q),
          i(z.pad_h), i(z.pad_w), i(z.tiles_h), i(z.tiles_w), i(z.T), i(z.ldT), i(z.ldCo)};
}

// ---- the transforms, one column at a time (out may alias the input column) ----

// out = Bᵀ d for a column d of 6 values, `stride` apart.
__device__ __forceinline__ void input_column(float* out, const float* d, int stride) {
  const float d0 = d[0], d1 = d[stride], d2 = d[2 * stride], d3 = d[3 * stride];
  const float d4 = d[4 * stride], d5 = d[5 * stride];
  out[0] = 4.0f * d0 - 5.0f * d2 + d4;
  out[stride] = -4.0f * (d1 + d2) + (d3 + d4);
  out[2 * stride] = 4.0f * (d1 - d2) + (d4 - d3);
  out[3 * stride] = 2.0f * (d3 - d1) + (d4 - d2);
  out[4 * stride] = 2.0f * (d1 - d3) + (d4 - d2);
  out[5 * stride] = 4.0f * d1 - 5.0f * d3 + d5;
}

// out (6 values, `stride` apart) = G g for a column g of 3 values, `stride` apart.
__device__ __forceinline__ void weight_column(float* out, const float* g, int stride) {
  const float g0 = g[0], g1 = g[stride], g2 = g[2 * stride];
  out[0] = 0.25f * g0;
  out[stride] = (-1.0f / 6.0f) * (g0 + g1 + g2);
  out[2 * stride] = (-1.0f / 6.0f) * (g0 - g1 + g2);
  out[3 * stride] = (1.0f / 24.0f) * g0 + (1.0f / 12.0f) * g1 + (1.0f / 6.0f) * g2;
  out[4 * stride] = (1.0f / 24.0f) * g0 - (1.0f / 12.0f) * g1 + (1.0f / 6.0f) * g2;
  out[5 * stride] = g2;
}

// out (4 values, `out_stride` apart) = Aᵀ m for a column m of 6, `stride` apart.
__device__ __forceinline__ void output_column(float* out, int out_stride, const float* m,
                                              int stride) {
  const float m0 = m[0], m1 = m[stride], m2 = m[2 * stride], m3 = m[3 * stride];
  const float m4 = m[4 * stride], m5 = m[5 * stride];
  const float s12 = m1 + m2, d12 = m1 - m2, s34 = m3 + m4, d34 = m3 - m4;
  out[0] = m0 + s12 + s34;
  out[out_stride] = d12 + 2.0f * d34;
  out[2 * out_stride] = s12 + 4.0f * s34;
  out[3 * out_stride] = d12 + 8.0f * d34 + m5;
}

// The weight gradient's two transforms are those of the forward read backwards
// (the gradient of Aᵀ[(G g Gᵀ) ⊙ v]A with respect to g is Gᵀ[(A dy Aᵀ) ⊙ v]G):

// out (6 values, `out_stride` apart) = A dy for a column dy of 4, `stride` apart.
__device__ __forceinline__ void grad_output_column(float* out, int out_stride, const float* dy,
                                                   int stride) {
  const float d0 = dy[0], d1 = dy[stride], d2 = dy[2 * stride], d3 = dy[3 * stride];
  const float s02 = d0 + d2, s13 = d1 + d3, e02 = d0 + 4.0f * d2, e13 = 2.0f * d1 + 8.0f * d3;
  out[0] = d0;
  out[out_stride] = s02 + s13;
  out[2 * out_stride] = s02 - s13;
  out[3 * out_stride] = e02 + e13;
  out[4 * out_stride] = e02 - e13;
  out[5 * out_stride] = d3;
}

// out (3 values, `out_stride` apart) = Gᵀ m for a column m of 6, `stride` apart.
__device__ __forceinline__ void weight_grad_column(float* out, int out_stride, const float* m,
                                                   int stride) {
  const float m0 = m[0], m1 = m[stride], m2 = m[2 * stride], m3 = m[3 * stride];
  const float m4 = m[4 * stride], m5 = m[5 * stride];
  const float s12 = m1 + m2, d12 = m2 - m1, s34 = m3 + m4, d34 = m3 - m4;
  out[0] = 0.25f * m0 - (1.0f / 6.0f) * s12 + (1.0f / 24.0f) * s34;
  out[out_stride] = (1.0f / 6.0f) * d12 + (1.0f / 12.0f) * d34;
  out[2 * out_stride] = (1.0f / 6.0f) * (s34 - s12) + m5;
}

// u[e][c][o] for every c < Cr, o < ldCo (zero for o >= Co): G g Gᵀ of the 3x3 kernel
// g that takes input channel c to output channel o. Forward (flip false): g =
// weight[o,c]. Backward-data (flip true): the layer's weight is [Cr,Co,3,3] (K = Cr,
// C = Co) and g(r,s) = weight[c,o,2-r,2-s]. Consecutive threads take consecutive o:
// coalesced stores (the weight reads are small and cached).
__global__ void winograd_weight_kernel(std::int64_t count, float* u, const float* weight,
                                       Geometry g, bool flip) {
  for (const std::int64_t i : grid_stride(count)) {
    const int c = static_cast<int>(i / g.ldCo), o = static_cast<int>(i % g.ldCo);
    float t[kElements];  // [6][6]
    if (o < g.Co) {
      float k[9];
      const float* w =
          weight + (flip ? (std::int64_t{c} * g.Co + o) : (std::int64_t{o} * g.Cr + c)) * 9;
#pragma unroll
      for (int tap = 0; tap < 9; ++tap) k[tap] = __ldg(w + (flip ? 8 - tap : tap));
      float gk[18];  // [6][3] = G g
#pragma unroll
      for (int s = 0; s < 3; ++s) weight_column(gk + s, k + s, 3);
#pragma unroll
      for (int r = 0; r < 6; ++r) weight_column(t + r * 6, gk + r * 3, 1);  // (G g) Gᵀ, rows
    } else {
#pragma unroll
      for (int e = 0; e < kElements; ++e) t[e] = 0.0f;
    }
    const std::int64_t plane = std::int64_t{g.Cr} * g.ldCo;
#pragma unroll
    for (int e = 0; e < kElements; ++e) u[e * plane + i] = t[e];
  }
}

// v[e][c][t] for every c < Cr, t < ldT (zero for t >= T): Bᵀ d B of the 6x6 input
// block of tile t in channel c, zero outside the image. Consecutive threads take
// consecutive tiles: coalesced stores; their input blocks overlap by 2 columns
// (L1 hits).
__global__ void winograd_input_kernel(std::int64_t count, float* v, const float* in, Geometry g) {
  for (const std::int64_t i : grid_stride(count)) {
    const int c = static_cast<int>(i / g.ldT), t = static_cast<int>(i % g.ldT);
    float d[kElements];  // [6][6]
    if (t < g.T) {
      const int per_image = g.tiles_h * g.tiles_w;
      const int n = t / per_image, in_image = t - n * per_image;
      const int th = in_image / g.tiles_w, tw = in_image - th * g.tiles_w;
      const int h0 = th * 4 - g.pad_h, w0 = tw * 4 - g.pad_w;
      const float* plane = in + (std::int64_t{n} * g.Cr + c) * g.H * g.W;
#pragma unroll
      for (int r = 0; r < 6; ++r) {
        const int h = h0 + r;
        const bool row_in = static_cast<unsigned>(h) < static_cast<unsigned>(g.H);
#pragma unroll
        for (int s = 0; s < 6; ++s) {
          const int w = w0 + s;
          d[r * 6 + s] = row_in && static_cast<unsigned>(w) < static_cast<unsigned>(g.W)
                             ? __ldg(plane + h * g.W + w)
                             : 0.0f;
        }
      }
#pragma unroll
      for (int s = 0; s < 6; ++s) input_column(d + s, d + s, 6);  // Bᵀ d, in place
#pragma unroll
      for (int r = 0; r < 6; ++r) input_column(d + r * 6, d + r * 6, 1);  // (Bᵀ d) B
    } else {
#pragma unroll
      for (int e = 0; e < kElements; ++e) d[e] = 0.0f;
    }
    const std::int64_t plane = std::int64_t{g.Cr} * g.ldT;
#pragma unroll
    for (int e = 0; e < kElements; ++e) v[e * plane + i] = d[e];
  }
}

// out tile (t, o) for every o < Co, t < T from m[e][o][t]: Aᵀ m A, clipped to the
// P x Q image; forward assigns it plus bias[o] (bias may be null), backward-data
// (accumulate) adds it. Consecutive threads take consecutive tiles: coalesced
// loads of m; where Q is a multiple of 4 and the rows 16-byte aligned (vector),
// each tile row is one float4.
__global__ void winograd_output_kernel(std::int64_t count, float* out, const float* m,
                                       const float* bias, Geometry g, bool accumulate,
                                       bool vector) {
  for (const std::int64_t i : grid_stride(count)) {
    const int o = static_cast<int>(i / g.T), t = static_cast<int>(i % g.T);
    const std::int64_t plane = std::int64_t{g.Co} * g.ldT;
    const float* src = m + std::int64_t{o} * g.ldT + t;
    float x[kElements];  // [6][6]
#pragma unroll
    for (int e = 0; e < kElements; ++e) x[e] = __ldg(src + e * plane);
    float y[16];    // [4][4]
    float col[24];  // [4][6] = Aᵀ x
#pragma unroll
    for (int s = 0; s < 6; ++s) output_column(col + s, 6, x + s, 6);
#pragma unroll
    for (int r = 0; r < 4; ++r) output_column(y + r * 4, 1, col + r * 6, 1);  // (Aᵀ x) A

    const int per_image = g.tiles_h * g.tiles_w;
    const int n = t / per_image, in_image = t - n * per_image;
    const int th = in_image / g.tiles_w, tw = in_image - th * g.tiles_w;
    const int p0 = th * 4, q0 = tw * 4;
    const float b = bias != nullptr ? __ldg(bias + o) : 0.0f;
    float* dst = out + (std::int64_t{n} * g.Co + o) * g.P * g.Q;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int p = p0 + r;
      if (p >= g.P) break;
      float* row = dst + std::int64_t{p} * g.Q + q0;
      if (vector) {  // q0 + 3 < Q
        float4 value = accumulate ? *reinterpret_cast<const float4*>(row) : make_float4(b, b, b, b);
        value.x += y[r * 4], value.y += y[r * 4 + 1], value.z += y[r * 4 + 2];
        value.w += y[r * 4 + 3];
        *reinterpret_cast<float4*>(row) = value;
        continue;
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if (q0 + s >= g.Q) break;
        row[s] = (accumulate ? row[s] : b) + y[r * 4 + s];
      }
    }
  }
}

// y[e][o][t] for every o < Co, t < ldT (zero for t >= T): A dy Aᵀ of the 4x4 block of
// grad_y that tile t covers in output channel o, zero past the P x Q image (the
// forward's tile, clipped there, had no output to take a gradient from).
// Consecutive threads take consecutive tiles: coalesced stores, and loads of
// neighbouring 4-wide rows; where Q is a multiple of 4 and the rows 16-byte aligned
// (vector), each tile row is one float4.
__global__ void winograd_grad_output_kernel(std::int64_t count, float* y, const float* grad_y,
                                            Geometry g, bool vector) {
  for (const std::int64_t i : grid_stride(count)) {
    const int o = static_cast<int>(i / g.ldT), t = static_cast<int>(i % g.ldT);
    float d[16] = {};  // [4][4]
    if (t < g.T) {
      const int per_image = g.tiles_h * g.tiles_w;
      const int n = t / per_image, in_image = t - n * per_image;
      const int th = in_image / g.tiles_w, tw = in_image - th * g.tiles_w;
      const int p0 = th * 4, q0 = tw * 4;
      const float* plane = grad_y + (std::int64_t{n} * g.Co + o) * g.P * g.Q;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int p = p0 + r;
        if (p >= g.P) break;
        const float* row = plane + std::int64_t{p} * g.Q + q0;
        if (vector) {  // q0 + 3 < Q
          const float4 v = __ldg(reinterpret_cast<const float4*>(row));
          d[r * 4] = v.x, d[r * 4 + 1] = v.y, d[r * 4 + 2] = v.z, d[r * 4 + 3] = v.w;
          continue;
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) d[r * 4 + s] = q0 + s < g.Q ? __ldg(row + s) : 0.0f;
      }
    }
    float col[24];  // [6][4] = A d
#pragma unroll
    for (int s = 0; s < 4; ++s) grad_output_column(col + s, 4, d + s, 4);
    float x[kElements];  // [6][6] = (A d) Aᵀ
#pragma unroll
    for (int r = 0; r < 6; ++r) grad_output_column(x + r * 6, 1, col + r * 4, 1);
    const std::int64_t plane = std::int64_t{g.Co} * g.ldT;
#pragma unroll
    for (int e = 0; e < kElements; ++e) y[e * plane + i] = x[e];
  }
}

// grad_weight[o, c] += Gᵀ m G for every o < Co, c < Cr, m[e][o][c] the GEMM's sum over
// all the tiles (the splits already summed; rows ldCr apart). Consecutive threads take
// consecutive c: coalesced loads of m.
__global__ void winograd_weight_grad_kernel(std::int64_t count, float* grad_weight, const float* m,
                                            int Co, int Cr, int ldCr) {
  for (const std::int64_t i : grid_stride(count)) {
    const int o = static_cast<int>(i / Cr), c = static_cast<int>(i % Cr);
    const std::int64_t plane = std::int64_t{Co} * ldCr, at = std::int64_t{o} * ldCr + c;
    float x[kElements];  // [6][6]
#pragma unroll
    for (int e = 0; e < kElements; ++e) x[e] = __ldg(m + e * plane + at);
    float col[18];  // [3][6] = Gᵀ x
#pragma unroll
    for (int s = 0; s < 6; ++s) weight_grad_column(col + s, 6, x + s, 6);
    float w[9];  // [3][3] = (Gᵀ x) G
#pragma unroll
    for (int r = 0; r < 3; ++r) weight_grad_column(w + r * 3, 1, col + r * 6, 1);
    float* out = grad_weight + i * 9;
#pragma unroll
    for (int tap = 0; tap < 9; ++tap) out[tap] += w[tap];
  }
}

// ---- the batched GEMM ------------------------------------------------------------

// How the GEMM's operands lie, for c[o][t] = sum over k of A(o, k) B(t, k):
//   ReductionMajor (forward, backward-data): a [k][o] and b [k][t], rows ld_a and
//     ld_b apart, the transforms' [e][c][o] and [e][c][t], reduced over c;
//   ReductionMinor (the weight gradient): a [o][k] and b [t][k], rows ld_a and ld_b
//     apart, grad_y's and x's transforms [e][k][t] and [e][c][t], reduced over the
//     tiles t (o is then the layer's output channel, t its input channel).
// Either way the block stages each BK-deep step k-major in shared memory, so the
// multiply below is one loop for both.
enum class Operands { ReductionMajor, ReductionMinor };

// One batched GEMM: the element e and the split of the reduction are blockIdx.z =
// split * 36 + e; each (split, e) writes its own c matrix, planes apart.
struct GemmArgs {
  const float* a;
  const float* b;
  float* c;
  std::int64_t a_plane, b_plane, c_plane;  // floats between consecutive e (c: (split, e))
  int rows;                                // o < rows are computed and stored
  int cols;                                // t < cols are read (ReductionMinor's b rows)
  int ld_a, ld_b, ld_c;                    // row pitches, multiples of 4
  int red, red_per_split;                  // the reduction, and each split's share of it
};

// Block tile BM (o) x BN (t), BK-deep steps; 8x8 outputs per thread.
template <int BM, int BN>
struct GemmTile {
  static constexpr int BK = 8;
  static constexpr int kThreads = BM * BN / 64;               // 8x8 outputs each
  static constexpr int kMinBlocks = kThreads == 256 ? 2 : 3;  // <= 128 or 168 registers
  // Blocks of this tile one SM holds, its 65536 registers at the cap above (ptxas for
  // sm_90 uses 126-128 and 147-165): 128x128 2, 64x128 3, 64x64 6, 64x32 12. The
  // weight gradient's split plan counts these slots; a constant, so that the plan
  // and the bits it gives are a pure function of the shape and the SM count.
  static constexpr int kResidentBlocks = kThreads == 256 ? 2 : 65536 / (168 * kThreads);
  static constexpr int kWarpsM = BM / 64;  // a warp covers 8 x 4 threads: 64 x 32 outputs
  static_assert(BM % 64 == 0 && BN % 32 == 0 && kThreads % 32 == 0);
  static_assert(kThreads / 32 == kWarpsM * (BN / 32));
  static constexpr int kALoads = BK * BM / 4 / kThreads;  // float4s per thread per step
  static constexpr int kBLoads = BK * BN / 4 / kThreads;
  static_assert(kALoads >= 1 && kBLoads >= 1);
};

// Load j of this thread (f = tid + j * threads, float4 number f of the step's tile
// of ROWS rows) and its place in the k-major shared tile [BK][pitch].
// ReductionMajor: the step is BK rows of ROWS/4 float4s; f's float4 is row f / (ROWS/4)
// at column f % (ROWS/4) * 4, stored as it lies.
// ReductionMinor: the step is ROWS rows of two float4s (BK = 8 values of k); f's float4 is
// half f % 2 of row f / 2, so a warp reads 16 rows' whole 32-byte sectors, stored
// transposed: its 4 values go to k rows half*4 + 0..3 of column f / 2. The pitch
// ROWS + 4 puts the two halves' columns 16 banks apart: conflict-free stores.
template <Operands kForm, int ROWS, int BK, int kLoads, int kThreads>
struct OperandTile {
  static constexpr int kPitch = kForm == Operands::ReductionMinor ? ROWS + 4 : ROWS;
  float4 next[kLoads];

  // From rows of `src` `ld` apart; rows (ReductionMajor: columns) >= bound and k >= k_end
  // read as zeros.
  __device__ __forceinline__ void load(const float* src, int ld, int row0, int bound, int k0,
                                       int k_end, int tid) {
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int f = tid + j * kThreads;
      int row, k;
      if constexpr (kForm == Operands::ReductionMajor) {
        k = k0 + f / (ROWS / 4), row = row0 + f % (ROWS / 4) * 4;
      } else {
        row = row0 + f / 2, k = k0 + f % 2 * 4;
      }
      const std::int64_t at = kForm == Operands::ReductionMajor ? std::int64_t{k} * ld + row
                                                                : std::int64_t{row} * ld + k;
      // __ldg: the read-only path (LDG.E.128.CONSTANT), which the operands' const
      // __restrict__ kernel parameters gave these loads before GemmArgs held them.
      next[j] = k < k_end && row < bound ? __ldg(reinterpret_cast<const float4*>(src + at)) : zero;
    }
  }
  __device__ __forceinline__ void store(float (*tile)[kPitch], int tid) const {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int f = tid + j * kThreads;
      if constexpr (kForm == Operands::ReductionMajor) {
        *reinterpret_cast<float4*>(&tile[f / (ROWS / 4)][f % (ROWS / 4) * 4]) = next[j];
      } else {
        const int row = f / 2, k = f % 2 * 4;
        tile[k][row] = next[j].x, tile[k + 1][row] = next[j].y;
        tile[k + 2][row] = next[j].z, tile[k + 3][row] = next[j].w;
      }
    }
  }
};

template <int BM, int BN, Operands kForm>
__global__ void __launch_bounds__(GemmTile<BM, BN>::kThreads, GemmTile<BM, BN>::kMinBlocks)
    winograd_gemm_kernel(GemmArgs args) {
  using T = GemmTile<BM, BN>;
  constexpr int BK = T::BK, kThreads = T::kThreads;
  using ATile = OperandTile<kForm, BM, BK, T::kALoads, kThreads>;
  using BTile = OperandTile<kForm, BN, BK, T::kBLoads, kThreads>;
  __shared__ __align__(16) float As[2][BK][ATile::kPitch];
  __shared__ __align__(16) float Bs[2][BK][BTile::kPitch];

  const int tid = static_cast<int>(threadIdx.x);
  const int z = static_cast<int>(blockIdx.z), e = z % kElements, split = z / kElements;
  const int t0 = static_cast<int>(blockIdx.x) * BN, o0 = static_cast<int>(blockIdx.y) * BM;
  const float* a = args.a + e * args.a_plane;
  const float* b = args.b + e * args.b_plane;
  float* c = args.c + z * args.c_plane;
  const int k_begin = split * args.red_per_split;
  const int k_end = min(args.red, k_begin + args.red_per_split);
  // ReductionMajor reads the padded rows whole (zeros past rows and cols); ReductionMinor
  // stops at the last real row of each operand.
  const bool major = kForm == Operands::ReductionMajor;
  const int a_bound = major ? args.ld_a : args.rows, b_bound = major ? args.ld_b : args.cols;

  ATile a_next;
  BTile b_next;
  auto load_global = [&](int k0) {
    a_next.load(a, args.ld_a, o0, a_bound, k0, k_end, tid);
    b_next.load(b, args.ld_b, t0, b_bound, k0, k_end, tid);
  };
  auto store_shared = [&](int buffer) {
    a_next.store(As[buffer], tid);
    b_next.store(Bs[buffer], tid);
  };

  // This thread's rows: tm*4 + {0..3} and BM/2 further; columns tn*4 + {0..3} and
  // BN/2 further. Lanes: 8 rows x 4 columns; warps: kWarpsM x (BN/32). A warp's
  // float4 reads of a fragment are then 8 or 4 distinct addresses: one wavefront.
  const int lane = tid % 32, warp = tid / 32;
  const int tm = (warp % T::kWarpsM) * 8 + lane % 8;
  const int tn = (warp / T::kWarpsM) * 4 + lane / 8;
  float acc[8][8] = {};

  load_global(k_begin);
  store_shared(0);
  __syncthreads();
  int buffer = 0;
  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
    // The next step's loads, issued whether or not there is one (past k_end they
    // read nothing and give zeros): behind `if (has_next)` ptxas sank them to the end
    // of the loop, after the 512 FMAs that should hide their latency, and the
    // forward ran slower on a GPU (bench/results/gpu_h100_winograd_ab/).
    const bool has_next = k0 + BK < k_end;
    load_global(k0 + BK);
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float af[8], bf[8];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 va = *reinterpret_cast<const float4*>(&As[buffer][kk][h * (BM / 2) + tm * 4]);
        const float4 vb = *reinterpret_cast<const float4*>(&Bs[buffer][kk][h * (BN / 2) + tn * 4]);
        af[h * 4] = va.x, af[h * 4 + 1] = va.y, af[h * 4 + 2] = va.z, af[h * 4 + 3] = va.w;
        bf[h * 4] = vb.x, bf[h * 4 + 1] = vb.y, bf[h * 4 + 2] = vb.z, bf[h * 4 + 3] = vb.w;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(af[i], bf[j], acc[i][j]);
      }
    }
    if (has_next) {
      store_shared(buffer ^ 1);
      __syncthreads();
      buffer ^= 1;
    }
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int o = o0 + (i / 4) * (BM / 2) + tm * 4 + i % 4;
    if (o >= args.rows) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = t0 + h * (BN / 2) + tn * 4;
      if (t < args.ld_c) {
        *reinterpret_cast<float4*>(c + std::int64_t{o} * args.ld_c + t) =
            make_float4(acc[i][h * 4], acc[i][h * 4 + 1], acc[i][h * 4 + 2], acc[i][h * 4 + 3]);
      }
    }
  }
}

template <int BM, int BN, Operands kForm>
void launch_gemm(const GemmArgs& args, int splits, cudaStream_t stream) {
  const int cols = kForm == Operands::ReductionMajor ? args.ld_b : args.cols;
  const dim3 grid((cols + BN - 1) / BN, (args.rows + BM - 1) / BM, kElements * splits);
  TL_CHECK(grid.y <= 65535 && grid.z <= 65535, NotSupported,
           "conv2d (Winograd): " << args.rows << " output channels need more than 65535 tiles");
  winograd_gemm_kernel<BM, BN, kForm><<<grid, GemmTile<BM, BN>::kThreads, 0, stream>>>(args);
  TL_CUDA_CHECK_LAUNCH();
}

// The four steps for out [N,Co,P,Q] (+)= the correlation of in [N,Cr,H,W] with the
// kernels in `weight` (flip: backward-data's layout and rotation).
void run(float* out, const float* in, const float* weight, const float* bias, const Sizes& z,
         bool flip, bool accumulate, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const Geometry g = geometry(z);
  const std::int64_t u_count = z.Cr * z.ldCo, v_count = z.Cr * z.ldT, m_count = z.Co * z.ldT;
  Scratch u(stream, static_cast<std::size_t>(kElements * u_count) * sizeof(float));
  Scratch v(stream, static_cast<std::size_t>(kElements * v_count) * sizeof(float));
  Scratch m(stream, static_cast<std::size_t>(kElements * m_count) * sizeof(float));
  launch_grid_stride(winograd_weight_kernel, u_count, stream, u.as<float>(), weight, g, flip);
  launch_grid_stride(winograd_input_kernel, v_count, stream, v.as<float>(), in, g);
  GemmArgs args{};
  args.a = u.as<float>(), args.b = v.as<float>(), args.c = m.as<float>();
  args.a_plane = u_count, args.b_plane = v_count, args.c_plane = m_count;
  args.rows = g.Co, args.cols = g.ldT, args.ld_a = g.ldCo, args.ld_b = g.ldT, args.ld_c = g.ldT;
  args.red = args.red_per_split = g.Cr;
  constexpr Operands kMajor = Operands::ReductionMajor;
  if (g.Co > 64) {
    launch_gemm<128, 128, kMajor>(args, 1, native(stream));
  } else {
    launch_gemm<64, 128, kMajor>(args, 1, native(stream));
  }
  const bool vector = g.Q % 4 == 0 && reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
  launch_grid_stride(winograd_output_kernel, z.Co * z.T, stream, out, m.as<float>(), bias, g,
                     accumulate, vector);
}

// The weight gradient's GEMMs have only 36 x ceil(Co/BM) x ceil(Cr/BN) blocks
// (c256_28x28_b64: 144, on 132 SMs of two slots each; FashionNet's conv2: 36 blocks
// of one warp, on 132 SMs of twelve slots) and a long reduction over the tiles, so
// the reduction is cut into splits, each writing its own partial m (36 Co Cr floats,
// summed by split_reduce): the fewest splits whose last wave fills at least 85 % of
// the SMs' slots (sms x kResidentBlocks), each at least 64 tiles (8 steps) long, at
// most split_reduce's kMaxSplits. A pure function of the shape and the SM count,
// like the bits it gives.
int weight_splits(std::int64_t base_blocks, std::int64_t ldT, std::int64_t slots) {
  constexpr std::int64_t kMinTilesPerSplit = 64;
  int best = 1;
  double best_fill = 0.0;
  for (int splits = 1; splits <= kMaxSplits; ++splits) {
    if (splits > 1 && ldT / splits < kMinTilesPerSplit) break;
    const double waves = static_cast<double>(base_blocks * splits) / static_cast<double>(slots);
    const double fill = waves / std::ceil(waves);
    if (fill >= 0.85) return splits;
    if (fill > best_fill) best = splits, best_fill = fill;
  }
  return best;
}

// grad_weight [Co,Cr,3,3] += the weight gradient of the correlation of in [N,Cr,H,W]
// giving out [N,Co,P,Q], for grad_out: x's and grad_out's transforms, the GEMMs over
// the tiles (split), then Gᵀ m G summed over the splits.
void run_weight_gradient(float* grad_weight, const float* grad_out, const float* in, const Sizes& z,
                         const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const Geometry g = geometry(z);
  const int ldCr = static_cast<int>(round_up4(z.Cr));
  const std::int64_t v_count = z.Cr * z.ldT, y_count = z.Co * z.ldT, m_count = z.Co * ldCr;
  Scratch v(stream, static_cast<std::size_t>(kElements * v_count) * sizeof(float));
  Scratch y(stream, static_cast<std::size_t>(kElements * y_count) * sizeof(float));
  launch_grid_stride(winograd_input_kernel, v_count, stream, v.as<float>(), in, g);
  const bool vector = g.Q % 4 == 0 && reinterpret_cast<std::uintptr_t>(grad_out) % 16 == 0;
  launch_grid_stride(winograd_grad_output_kernel, y_count, stream, y.as<float>(), grad_out, g,
                     vector);
  GemmArgs args{};
  args.a = y.as<float>(), args.b = v.as<float>();
  args.a_plane = y_count, args.b_plane = v_count, args.c_plane = m_count;
  args.rows = g.Co, args.cols = g.Cr, args.ld_a = g.ldT, args.ld_b = g.ldT, args.ld_c = ldCr;
  args.red = g.ldT;
  const int sms = sm_count(stream.device().index);
  auto gemm = [&]<int BM, int BN>() {
    using T = GemmTile<BM, BN>;
    const std::int64_t base =
        std::int64_t{kElements} * ((g.Co + BM - 1) / BM) * ((g.Cr + BN - 1) / BN);
    const int wanted = weight_splits(base, g.ldT, std::int64_t{sms} * T::kResidentBlocks);
    const int per_split = ((g.ldT + wanted - 1) / wanted + T::BK - 1) / T::BK * T::BK;
    const int splits = (g.ldT + per_split - 1) / per_split;
    Scratch m(stream, static_cast<std::size_t>(splits * kElements * m_count) * sizeof(float));
    args.c = m.as<float>(), args.red_per_split = per_split;
    launch_gemm<BM, BN, Operands::ReductionMinor>(args, splits, native(stream));
    // The splits' partials summed in split_reduce's fixed tree, then Gᵀ m G.
    std::optional<Scratch> summed;
    const float* sum = m.as<float>();
    if (splits > 1) {
      summed.emplace(stream, static_cast<std::size_t>(kElements * m_count) * sizeof(float));
      split_reduce(m.as<float>(), kElements * m_count, splits, StoreInto{summed->as<float>()},
                   stream);
      sum = summed->as<float>();
    }
    launch_grid_stride(winograd_weight_grad_kernel, z.Co * z.Cr, stream, grad_weight, sum, g.Co,
                       g.Cr, ldCr);
  };
  // 64x64 tiles unless both channel counts fill the 128 tile (each a multiple of
  // neither is rare in wide layers; 64 x 64 wastes nothing on 64-channel layers),
  // 64x32 (one warp) where the reduced side has at most 32 channels, as FashionNet's
  // conv2 (a 64x64 tile would compute 32 columns of padding).
  if (g.Co > 64 && g.Cr > 64) {
    gemm.template operator()<128, 128>();
  } else if (g.Cr <= 32) {
    gemm.template operator()<64, 32>();
  } else {
    gemm.template operator()<64, 64>();
  }
}

Sizes forward_sizes(const Conv2dShape& s) {
  return sizes(s.N, s.C, s.K, s.H, s.W, s.params.pad_h, s.params.pad_w);
}

// grad_x[n,c,h,w] += sum_{k,r,s} grad_y[n,k,h+pad_h-r,w+pad_w-s] weight[k,c,r,s]: the
// correlation of grad_y, padded by 2 - pad, with weight[k,c] turned 180 degrees.
Sizes backward_data_sizes(const Conv2dShape& s) {
  return sizes(s.N, s.K, s.C, s.P, s.Q, 2 - s.params.pad_h, 2 - s.params.pad_w);
}

}  // namespace

bool winograd_chosen(const Conv2dShape& s, WinogradPass pass) {
  const Sizes z = pass == WinogradPass::BackwardData ? backward_data_sizes(s) : forward_sizes(s);
  if (!cpu::winograd_applies(s) || !fits(z)) return false;
  switch (conv2d_algorithm()) {
    case Conv2dAlgorithm::Im2col:
      return false;
    case Conv2dAlgorithm::Winograd:
      return true;
    case Conv2dAlgorithm::Auto:
      break;
  }
  if (pass == WinogradPass::BackwardWeight) {
    return std::max(s.C, s.K) >= kMinAutoWide && std::min(s.C, s.K) >= kMinAutoNarrow;
  }
  return z.Cr >= kMinAutoReduced && z.Co >= kMinAutoProduced;
}

void winograd_forward(float* y, const float* x, const float* weight, const float* bias,
                      const Conv2dShape& s, const Stream& stream) {
  run(y, x, weight, bias, forward_sizes(s), false, false, stream);
}

void winograd_backward_data(float* grad_x, const float* grad_y, const float* weight,
                            const Conv2dShape& s, const Stream& stream) {
  run(grad_x, grad_y, weight, nullptr, backward_data_sizes(s), true, true, stream);
}

void winograd_backward_weight(float* grad_weight, const float* grad_y, const float* x,
                              const Conv2dShape& s, const Stream& stream) {
  run_weight_gradient(grad_weight, grad_y, x, forward_sizes(s), stream);
}

}  // namespace towerlab::cuda
