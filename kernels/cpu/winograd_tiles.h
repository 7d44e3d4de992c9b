// What all the CPU Winograd kernels share (internal): the forward and backward-data,
// F(2x2, 3x3), in kernels/cpu/winograd.cpp and the files beside it
// (kernels/cpu/winograd_steps.h), and the weight gradient, F(3x3, 2x2), in
// kernels/cpu/winograd_weight_grad.cpp. Both cut a correlation into the same blocks
// of tile rows and transform the input alike (Bᵀ d B); the algebra is in
// kernels/cpu/winograd.h. F(4x4, 3x3) (kernels/cpu/winograd4.cpp) takes the Problem
// (make_problem with tiles of 4) and spread_stride.
#pragma once

#include <algorithm>
#include <cstdint>

namespace towerlab::cpu::winograd {

// One correlation with a 3x3 kernel, stride 1: out [N,K,P,Q] from in [N,C,H,W]
// padded by pad_h, pad_w (0 to 2), P = H + 2*pad_h - 2, Q likewise.
struct Problem {
  std::int64_t N, C, H, W;
  std::int64_t K, P, Q;
  std::int64_t pad_h, pad_w;
  std::int64_t tiles_h, tiles_w;  // ceil(P/tile), ceil(Q/tile): output tiles per image
};

// `tile`: the output tile's side, 2 for F(2x2, 3x3), 4 for F(4x4, 3x3).
inline Problem make_problem(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W,
                            std::int64_t K, std::int64_t pad_h, std::int64_t pad_w,
                            std::int64_t tile = 2) {
  const std::int64_t P = H + 2 * pad_h - 2, Q = W + 2 * pad_w - 2;
  return {N, C, H, W, K, P, Q, pad_h, pad_w, (P + tile - 1) / tile, (Q + tile - 1) / tile};
}

// Tile blocks are runs of whole tile rows (one image's tiles th, all tw), so that
// the transforms walk input and output rows contiguously: about enough rows that V
// and M of one block (16 (C + K) floats a tile) take three quarters of a 512 KiB L2
// (larger and smaller blocks measured no faster on FashionNet's second layer). A
// function of the shape alone, so the blocks, and with them the bits, do not
// depend on the threads.
inline std::int64_t rows_per_block(const Problem& p) {
  constexpr std::int64_t kBlockBytes = 384 * 1024;
  const std::int64_t tiles = kBlockBytes / (16 * (p.C + p.K) * std::int64_t{sizeof(float)});
  return std::max<std::int64_t>(1, tiles / p.tiles_w);
}

// How far apart to keep 16 arrays of `floats` each that a transform writes side by
// side (V[e] or Y[e], one vector into each in turn): an odd number of 64-byte lines,
// so that their rows at equal offsets fall into 16 different sets of the L1 cache.
// With V[e] 16 KiB apart (FashionNet's conv2 backward-data) all 16 fell into one
// 8-way set and the input transform took twice as long.
inline std::int64_t spread_stride(std::int64_t floats) {
  constexpr std::int64_t kLine = 16;  // floats
  const std::int64_t lines = (floats + kLine - 1) / kLine;
  return (lines | 1) * kLine;
}

// (a, b, c, d) <- (a - c, b + c, c - b, b - d): Bᵀ on a column of 4, or B on a row
// of 4, one tile per lane. The same operations whatever the vector width: the same
// bits.
template <typename V>
[[gnu::always_inline]] inline void apply_b(V& a, V& b, V& c, V& d) {
  const V a0 = a, b0 = b, c0 = c, d0 = d;
  a = a0 - c0;
  b = b0 + c0;
  c = c0 - b0;
  d = b0 - d0;
}

// d [4][4] <- Bᵀ d B: columns first, then rows, as the forward's input transform.
template <typename V>
[[gnu::always_inline]] inline void transform_input_tile(V (&d)[4][4]) {
  for (int j = 0; j < 4; ++j) apply_b(d[0][j], d[1][j], d[2][j], d[3][j]);
  for (int i = 0; i < 4; ++i) apply_b(d[i][0], d[i][1], d[i][2], d[i][3]);
}

}  // namespace towerlab::cpu::winograd
