// Winograd F(2x2, 3x3) convolution on the CPU: the algorithm, its matrices and its
// numerics in kernels/cpu/winograd.h. The steps, for forward and backward-data alike
// (with at most 16 channels each side on AVX2, steps 2 fused for each tile row
// instead: kernels/cpu/winograd_fused.cpp, the same bits):
//   1. weight transform  U[e] = (G g Gᵀ)[e]                      [16][K][C], per call,
//                        each U[e] packed once into the GEMM's panels (PackedA)
//   2. for each block of tiles (in parallel, blocks fixed by the shape):
//      input transform   V[e](c, t) = (Bᵀ d[t,c] B)[e]          [16][C, tiles],
//                        each V[e] written in the GEMM's panels of B
//      16 GEMMs          M[e] = U[e] · V[e]                      [K][16][tiles]
//      output transform  out tile (t, k) (+)= Aᵀ m[t,k] A        2x2, clipped at the edge
// This file holds the driver, the weight transform and the portable transforms; the
// transforms on AVX2 and AVX-512 are in kernels/cpu/winograd_x86.cpp, and what the
// three files share in kernels/cpu/winograd_steps.h. In them C and K are the
// correlation's input and output channels: for backward-data they are the layer's K
// and C, and the input is grad_y. The weight gradient is in
// kernels/cpu/winograd_weight_grad.cpp, the choice of Winograd or im2col
// (set_conv2d_algorithm, winograd_chosen) in kernels/cpu/winograd_choice.cpp.
#include "kernels/cpu/winograd.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/winograd_steps.h"
#include "kernels/cpu/winograd_tiles.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

using namespace winograd;  // kernels/cpu/winograd_tiles.h, kernels/cpu/winograd_steps.h

// u [4][4] = G g Gᵀ for g [3][3], one kernel a lane of V (or V = float: one kernel).
template <typename V>
[[gnu::always_inline]] inline void transform_kernel(V (&u)[16], const V (&g)[3][3]) {
  V gg[4][3];  // G g
  for (int s = 0; s < 3; ++s) {
    const V g0 = g[0][s], g1 = g[1][s], g2 = g[2][s];
    gg[0][s] = g0;
    gg[1][s] = 0.5f * (g0 + g1 + g2);
    gg[2][s] = 0.5f * (g0 - g1 + g2);
    gg[3][s] = g2;
  }
  for (int i = 0; i < 4; ++i) {
    const V g0 = gg[i][0], g1 = gg[i][1], g2 = gg[i][2];
    u[i * 4 + 0] = g0;
    u[i * 4 + 1] = 0.5f * (g0 + g1 + g2);
    u[i * 4 + 2] = 0.5f * (g0 - g1 + g2);
    u[i * 4 + 3] = g2;
  }
}

// u[e * ldu + l] = (G g_l Gᵀ)[e] for the kernels l < count, kernel l's tap (r, s) at
// g[l * stride + r * row + s * col] (the caller turns the kernels by passing
// negative row and col).
void transform_kernels(float* u, std::int64_t ldu, const float* g, std::int64_t stride,
                       std::int64_t row, std::int64_t col, std::int64_t count) {
  for (std::int64_t l = 0; l < count; ++l) {
    float taps[3][3], out[16];
    for (int r = 0; r < 3; ++r) {
      for (int t = 0; t < 3; ++t) taps[r][t] = g[l * stride + r * row + t * col];
    }
    transform_kernel(out, taps);
    for (int e = 0; e < 16; ++e) u[e * ldu + l] = out[e];
  }
}

#if TL_CPU_X86
// transform_kernels on AVX-512: sixteen kernels a vector, their taps gathered and
// each of their 16 elements stored as one vector, where the scalar loop stores a
// kernel's 16 values into 16 arrays one at a time.
__attribute__((target("avx512f"))) void transform_kernels_avx512(float* u, std::int64_t ldu,
                                                                 const float* g,
                                                                 std::int64_t stride,
                                                                 std::int64_t row, std::int64_t col,
                                                                 std::int64_t count) {
  const __m512i lane =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(stride)));
  for (std::int64_t l0 = 0; l0 < count; l0 += 16) {
    const __mmask16 lanes = first_lanes(count - l0);
    __m512 taps[3][3], out[16];
    for (int r = 0; r < 3; ++r) {
      for (int t = 0; t < 3; ++t) {
        taps[r][t] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, lane,
                                              g + l0 * stride + r * row + t * col, 4);
      }
    }
    transform_kernel(out, taps);
    for (int e = 0; e < 16; ++e) _mm512_mask_storeu_ps(u + e * ldu + l0, lanes, out[e]);
  }
}
#endif

// Step 1 of the file comment: transform_kernels on the selected ISA.
void transform_weight(float* u, std::int64_t ldu, const float* g, std::int64_t stride,
                      std::int64_t row, std::int64_t col, std::int64_t count) {
#if TL_CPU_X86
  if (avx512_selected()) {
    transform_kernels_avx512(u, ldu, g, stride, row, col, count);
    return;
  }
#endif
  transform_kernels(u, ldu, g, stride, row, col, count);
}

// The tiles of a tile row rounded up to whole groups of four, and the padded input
// columns they read (tile tw reads 2*tw .. 2*tw + 3).
std::int64_t vector_tiles(const Problem& p) {
  return (p.tiles_w + 3) / 4 * 4;
}
std::int64_t row_width(const Problem& p) {
  return 2 * vector_tiles(p) + 2;
}

// The floats of one Workspace for blocks of up to `whole.n` tiles, and the Workspace
// laid out in them, with V (see whole_panels) and the rows' padding zeroed.
std::int64_t workspace_floats(const Problem& p, const GemmBPanels& whole) {
  return 16 * spread_stride(whole.floats()) + 16 * p.K * whole.n + 4 * row_width(p);
}
Workspace workspace_in(float* base, const Problem& p, const GemmBPanels& whole) {
  const std::int64_t v_stride = spread_stride(whole.floats());
  float* m = base + 16 * v_stride;
  const Workspace ws{base, m, m + 16 * p.K * whole.n, whole.n, v_stride};
  std::fill(ws.v, ws.m, 0.0f);
  std::fill(ws.rows, ws.rows + 4 * row_width(p), 0.0f);  // the padding
  return ws;
}

// The layout of V for `columns` tiles rounded up to whole panels of the GEMM, which
// then multiplies its last panel whole, without a ragged edge: the columns past the
// tiles hold finite leftovers (zeros at first, then what an earlier block or a tile
// row's last group left), whose products are never read, since a column of M
// depends on its column of V alone.
GemmBPanels whole_panels(const PackedA& u, std::int64_t columns) {
  GemmBPanels panels = u.b_panels(columns);
  panels.n = panels.panels() * panels.width;
  return panels;
}

// V[e](c, first + tw) = (Bᵀ d B)[e] for the tiles tw of tile row (n, th), d their
// 4x4 inputs (zero outside the image). Four tiles at a time in vector lanes: tile
// tw's column j is row element 2*tw + j, so the lanes are the even or odd elements
// of two loads; each tile's values are stored one by one.
void transform_input_row(const Workspace& ws, const BlockInput& v, const float* in,
                         const Problem& p, std::int64_t n, std::int64_t th, std::int64_t first) {
  const std::int64_t width = row_width(p);
  // Valid input columns w = x - pad_w lie at x in [x0, x1) of a padded row.
  const std::int64_t x0 = std::min(width, p.pad_w), x1 = std::min(width, p.W + p.pad_w);
  for (std::int64_t c = 0; c < p.C; ++c) {
    const float* plane = in + (n * p.C + c) * p.H * p.W;  // [H,W]
    prefetch_rows(in, p, n, th, c);
    for (int i = 0; i < 4; ++i) {  // rows[i][x] = x[n, c, 2*th - pad_h + i, x - pad_w]
      // Columns outside [x0, x1) stay zero from run(): only the image's are written.
      float* row = ws.rows + i * width;
      const std::int64_t h = 2 * th - p.pad_h + i;
      if (h < 0 || h >= p.H) {
        for (std::int64_t x = x0; x < x1; ++x) row[x] = 0.0f;
        continue;
      }
      const float* src = plane + h * p.W;  // [W]: input column x - pad_w
      for (std::int64_t x = x0; x < x1; ++x) row[x] = src[x - p.pad_w];
    }
    for (std::int64_t tw = 0; tw < p.tiles_w; tw += 4) {
      Vec4 d[4][4];  // d[i][j]: element (i, j) of tiles tw..tw+3
      for (int i = 0; i < 4; ++i) {
        const float* r = ws.rows + i * width + 2 * tw;
        const Vec4 r0 = load4(r), r4 = load4(r + 4), r2 = load4(r + 2), r6 = load4(r + 6);
        d[i][0] = __builtin_shufflevector(r0, r4, 0, 2, 4, 6);
        d[i][1] = __builtin_shufflevector(r0, r4, 1, 3, 5, 7);
        d[i][2] = __builtin_shufflevector(r2, r6, 0, 2, 4, 6);
        d[i][3] = __builtin_shufflevector(r2, r6, 1, 3, 5, 7);
      }
      transform_input_tile(d);
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) {
          for (std::int64_t l = 0; l < std::min<std::int64_t>(4, p.tiles_w - tw); ++l) {
            *v.at(4 * i + j, c, first + tw + l) = d[i][j][l];
          }
        }
      }
    }
  }
}

// V for the tile rows [row0, row1) (row = n * tiles_h + th), on the ISA whose GEMM
// reads it (its panels' width is that ISA's).
void transform_input(const Workspace& ws, const BlockInput& v, const float* in, const Problem& p,
                     std::int64_t row0, std::int64_t row1) {
#if TL_CPU_X86
  if (v.panels.isa == GemmIsa::Avx512) {  // kernels/cpu/x86.h
    transform_input_avx512(v, in, p, row0, row1);
    return;
  }
  if (v.panels.isa == GemmIsa::Avx2) {
    if (p.tiles_w == 4) {
      transform_input_pairs_avx2(v, in, p, row0, row1);
    } else {
      transform_input_avx2(v, in, p, row0, row1);
    }
    return;
  }
#endif
  for (std::int64_t row = row0; row < row1; ++row) {
    transform_input_row(ws, v, in, p, row / p.tiles_h, row % p.tiles_h, (row - row0) * p.tiles_w);
  }
}

// The output of tile rows [row0, row1) (row = n * tiles_h + th, its tiles at
// columns (row - row0) * tiles_w onwards) from M [K][16][block]: out = bias + Aᵀ m
// A, or out += Aᵀ m A when `accumulate`. M is read once, straight into the output
// rows, rather than in a pass each for Aᵀ, A and the scatter: four tiles (eight
// output columns) a vector, channel by channel. A tile past the bottom or right
// edge (P or Q odd) writes only its pixels inside the output. A group of four may
// read up to 3 columns past the row's tiles (run() leaves room); their lanes are
// not written. Out is float, or a forward's 16-bit y (assigned, never accumulated):
// each value bias + Aᵀ m A rounded once as it is stored.
template <typename Out>
void transform_output(const Workspace& ws, Out* out, const float* bias, bool accumulate,
                      const Problem& p, std::int64_t row0, std::int64_t row1) {
  for (std::int64_t k = 0; k < p.K; ++k) {
    for (std::int64_t row = row0; row < row1; ++row) {
      const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
      const std::int64_t rows = std::min<std::int64_t>(2, p.P - 2 * th);
      Out* plane = out + (n * p.K + k) * p.P * p.Q;  // [P,Q]
      const Vec4 b = splat(bias != nullptr ? bias[k] : 0.0f);
      const float* mk = ws.m_at(k, 0) + (row - row0) * p.tiles_w;
      for (std::int64_t tw = 0; tw < p.tiles_w; tw += 4) {
        Vec4 m[16];
        for (int e = 0; e < 16; ++e) m[e] = load4(mk + e * ws.block + tw);
        const std::int64_t pixels = std::min<std::int64_t>(8, p.Q - 2 * tw);
        for (int i = 0; i < rows; ++i) {
          Vec4 left, right;
          output_row(m, i, left, right);
          Out* y = plane + (2 * th + i) * p.Q + 2 * tw;
          float values[8];  // pixels 2*tw .. 2*tw + 7 of the row
          store4(values, __builtin_shufflevector(left, right, 0, 4, 1, 5));
          store4(values + 4, __builtin_shufflevector(left, right, 2, 6, 3, 7));
          for (std::int64_t x = 0; x < pixels; ++x) {
            if constexpr (std::is_same_v<Out, float>) {
              y[x] = accumulate ? y[x] + values[x] : b[0] + values[x];
            } else {
              y[x] = Out(b[0] + values[x]);
            }
          }
        }
      }
    }
  }
}

// Steps 2 of the file comment for tile rows [row0, row1) (row = n * tiles_h + th),
// with u the 16 matrices U[e] [K][C] of the transformed kernel, packed.
template <typename Out>
void run_block(Out* out, const float* in, const std::vector<PackedA>& u, const float* bias,
               bool accumulate, const Problem& p, std::int64_t row0, std::int64_t row1,
               const Workspace& ws) {
  const BlockInput v{ws.v, whole_panels(u[0], (row1 - row0) * p.tiles_w), ws.v_stride};
  transform_input(ws, v, in, p, row0, row1);
  for (int e = 0; e < 16; ++e) gemm_packed(u[e], v.panels, v.of(e), 0.0f, ws.m_at(0, e), ws.ld());
#if TL_CPU_X86
  // The output transform of the ISA that wrote V (transform_input), which reads M's
  // columns in the order that one left its tiles in.
  if (v.panels.isa == GemmIsa::Avx512) {  // kernels/cpu/x86.h
    transform_output_avx512(ws, out, bias, accumulate, p, row0, row1);
    return;
  }
  if (v.panels.isa == GemmIsa::Avx2) {
    transform_output_avx2(ws, out, bias, accumulate, p, row0, row1);
    return;
  }
#endif
  transform_output(ws, out, bias, accumulate, p, row0, row1);
}

// U [16][rows][cols] as 16 packed GEMM operands, packed once for all the blocks.
std::vector<PackedA> packed_weights(const float* u, std::int64_t rows, std::int64_t cols) {
  std::vector<PackedA> packed;
  packed.reserve(16);
  for (int e = 0; e < 16; ++e) packed.emplace_back(u + e * rows * cols, cols, rows, cols);
  return packed;
}

// Steps 2 over all tile rows, u the 16 matrices U[e] [K][C] of the transformed
// kernel: fused for few channels on AVX2, else in blocks spread over the caller's
// threads (each block writes its own output rows).
template <typename Out>
void run(Out* out, const float* in, const float* u_matrices, const float* bias, bool accumulate,
         const Problem& p) {
#if TL_CPU_X86
  if (fused_applies(p)) {
    run_fused_avx2(out, in, u_matrices, bias, accumulate, p);
    return;
  }
#endif
  const std::vector<PackedA> u = packed_weights(u_matrices, p.K, p.C);
  const std::int64_t per_block = rows_per_block(p);
  // M's columns: a block's tiles and the 7 past them that the AVX2 output
  // transform's last group of eight reads.
  const GemmBPanels whole = whole_panels(u[0], per_block * p.tiles_w + 7);
  const std::int64_t all_rows = p.N * p.tiles_h, blocks = (all_rows + per_block - 1) / per_block;
  parallel_rows(blocks, whole.n * 16 * (p.C + p.K), [&](std::int64_t first, std::int64_t last) {
    HostScratch<float> scratch(workspace_floats(p, whole));
    const Workspace ws = workspace_in(scratch.get(), p, whole);
    for (std::int64_t b = first; b < last; ++b) {
      run_block(out, in, u, bias, accumulate, p, b * per_block,
                std::min(all_rows, (b + 1) * per_block), ws);
    }
  });
}

}  // namespace

template <typename Out>
void winograd_forward(Out* y, const float* x, const float* weight, const float* bias,
                      const Conv2dShape& s) {
  if (f4x4_chosen(s)) {
    winograd4_forward(y, x, weight, bias, s);
    return;
  }
  const Problem p = make_problem(s.N, s.C, s.H, s.W, s.K, s.params.pad_h, s.params.pad_w);
  HostScratch<float> u(16 * s.K * s.C);     // [16][K][C]
  for (std::int64_t k = 0; k < s.K; ++k) {  // the kernels of weight[k], c a lane
    transform_weight(u.get() + k * s.C, s.K * s.C, weight + k * s.C * 9, 9, 3, 1, s.C);
  }
  run(y, x, u.get(), bias, false, p);
}

void winograd_backward_data(float* grad_x, const float* grad_y, const float* weight,
                            const Conv2dShape& s, bool accumulate) {
  // grad_x[n,c,h,w] += sum_{k,r,s} grad_y[n,k,h+pad_h-r,w+pad_w-s] weight[k,c,r,s]: the
  // correlation of grad_y, padded by 2 - pad, with weight[k,c] turned 180 degrees.
  if (f4x4_chosen(s)) {
    winograd4_backward_data(grad_x, grad_y, weight, s, accumulate);
    return;
  }
  const Problem p = make_problem(s.N, s.K, s.P, s.Q, s.C, 2 - s.params.pad_h, 2 - s.params.pad_w);
  HostScratch<float> u(16 * s.C * s.K);     // [16][C][K]
  for (std::int64_t c = 0; c < s.C; ++c) {  // the kernels weight[., c], k a lane
    // g(r,s) = weight[k,c,2-r,2-s]: start at the last tap, step backwards.
    transform_weight(u.get() + c * s.K, s.C * s.K, weight + c * 9 + 8, s.C * 9, -3, -1, s.K);
  }
  run(grad_x, grad_y, u.get(), nullptr, accumulate, p);
}

template void winograd_forward<float>(float*, const float*, const float*, const float*,
                                      const Conv2dShape&);
template void winograd_forward<bfloat16>(bfloat16*, const float*, const float*, const float*,
                                         const Conv2dShape&);
template void winograd_forward<float16>(float16*, const float*, const float*, const float*,
                                        const Conv2dShape&);

}  // namespace towerlab::cpu
