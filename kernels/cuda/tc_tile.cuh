// The shared-memory tiles of the tensor-core kernels and the reads that turn them
// into mma.sync fragments (kernels/cuda/tensor_core.cuh): the layouts and the
// swizzle of the tensor-core GEMM (kernels/cuda/matmul_tc.cu, whose opening comment
// explains them), read the same way by conv2d's implicit GEMM
// (kernels/cuda/conv2d_tc.cuh).
//
// A stage tile holds one operand's block for 64 bytes of the reduction a line, in
// 16-byte chunks: 32 16-bit values in chunks of 8, or 16 float32 values (already
// rounded to tf32) in chunks of 4 (TcValues). Offsets are counted in 16-bit units
// (kStepK = 32 a line, kChunk = 8 a chunk) for both: the bytes, the swizzle and the
// ldmatrix reads are the same, and ldmatrix gives lane l the 4 bytes at row l / 4,
// bytes 4 (l % 4) .. 4 (l % 4) + 3 of each 8x16-byte matrix, which for float32 is
// element (l / 4, l % 4) of an 8x4 block: the m16n8k8 tf32 fragment's (g, t). So a
// k-major tile's load_a and load_b below give m16n8k16 fragments of 16-bit values
// and m16n8k8 fragments of tf32 ones alike (mn-major reads are 16-bit only: .trans
// would split a float32):
//   k-major:  one line per row of C's M (A) or N (B), 4 chunks of k a line;
//   mn-major: one line per k, kLine / 8 chunks of M or N a line.
// Each chunk's place in its line is XORed with bits of the line number, so that the
// 8 rows of every 8x8 matrix ldmatrix reads fall in 8 different 16-byte slots of a
// 128-byte line (no bank conflicts) without padding.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/tensor_core.cuh"

namespace towerlab::cuda::tc {

constexpr int kStepK = 32;  // 16-bit units per line of a stage tile
constexpr int kChunk = 8;   // 16-bit units per 16-byte chunk

// An operand type's values in a stage tile, and the reduction a stage covers.
template <TcInput kInput>
struct TcValues {
  static constexpr bool kTf32 = kInput == TcInput::Tf32;
  // As the operand lies in global memory: 16-bit bits, or a float32.
  using Stored = std::conditional_t<kTf32, float, std::uint16_t>;
  static constexpr int kChunk = 16 / sizeof(Stored);  // values per 16-byte chunk
  static constexpr int kStepK = 64 / sizeof(Stored);  // values of k per line (a stage)
  static constexpr int kMmaK = kTf32 ? 8 : 16;        // values of k per mma
  static_assert(kStepK / kMmaK == tc::kStepK / 16, "two mma steps a stage for every type");
};

// Offset, in values, of chunk `chunk` of line `line` in a stage tile whose mn-major
// lines are kLine values long (k-major lines are always kStepK).
template <bool kKMajor, int kLine>
__device__ __forceinline__ int swizzled(int line, int chunk) {
  if constexpr (kKMajor) {
    return line * kStepK + (chunk ^ ((line >> 1) & 3)) * kChunk;
  } else {
    static_assert(kLine / kChunk >= 8, "an mn-major line holds at least 8 chunks");
    return line * kLine + (chunk ^ (line & 7)) * kChunk;
  }
}

// The A fragments of a warp's kFragsM m16 tiles (rows warp_row + 16 i) for the
// mma step kk of a stage (k16, or k8 for tf32: chunks 2 kk and 2 kk + 1 either way).
// Lane 8j + r gives row r of 8x8 matrix j, and matrix j must land in a[j]: (m 0-7,
// k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15); for tf32 the same
// with 4 k a matrix.
template <bool kKMajor, int kLine, int kFragsM>
__device__ __forceinline__ void load_a(std::uint32_t (&fa)[kFragsM][4], const std::uint16_t* tile,
                                       int warp_row, int kk, int lane) {
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
    const int m = warp_row + i * 16;
    if constexpr (kKMajor) {  // tile [m][k]: matrix j's rows are m + 8 (j % 2) + r
      ldmatrix_x4(fa[i], tile + swizzled<true, kLine>(m + lane % 16, 2 * kk + lane / 16));
    } else {  // tile [k][m], transposed: matrix j's rows are k = 16 kk + 8 (j / 2) + r
      ldmatrix_x4_trans(fa[i], tile + swizzled<false, kLine>(16 * kk + lane % 8 + 8 * (lane / 16),
                                                             m / 8 + (lane / 8) % 2));
    }
  }
}

// The B fragments of a warp's kFragsN n8 tiles (columns warp_col + 8 j), two per
// ldmatrix.x4: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
// (k 8-15, n 8-15) are b[0], b[1] of the first n8 tile and b[0], b[1] of the second.
template <bool kKMajor, int kLine, int kFragsN>
__device__ __forceinline__ void load_b(std::uint32_t (&fb)[kFragsN][2], const std::uint16_t* tile,
                                       int warp_col, int kk, int lane) {
  static_assert(kFragsN % 2 == 0, "B fragments come in pairs");
#pragma unroll
  for (int pair = 0; pair < kFragsN / 2; ++pair) {
    const int n = warp_col + pair * 16;
    std::uint32_t r[4];
    if constexpr (kKMajor) {  // tile [n][k]: matrix j's rows are n = 8 (j / 2) + r
      ldmatrix_x4(
          r, tile + swizzled<true, kLine>(n + lane % 8 + 8 * (lane / 16), 2 * kk + (lane / 8) % 2));
    } else {  // tile [k][n], transposed: matrix j's rows are k = 16 kk + 8 (j % 2) + r
      ldmatrix_x4_trans(r, tile + swizzled<false, kLine>(16 * kk + lane % 16, n / 8 + lane / 16));
    }
    fb[2 * pair][0] = r[0], fb[2 * pair][1] = r[1];
    fb[2 * pair + 1][0] = r[2], fb[2 * pair + 1][1] = r[3];
  }
}

// acc[i][j] += A fragment i x B fragment j for every pair: the warp's share of one
// mma step, by kInput's mma.
template <TcInput kInput, int kFragsM, int kFragsN>
__device__ __forceinline__ void mma_all(float (&acc)[kFragsM][kFragsN][4],
                                        const std::uint32_t (&fa)[kFragsM][4],
                                        const std::uint32_t (&fb)[kFragsN][2]) {
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) mma_m16n8<kInput>(acc[i][j], fa[i], fb[j], acc[i][j]);
  }
}

}  // namespace towerlab::cuda::tc
