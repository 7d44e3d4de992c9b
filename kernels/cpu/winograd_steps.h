// What the forward and backward-data of CPU Winograd share across their three files
// (internal): kernels/cpu/winograd.cpp, the driver, the weight transform and the
// portable transforms; kernels/cpu/winograd_x86.cpp, the blocked path's input and
// output transforms on AVX2 and AVX-512; kernels/cpu/winograd_fused.cpp, the fused
// steps for few channels on AVX2. The steps themselves are told in winograd.cpp's
// header, the algebra in kernels/cpu/winograd.h.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/winograd_tiles.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu::winograd {

// The input transform of one block of tiles: V[e] [C, tiles] written where the
// GEMM reads its B (PackedA::b_panels), so that the 16 GEMMs pack nothing (the
// copy into panels was a tenth of FashionNet's conv2 forward).
struct BlockInput {
  float* v;             // [16][stride]
  GemmBPanels panels;   // k: C, n: the block's tiles
  std::int64_t stride;  // V[e] to V[e + 1]: spread_stride of the largest block's

  float* of(int e) const { return v + e * stride; }
  // V[e]'s element (c, t).
  float* at(int e, std::int64_t c, std::int64_t t) const { return of(e) + panels.at(c, t); }
};

// The scratch of one thread, for blocks of tiles up to `block` columns (a multiple
// of 16). M keeps each channel's 16 elements together, so that the output
// transform, which goes channel by channel, walks it from start to end; the GEMM of
// element e writes M[e] as a matrix whose rows lie ld() apart.
struct Workspace {
  float* v;     // a BlockInput's V, up to `block` tiles: [16][v_stride]
  float* m;     // [K][16][block]: the 16 products
  float* rows;  // [4][row_width]: the padded input rows one tile row reads
  std::int64_t block, v_stride;

  float* m_at(std::int64_t k, int e) const { return m + (k * 16 + e) * block; }
  std::int64_t ld() const { return 16 * block; }
};

#if TL_CPU_X86
// The blocked path's transforms on x86 (kernels/cpu/winograd_x86.cpp), chosen by
// winograd.cpp on the ISA whose GEMM reads V: V for the tile rows [row0, row1)
// (row = n * tiles_h + th), and the output of those rows from M.
// Each declared with its definition's target, which GCC takes as part of the
// function's identity.
__attribute__((target("avx2,fma"))) void transform_input_avx2(const BlockInput& v, const float* in,
                                                              const Problem& p, std::int64_t row0,
                                                              std::int64_t row1);
__attribute__((target("avx2,fma"))) void transform_input_pairs_avx2(
    const BlockInput& v, const float* in, const Problem& p, std::int64_t row0, std::int64_t row1);
__attribute__((target("avx512f"))) void transform_input_avx512(const BlockInput& v, const float* in,
                                                               const Problem& p, std::int64_t row0,
                                                               std::int64_t row1);
template <typename Out>
__attribute__((target("avx2,fma,f16c"))) void transform_output_avx2(
    const Workspace& ws, Out* out, const float* bias, bool accumulate, const Problem& p,
    std::int64_t row0, std::int64_t row1);
template <typename Out>
__attribute__((target("avx512f"))) void transform_output_avx512(const Workspace& ws, Out* out,
                                                                const float* bias, bool accumulate,
                                                                const Problem& p, std::int64_t row0,
                                                                std::int64_t row1);

// The fused steps 2 for few channels on AVX2 (kernels/cpu/winograd_fused.cpp): whether
// they take `p`, and all of `p`'s tile rows through them, u_matrices the 16 U[e] [K][C].
bool fused_applies(const Problem& p);
template <typename Out>
void run_fused_avx2(Out* out, const float* in, const float* u_matrices, const float* bias,
                    bool accumulate, const Problem& p);
#endif

// In an unnamed namespace: each file's copies keep internal linkage, so the compiler
// inlines them into their callers (an inline function of external linkage it may
// leave as one weak copy that every file calls).
namespace {

// The transforms ask for the input rows they will read, and the AVX-512 output
// transform for the output rows it will write, this many channel planes ahead:
// each plane is a new stretch of memory, a few short rows of which the hardware
// prefetcher does not see coming (the stores' misses held up the output transform
// as the loads' did the input's).
constexpr std::int64_t kPrefetchPlanes = 4;

// Asks for the input rows that tile row (n, th) reads of channel c + kPrefetchPlanes.
// Inlined always: as a call from the AVX-512 transform it measured slower
// (docs/kernels.md, "Measured choices").
[[gnu::always_inline]] inline void prefetch_rows(const float* in, const Problem& p, std::int64_t n,
                                                 std::int64_t th, std::int64_t c) {
  if (c + kPrefetchPlanes >= p.C) return;
  const std::int64_t h0 = std::max<std::int64_t>(0, 2 * th - p.pad_h);  // rows [h0, h1)
  const std::int64_t h1 = std::min<std::int64_t>(p.H, 2 * th - p.pad_h + 4);
  if (h0 >= h1) return;
  const float* plane = in + (n * p.C + c + kPrefetchPlanes) * p.H * p.W;  // [H,W]
  for (std::int64_t x = h0 * p.W; x < h1 * p.W; x += 16) __builtin_prefetch(plane + x);
  __builtin_prefetch(plane + h1 * p.W - 1);
}

// Output row i (0 or 1) of tiles from their 16 products m[e] (element (r, j) of
// Aᵀ m A's input at e = 4*r + j), one tile per lane: Aᵀ's row i across the rows of
// m, then A's two columns, (a, b, c, d) -> (a + b + c, b - c - d) both times. The
// same operations in the same order whatever the vector width: the same bits.
template <typename V>
[[gnu::always_inline]] inline void output_row(const V (&m)[16], int i, V& left, V& right) {
  V t[4];
  for (int j = 0; j < 4; ++j) {
    t[j] = i == 0 ? m[j] + m[4 + j] + m[8 + j] : m[4 + j] - m[8 + j] - m[12 + j];
  }
  left = t[0] + t[1] + t[2];
  right = t[1] - t[2] - t[3];
}

#if TL_CPU_X86
// A row of zeros, the input row that transform_input_avx2 reads outside the image
// (a group reads 18 columns, from up to 8 before its first: GroupInput::at).
alignas(32) constexpr float kZeroRow[32] = {};

// What one group of transform_input_avx2 reads, set up once for all its channels:
// channel c's input row i (its column x0, the group's first) at rows[i] + c * step[i],
// kZeroRow with step 0 for a row outside the image; load l takes columns
// x0 + kGroupOffset[l] .. + 7, masked by mask[l] to those inside the image.
constexpr std::int64_t kGroupOffset[4] = {0, 8, 2, 10};
struct GroupInput {
  const float* rows[4];
  std::int64_t step[4];
  __m256i mask[4];
  int whole;  // bit l: load l lies inside the image, a plain load
  // Where W >= 8, the other loads as eight columns inside the row, from rows[i] +
  // at[l], their lanes moved by `index` and those outside the image cleared by `mask`
  // (fused_input_avx2: faster so than with the masked load vmaskmovps).
  std::int64_t at[4];
  __m256i index[4];
  // The fused path's prefetch, channel by channel: up to two input rows of a later
  // tile row, channel c's ahead_width[j] floats at ahead[j] + c * ahead_step[j].
  const float* ahead[2];
  std::int64_t ahead_step[2], ahead_width[2];
};

// The GroupInput of the group of tiles tw .. tw + 7 of tile row (n, th).
__attribute__((target("avx2"))) inline GroupInput group_input(const float* in, const Problem& p,
                                                              std::int64_t n, std::int64_t th,
                                                              std::int64_t tw) {
  const std::int64_t x0 = 2 * tw - p.pad_w;  // negative in the padding
  GroupInput g;
  g.whole = 0;
  for (int l = 0; l < 4; ++l) {
    const std::int64_t x = x0 + kGroupOffset[l];
    g.mask[l] = _mm256_andnot_si256(first_lanes8(-x), first_lanes8(p.W - x));
    if (x >= 0 && x + 8 <= p.W) g.whole |= 1 << l;
    const std::int64_t base = std::clamp<std::int64_t>(x, 0, std::max<std::int64_t>(0, p.W - 8));
    g.at[l] = base - x0;
    g.index[l] = _mm256_min_epi32(
        _mm256_max_epi32(_mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(static_cast<int>(x - base))),
                         _mm256_setzero_si256()),
        _mm256_set1_epi32(7));
  }
  for (int i = 0; i < 4; ++i) {
    const std::int64_t h = 2 * th - p.pad_h + i;
    const bool inside = h >= 0 && h < p.H;
    // A row outside the image reads kZeroRow from 8 floats in (`at` may be negative).
    g.rows[i] = inside ? in + (n * p.C * p.H + h) * p.W + x0 : kZeroRow + 8;
    g.step[i] = inside ? p.H * p.W : 0;
  }
  for (int j = 0; j < 2; ++j) {  // nothing ahead
    g.ahead[j] = nullptr;
    g.ahead_step[j] = g.ahead_width[j] = 0;
  }
  return g;
}

// y[0 .. count) = base + v, base = y (accumulate) or b, for count <= 8: a row's
// pixels past the output are neither read nor written.
__attribute__((target("avx2,fma"))) inline void add_pixels(float* y, __m256 v, __m256 b,
                                                           bool accumulate, std::int64_t count) {
  if (count >= 8) {
    _mm256_storeu_ps(y, _mm256_add_ps(accumulate ? _mm256_loadu_ps(y) : b, v));
  } else if (count > 0) {
    const __m256 base = accumulate ? _mm256_maskload_ps(y, first_lanes8(count)) : b;
    store_first_lanes(y, _mm256_add_ps(base, v), count);
  }
}

// A forward's 16-bit y[0 .. count) = b + v rounded once, for count <= 8 (a 16-bit y
// is assigned, never accumulated).
template <typename T>
__attribute__((target("avx2,fma,f16c"))) inline void add_pixels(T* y, __m256 v, __m256 b, bool,
                                                                std::int64_t count) {
  if (count >= 8) {
    store8(y, _mm256_add_ps(b, v));
  } else if (count > 0) {
    store_first8(y, _mm256_add_ps(b, v), count);
  }
}
#endif

}  // namespace

}  // namespace towerlab::cpu::winograd
