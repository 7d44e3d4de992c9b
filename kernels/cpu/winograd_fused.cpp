// The fused steps 2 of CPU Winograd's forward and backward-data, for at most 16
// channels each side on AVX2 (fused_applies; the steps: kernels/cpu/winograd.cpp's
// header, what the files share: kernels/cpu/winograd_steps.h). The sixteen tiles of
// a tile row, two groups of eight, go through all three steps at once, their V and M
// in arrays on the stack (L1), the products in registers. The blocked path writes V
// into the GEMM's panels (a group of eight tiles often split over two of them),
// multiplies 16 x 16 matrices through the GEMM's driver and reads M back from the L2
// cache: with 16 channels in and out, where the products are few beside the
// transforms, that handling cost more than the products. The products are the GEMM's
// sums (kernels/cpu/gemm_kernels.cpp: one fused multiply-add per channel, in channel
// order, from zero; a single block of kGemmKc), the transforms the blocked path's
// arithmetic, so the bits are the blocked path's (tests/conv2d_winograd_cpu_test.cpp).
// A group's tiles sit in its lanes in the order 0 1 4 5 2 3 6 7, which the in-lane
// shuffles of the input transform leave and the output's unpacking turns back into
// pixel order, so neither moves floats across the vectors' 128-bit halves.
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/convert16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/winograd_steps.h"
#include "kernels/cpu/x86.h"

#if TL_CPU_X86

namespace towerlab::cpu::winograd {

namespace {
// The most input and output channels the fused steps take: V and M of two groups
// of eight tiles on the stack.
constexpr std::int64_t kFusedChannels = 16;
}  // namespace

bool fused_applies(const Problem& p) {
  return gemm_isa() == GemmIsa::Avx2 && p.C <= kFusedChannels && p.K <= kFusedChannels &&
         p.K % 2 == 0 && p.W >= 8;
}

namespace {

// V of one group into its half of fused_rows_avx2's V, at v[((e * C + c) * 2) * 8]:
// the eight tiles (in the order 0 1 4 5 2 3 6 7) of each element and channel, from
// the input that `g` describes, with transform_group_avx2's arithmetic, Whole its.
template <int Whole>
__attribute__((target("avx2,fma"))) void fused_input_avx2(float* v, const GroupInput& g,
                                                          std::int64_t channels) {
  for (std::int64_t c = 0; c < channels; ++c) {
    for (int j = 0; j < 2; ++j) {
      if (g.ahead_width[j] == 0) continue;
      const float* row = g.ahead[j] + c * g.ahead_step[j];
      for (std::int64_t x = 0; x < g.ahead_width[j]; x += 16) __builtin_prefetch(row + x);
      __builtin_prefetch(row + g.ahead_width[j] - 1);
    }
    __m256 d[4][4];
    for (int i = 0; i < 4; ++i) {
      const float* src = g.rows[i] + c * g.step[i];
      __m256 r[4];
      for (int l = 0; l < 4; ++l) {
        r[l] = (Whole >> l & 1) ? _mm256_loadu_ps(src + kGroupOffset[l])
                                : _mm256_and_ps(_mm256_permutevar8x32_ps(
                                                    _mm256_loadu_ps(src + g.at[l]), g.index[l]),
                                                _mm256_castsi256_ps(g.mask[l]));
      }
      d[i][0] = _mm256_shuffle_ps(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0));
      d[i][1] = _mm256_shuffle_ps(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1));
      d[i][2] = _mm256_shuffle_ps(r[2], r[3], _MM_SHUFFLE(2, 0, 2, 0));
      d[i][3] = _mm256_shuffle_ps(r[2], r[3], _MM_SHUFFLE(3, 1, 3, 1));
    }
    transform_input_tile(d);
    for (int e = 0; e < 16; ++e) _mm256_store_ps(v + (e * channels + c) * 16, d[e / 4][e % 4]);
  }
}

using FusedInput = void (*)(float*, const GroupInput&, std::int64_t);
template <std::size_t... I>
constexpr std::array<FusedInput, sizeof...(I)> fused_inputs(std::index_sequence<I...>) {
  return {&fused_input_avx2<static_cast<int>(I)>...};
}
constexpr std::array<FusedInput, 16> kFusedInputs = fused_inputs(std::make_index_sequence<16>());

// M = U[e] · V[e] for filters k0 .. k0 + Rows - 1 of element e, two groups of eight
// tiles: v_e [C][2][8] (V[e]), u_e [C][K] (U[e] transposed, fused_weights), m
// [K][16][2][8]. Each sum in a register, twelve at once at most (the GEMM's
// 6 x 16 micro-kernel, kernels/cpu/gemm_kernels.cpp, whose sums these are).
template <int Rows>
__attribute__((target("avx2,fma"))) inline void fused_products_avx2(float* m, const float* v_e,
                                                                    const float* u_e,
                                                                    const Problem& p, int e,
                                                                    std::int64_t k0) {
  __m256 sum[Rows][2];
  for (auto& row : sum) row[0] = row[1] = _mm256_setzero_ps();
  for (std::int64_t c = 0; c < p.C; ++c) {
    const __m256 x0 = _mm256_load_ps(v_e + c * 16), x1 = _mm256_load_ps(v_e + c * 16 + 8);
    const float* u = u_e + c * p.K + k0;
#pragma GCC unroll 6
    for (int r = 0; r < Rows; ++r) {
      const __m256 weight = _mm256_broadcast_ss(u + r);
      sum[r][0] = _mm256_fmadd_ps(weight, x0, sum[r][0]);
      sum[r][1] = _mm256_fmadd_ps(weight, x1, sum[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < Rows; ++r) {
    float* out = m + ((k0 + r) * 16 + e) * 16;
    _mm256_store_ps(out, sum[r][0]);
    _mm256_store_ps(out + 8, sum[r][1]);
  }
}

// U [16][K][C] as fused_products_avx2 reads it, [16][C][K].
void fused_weights(float* out, const float* u, const Problem& p) {
  for (int e = 0; e < 16; ++e) {
    for (std::int64_t k = 0; k < p.K; ++k) {
      for (std::int64_t c = 0; c < p.C; ++c) {
        out[(e * p.C + c) * p.K + k] = u[(e * p.K + k) * p.C + c];
      }
    }
  }
}

// The fused steps 2 for tile rows [first, last) (row = n * tiles_h + th), two groups
// of eight tiles of a row at a time. V starts as zeros, so that a missing second
// group's lanes, multiplied but never stored, hold finite values.
template <typename Out>
__attribute__((target("avx2,fma,f16c"))) void fused_rows_avx2(Out* out, const float* in,
                                                              const float* u, const float* bias,
                                                              bool accumulate, const Problem& p,
                                                              std::int64_t first,
                                                              std::int64_t last) {
  alignas(32) float v[16 * kFusedChannels * 16] = {};  // [16][C][2][8]
  alignas(32) float m[kFusedChannels * 16 * 16];       // [K][16][2][8]
  for (std::int64_t row = first; row < last; ++row) {
    const std::int64_t n = row / p.tiles_h, th = row % p.tiles_h;
    const std::int64_t rows = std::min<std::int64_t>(2, p.P - 2 * th);  // output rows
    for (std::int64_t tw0 = 0; tw0 < p.tiles_w; tw0 += 16) {
      const int groups = p.tiles_w - tw0 > 8 ? 2 : 1;
      for (int h = 0; h < groups; ++h) {
        GroupInput g = group_input(in, p, n, th, tw0 + 8 * h);
        if (tw0 + h == 0 && row + 1 < p.N * p.tiles_h) {
          // The rows the next tile row reads that this one does not, a row ahead.
          const std::int64_t next_n = (row + 1) / p.tiles_h, next_th = (row + 1) % p.tiles_h;
          for (int j = 0; j < 2; ++j) {
            const std::int64_t h_next = 2 * next_th - p.pad_h + 2 + j;
            if (h_next < 0 || h_next >= p.H) continue;
            g.ahead[j] = in + (next_n * p.C * p.H + h_next) * p.W;
            g.ahead_step[j] = p.H * p.W;
            g.ahead_width[j] = p.W;
          }
        }
        kFusedInputs[g.whole](v + 8 * h, g, p.C);
      }
      for (int e = 0; e < 16; ++e) {
        const float* v_e = v + e * p.C * 16;
        const float* u_e = u + e * p.C * p.K;
        std::int64_t k0 = 0;
        for (; k0 + 6 <= p.K; k0 += 6) fused_products_avx2<6>(m, v_e, u_e, p, e, k0);
        if (p.K - k0 == 4) fused_products_avx2<4>(m, v_e, u_e, p, e, k0);
        if (p.K - k0 == 2) fused_products_avx2<2>(m, v_e, u_e, p, e, k0);
      }
      for (int h = 0; h < groups; ++h) {
        const std::int64_t tw = tw0 + 8 * h;
        const std::int64_t pixels = p.Q - 2 * tw;  // of the row, from column 2*tw
        for (std::int64_t k = 0; k < p.K; ++k) {
          const __m256 b = _mm256_set1_ps(bias != nullptr ? bias[k] : 0.0f);
          __m256 m_k[16];
          for (int e = 0; e < 16; ++e) m_k[e] = _mm256_load_ps(m + (k * 16 + e) * 16 + 8 * h);
          Out* y = out + ((n * p.K + k) * p.P + 2 * th) * p.Q + 2 * tw;
          for (int i = 0; i < rows; ++i, y += p.Q) {
            __m256 left, right;
            output_row(m_k, i, left, right);
            // Lanes 0 1 4 5 are tiles 0 .. 3, lanes 2 3 6 7 tiles 4 .. 7: pixels in order.
            add_pixels(y, _mm256_unpacklo_ps(left, right), b, accumulate, pixels);
            add_pixels(y + 8, _mm256_unpackhi_ps(left, right), b, accumulate, pixels - 8);
          }
        }
      }
    }
  }
}

}  // namespace

template <typename Out>
void run_fused_avx2(Out* out, const float* in, const float* u_matrices, const float* bias,
                    bool accumulate, const Problem& p) {
  HostScratch<float> u(16 * p.K * p.C);
  fused_weights(u.get(), u_matrices, p);
  parallel_rows(p.N * p.tiles_h, p.tiles_w * 16 * (p.C + p.K),
                [&](std::int64_t first, std::int64_t last) {
                  fused_rows_avx2(out, in, u.get(), bias, accumulate, p, first, last);
                });
}

template void run_fused_avx2<float>(float*, const float*, const float*, const float*, bool,
                                    const Problem&);
template void run_fused_avx2<bfloat16>(bfloat16*, const float*, const float*, const float*, bool,
                                       const Problem&);
template void run_fused_avx2<float16>(float16*, const float*, const float*, const float*, bool,
                                      const Problem&);

}  // namespace towerlab::cpu::winograd

#endif  // TL_CPU_X86
