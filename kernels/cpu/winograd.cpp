// Winograd F(2x2, 3x3) convolution on the CPU: the algorithm, its matrices and its
// numerics in kernels/cpu/winograd.h. The steps, for forward and backward-data alike:
//   1. weight transform  U[e] = (G g Gᵀ)[e]                      [16][K][C], per call
//   2. for each block of tiles (in parallel, blocks fixed by the shape):
//      input transform   V[e][c][t] = (Bᵀ d[t,c] B)[e]          [16][C][tiles]
//      16 GEMMs          M[e] = U[e] · V[e]                      [16][K][tiles]
//      output transform  out tile (t, k) (+)= Aᵀ m[t,k] A        2x2, clipped at the edge
// Inside this file C and K are the correlation's input and output channels: for
// backward-data they are the layer's K and C, and the input is grad_y.
#include "kernels/cpu/winograd.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"

namespace towerlab::cpu {

namespace {

// The environment may pin the algorithm (TOWERLAB_CONV2D_ALGORITHM=auto|im2col|
// winograd); an unknown name is ignored, as TOWERLAB_GEMM_ISA's is.
Conv2dAlgorithm initial_algorithm() {
  const char* name = std::getenv("TOWERLAB_CONV2D_ALGORITHM");
  const std::string wanted = name != nullptr ? name : "";
  if (wanted == "im2col") return Conv2dAlgorithm::Im2col;
  if (wanted == "winograd") return Conv2dAlgorithm::Winograd;
  return Conv2dAlgorithm::Auto;
}

std::atomic<Conv2dAlgorithm>& selected_algorithm() {
  static std::atomic<Conv2dAlgorithm> algorithm{initial_algorithm()};
  return algorithm;
}

// Auto takes Winograd from this many input and output channels on. Below, the
// transforms (linear in C + K per tile) cost more than the GEMM saves (linear in
// C * K): FashionNet's first layer (C = 1) runs faster with im2col
// (bench/results/winograd.md).
constexpr std::int64_t kMinAutoChannels = 16;

// One correlation with a 3x3 kernel, stride 1: out [N,K,P,Q] from in [N,C,H,W]
// padded by pad_h, pad_w (0 to 2), P = H + 2*pad_h - 2, Q likewise.
struct Problem {
  std::int64_t N, C, H, W;
  std::int64_t K, P, Q;
  std::int64_t pad_h, pad_w;
  std::int64_t tiles_h, tiles_w;  // ceil(P/2), ceil(Q/2): 2x2 output tiles per image
  std::int64_t tiles() const { return N * tiles_h * tiles_w; }
};

Problem make_problem(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, std::int64_t K,
                     std::int64_t pad_h, std::int64_t pad_w) {
  const std::int64_t P = H + 2 * pad_h - 2, Q = W + 2 * pad_w - 2;
  return {N, C, H, W, K, P, Q, pad_h, pad_w, (P + 1) / 2, (Q + 1) / 2};
}

// u [4][4] (stride ldu between elements) = G g Gᵀ for g [3][3] (element (r,s) at
// g[r*row + s*col]: the caller turns the kernel by passing negative strides).
void transform_kernel(float* u, std::int64_t ldu, const float* g, std::int64_t row,
                      std::int64_t col) {
  float gg[4][3];  // G g
  for (int s = 0; s < 3; ++s) {
    const float g0 = g[s * col], g1 = g[row + s * col], g2 = g[2 * row + s * col];
    gg[0][s] = g0;
    gg[1][s] = 0.5f * (g0 + g1 + g2);
    gg[2][s] = 0.5f * (g0 - g1 + g2);
    gg[3][s] = g2;
  }
  for (int i = 0; i < 4; ++i) {
    const float g0 = gg[i][0], g1 = gg[i][1], g2 = gg[i][2];
    u[(i * 4 + 0) * ldu] = g0;
    u[(i * 4 + 1) * ldu] = 0.5f * (g0 + g1 + g2);
    u[(i * 4 + 2) * ldu] = 0.5f * (g0 - g1 + g2);
    u[(i * 4 + 3) * ldu] = g2;
  }
}

// v [4][4] (stride ldv between elements) = Bᵀ d B for d [4][4].
inline void transform_input(float* v, std::int64_t ldv, const float (&d)[4][4]) {
  float bd[4][4];  // Bᵀ d
  for (int j = 0; j < 4; ++j) {
    bd[0][j] = d[0][j] - d[2][j];
    bd[1][j] = d[1][j] + d[2][j];
    bd[2][j] = d[2][j] - d[1][j];
    bd[3][j] = d[1][j] - d[3][j];
  }
  for (int i = 0; i < 4; ++i) {
    v[(i * 4 + 0) * ldv] = bd[i][0] - bd[i][2];
    v[(i * 4 + 1) * ldv] = bd[i][1] + bd[i][2];
    v[(i * 4 + 2) * ldv] = bd[i][2] - bd[i][1];
    v[(i * 4 + 3) * ldv] = bd[i][1] - bd[i][3];
  }
}

// o [2][2] = Aᵀ m A for m [4][4] (stride ldm between elements).
inline void transform_output(float (&o)[2][2], const float* m, std::int64_t ldm) {
  float am[2][4];  // Aᵀ m
  for (int j = 0; j < 4; ++j) {
    const float m0 = m[j * ldm], m1 = m[(4 + j) * ldm], m2 = m[(8 + j) * ldm],
                m3 = m[(12 + j) * ldm];
    am[0][j] = m0 + m1 + m2;
    am[1][j] = m1 - m2 - m3;
  }
  for (int i = 0; i < 2; ++i) {
    o[i][0] = am[i][0] + am[i][1] + am[i][2];
    o[i][1] = am[i][1] - am[i][2] - am[i][3];
  }
}

// How many tiles a block holds: V and M of one block ([16][C+K][tiles] floats)
// about fill half of a 1 MiB L2, in multiples of 16 (the GEMM's column panel). A
// function of the shape alone, so the blocks, and with them the bits, do not depend
// on the threads.
std::int64_t tiles_per_block(const Problem& p) {
  constexpr std::int64_t kBlockBytes = 384 * 1024;
  const std::int64_t tiles = kBlockBytes / (16 * (p.C + p.K) * std::int64_t{sizeof(float)});
  return std::clamp<std::int64_t>(tiles / 16 * 16, 16, 512);
}

// Steps 2 of the file comment for tiles [t0, t1), with v [16][C][block] and
// m [16][K][block] the block's scratch and u [16][K][C] the transformed kernel.
// out = bias + result when `accumulate` is false, out += result when it is true.
void run_block(float* out, const float* in, const float* u, const float* bias, bool accumulate,
               const Problem& p, std::int64_t t0, std::int64_t t1, std::int64_t block, float* v,
               float* m) {
  const std::int64_t tiles = t1 - t0, per_image = p.tiles_h * p.tiles_w;
  // Input transform: for each channel, walk the tiles in order, gathering the 4x4
  // input (zero outside the image) that output tile (th, tw) reads.
  for (std::int64_t c = 0; c < p.C; ++c) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t n = t / per_image, th = t % per_image / p.tiles_w, tw = t % p.tiles_w;
      const std::int64_t h0 = 2 * th - p.pad_h, w0 = 2 * tw - p.pad_w;
      const float* plane = in + (n * p.C + c) * p.H * p.W;  // [H,W]
      float d[4][4];
      if (h0 >= 0 && w0 >= 0 && h0 + 4 <= p.H && w0 + 4 <= p.W) {
        for (int i = 0; i < 4; ++i) {
          for (int j = 0; j < 4; ++j) d[i][j] = plane[(h0 + i) * p.W + w0 + j];
        }
      } else {
        for (int i = 0; i < 4; ++i) {
          for (int j = 0; j < 4; ++j) {
            const std::int64_t h = h0 + i, w = w0 + j;
            d[i][j] = h >= 0 && h < p.H && w >= 0 && w < p.W ? plane[h * p.W + w] : 0.0f;
          }
        }
      }
      transform_input(v + c * block + (t - t0), p.C * block, d);
    }
  }
  for (int e = 0; e < 16; ++e) {
    gemm<float>(false, false, p.K, tiles, p.C, 1.0f, u + e * p.K * p.C, p.C, v + e * p.C * block,
                block, 0.0f, m + e * p.K * block, block);
  }
  // Output transform: a tile past the bottom or right edge (P or Q odd) writes only
  // its pixels inside the image.
  for (std::int64_t k = 0; k < p.K; ++k) {
    const float b = bias != nullptr ? bias[k] : 0.0f;
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t n = t / per_image, th = t % per_image / p.tiles_w, tw = t % p.tiles_w;
      float o[2][2];
      transform_output(o, m + k * block + (t - t0), p.K * block);
      float* plane = out + (n * p.K + k) * p.P * p.Q;  // [P,Q]
      const int rows = static_cast<int>(std::min<std::int64_t>(2, p.P - 2 * th));
      const int cols = static_cast<int>(std::min<std::int64_t>(2, p.Q - 2 * tw));
      for (int i = 0; i < rows; ++i) {
        float* row = plane + (2 * th + i) * p.Q + 2 * tw;
        for (int j = 0; j < cols; ++j) row[j] = accumulate ? row[j] + o[i][j] : b + o[i][j];
      }
    }
  }
}

// Steps 2 over all tiles, blocks spread over the caller's threads (each block
// writes its own output pixels).
void run(float* out, const float* in, const float* u, const float* bias, bool accumulate,
         const Problem& p) {
  const std::int64_t block = tiles_per_block(p);
  const std::int64_t blocks = (p.tiles() + block - 1) / block;
  parallel_rows(blocks, block * 16 * (p.C + p.K), [&](std::int64_t first, std::int64_t last) {
    HostScratch<float> v(16 * p.C * block), m(16 * p.K * block);
    for (std::int64_t b = first; b < last; ++b) {
      run_block(out, in, u, bias, accumulate, p, b * block, std::min(p.tiles(), (b + 1) * block),
                block, v.get(), m.get());
    }
  });
}

}  // namespace

Conv2dAlgorithm conv2d_algorithm() {
  return selected_algorithm().load();
}

ScopedConv2dAlgorithm::ScopedConv2dAlgorithm(Conv2dAlgorithm algorithm)
    : previous_(selected_algorithm().exchange(algorithm)) {}

ScopedConv2dAlgorithm::~ScopedConv2dAlgorithm() {
  selected_algorithm().store(previous_);
}

bool winograd_applies(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  return s.R == 3 && s.S == 3 && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 &&
         p.dilation_w == 1 && p.pad_h >= 0 && p.pad_h <= 1 && p.pad_w >= 0 && p.pad_w <= 1;
}

bool winograd_chosen(const Conv2dShape& s) {
  switch (conv2d_algorithm()) {
    case Conv2dAlgorithm::Im2col:
      return false;
    case Conv2dAlgorithm::Winograd:
      return winograd_applies(s);
    case Conv2dAlgorithm::Auto:
      break;
  }
  return winograd_applies(s) && s.C >= kMinAutoChannels && s.K >= kMinAutoChannels;
}

void winograd_forward(float* y, const float* x, const float* weight, const float* bias,
                      const Conv2dShape& s) {
  const Problem p = make_problem(s.N, s.C, s.H, s.W, s.K, s.params.pad_h, s.params.pad_w);
  HostScratch<float> u(16 * s.K * s.C);  // [16][K][C]
  for (std::int64_t k = 0; k < s.K; ++k) {
    for (std::int64_t c = 0; c < s.C; ++c) {
      transform_kernel(u.get() + k * s.C + c, s.K * s.C, weight + (k * s.C + c) * 9, 3, 1);
    }
  }
  run(y, x, u.get(), bias, false, p);
}

void winograd_backward_data(float* grad_x, const float* grad_y, const float* weight,
                            const Conv2dShape& s) {
  // grad_x[n,c,h,w] += sum_{k,r,s} grad_y[n,k,h+pad_h-r,w+pad_w-s] weight[k,c,r,s]: the
  // correlation of grad_y, padded by 2 - pad, with weight[k,c] turned 180 degrees.
  const Problem p = make_problem(s.N, s.K, s.P, s.Q, s.C, 2 - s.params.pad_h, 2 - s.params.pad_w);
  HostScratch<float> u(16 * s.C * s.K);  // [16][C][K]
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t k = 0; k < s.K; ++k) {
      // g(r,s) = weight[k,c,2-r,2-s]: start at the last tap, step backwards.
      transform_kernel(u.get() + c * s.K + k, s.C * s.K, weight + (k * s.C + c) * 9 + 8, -3, -1);
    }
  }
  run(grad_x, grad_y, u.get(), nullptr, true, p);
}

}  // namespace towerlab::cpu
