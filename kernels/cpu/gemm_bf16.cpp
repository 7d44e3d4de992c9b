// The AVX-512 BF16 micro-kernel and its packers (kernels/cpu/gemm_bf16.h): the
// layout of the pairs is described there, the blocked driver that calls these is
// kernels/cpu/gemm_blocked.h's (run by kernels/cpu/matmul.cpp's gemm_mixed), and
// kernels/reference/matmul.h's matmul_mixed is what the results are tested against.
#include "kernels/cpu/gemm_bf16.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

// Word s of a row whose bfloat16 values run along k from `row`: k = 2s in the low
// half, k = 2s + 1 (zero past kc) in the high half.
inline std::uint32_t pair_word(const bfloat16* row, std::int64_t s, std::int64_t kc) {
  const std::uint32_t low = row[2 * s].bits;
  const std::uint32_t high = 2 * s + 1 < kc ? row[2 * s + 1].bits : 0u;
  return low | high << 16;
}

// The scalar packers, for the steps and rows the vector code leaves, the same
// words as it writes.
void pack_along_k_scalar(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                         int width, std::int64_t valid, std::int64_t s0) {
  const std::int64_t steps = (kc + 1) / 2;
  for (std::int64_t s = s0; s < steps; ++s) {
    for (int i = 0; i < width; ++i)
      dst[s * width + i] = i < valid ? pair_word(src + i * ld, s, kc) : 0u;
  }
}

void pack_across_k_scalar(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                          int width, std::int64_t valid, std::int64_t s0) {
  const std::int64_t steps = (kc + 1) / 2;
  for (std::int64_t s = s0; s < steps; ++s) {
    const bfloat16* even = src + 2 * s * ld;
    const bfloat16* odd = 2 * s + 1 < kc ? even + ld : nullptr;
    for (int j = 0; j < width; ++j) {
      const std::uint32_t low = j < valid ? even[j].bits : 0u;
      const std::uint32_t high = j < valid && odd != nullptr ? odd[j].bits : 0u;
      dst[s * width + j] = low | high << 16;
    }
  }
}

#if TL_CPU_X86

// The first `count` (1 to 8) words of v to out.
__attribute__((target("avx2"))) inline void store_words(std::uint32_t* out, __m256i v,
                                                        std::int64_t count) {
  float* at = reinterpret_cast<float*>(out);
  if (count == 8) {
    _mm256_storeu_ps(at, _mm256_castsi256_ps(v));
  } else {
    store_first_lanes(at, _mm256_castsi256_ps(v), count);
  }
}

// Rows along k: a pair is one word already, so this is the float32 packer's
// transpose on 32-bit words (bits moved, never converted): eight words (sixteen k)
// of eight rows at a time, through transpose8x8.
template <int Width>
__attribute__((target("avx2,fma"))) void pack_along_k(const bfloat16* src, std::int64_t ld,
                                                      std::int64_t kc, std::uint32_t* dst,
                                                      std::int64_t valid) {
  // Whole words only: a last odd k is a half word, left to the scalar tail.
  const std::int64_t whole = kc / 2 / 8 * 8;
  for (int g = 0; g < Width; g += 8) {
    const int rows = std::min(8, Width - g);
    const std::int64_t loaded = std::clamp<std::int64_t>(valid - g, 0, rows);
    for (std::int64_t s = 0; s < whole; s += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = i < loaded ? _mm256_castsi256_ps(_mm256_loadu_si256(
                                reinterpret_cast<const __m256i*>(src + (g + i) * ld + 2 * s)))
                          : _mm256_setzero_ps();
      }
      transpose8x8(r);
      for (int q = 0; q < 8; ++q) {
        store_words(dst + (s + q) * Width + g, _mm256_castps_si256(r[q]), rows);
      }
    }
  }
  pack_along_k_scalar(src, ld, kc, dst, Width, valid, whole);
}

// Rows across k: rows 2s and 2s+1 (Width <= 32 values each) interleaved value by
// value into Width words, one vpermt2w per 16 words.
template <int Width>
__attribute__((target("avx512f,avx512bw"))) void pack_across_k(const bfloat16* src, std::int64_t ld,
                                                               std::int64_t kc, std::uint32_t* dst,
                                                               std::int64_t valid) {
  static_assert(Width <= 32);
  // Lane 2t of `low` takes the even row's value t, lane 2t + 1 the odd row's
  // (index 32 + t selects from the second operand); `high` does t + 16.
  alignas(64) std::int16_t order[2][32];
  for (int t = 0; t < 16; ++t) {
    for (int h = 0; h < 2; ++h) {
      order[h][2 * t] = static_cast<std::int16_t>(16 * h + t);
      order[h][2 * t + 1] = static_cast<std::int16_t>(32 + 16 * h + t);
    }
  }
  const __m512i low_order = _mm512_load_si512(order[0]), high_order = _mm512_load_si512(order[1]);
  const std::int64_t columns = std::clamp<std::int64_t>(valid, 0, Width);
  const __mmask32 load_mask = columns == 32 ? ~__mmask32(0) : (__mmask32(1) << columns) - 1;
  // Words 0-15 come from `low`, 16-31 from `high`: 2 Width bfloat16 lanes in all.
  constexpr int kLowLanes = std::min(2 * Width, 32), kHighLanes = 2 * Width - kLowLanes;
  constexpr __mmask32 kLowStore = kLowLanes == 32 ? ~__mmask32(0) : (__mmask32(1) << kLowLanes) - 1;
  constexpr __mmask32 kHighStore =
      kHighLanes == 32 ? ~__mmask32(0) : (__mmask32(1) << kHighLanes) - 1;
  const std::int64_t pairs = kc / 2;  // steps with both rows; an odd kc's last is the tail
  for (std::int64_t s = 0; s < pairs; ++s) {
    const bfloat16* even = src + 2 * s * ld;
    const __m512i e = _mm512_maskz_loadu_epi16(load_mask, even);
    const __m512i o = _mm512_maskz_loadu_epi16(load_mask, even + ld);
    _mm512_mask_storeu_epi16(dst + s * Width, kLowStore,
                             _mm512_permutex2var_epi16(e, low_order, o));
    if constexpr (kHighLanes > 0) {
      _mm512_mask_storeu_epi16(dst + s * Width + 16, kHighStore,
                               _mm512_permutex2var_epi16(e, high_order, o));
    }
  }
  pack_across_k_scalar(src, ld, kc, dst, Width, valid, pairs);
}

// The first Rows rows and 16 * Vecs columns of the 12 x 32 tile, from panels packed
// for the full tile. Per pair of k: two loads of B (32 columns, each lane a pair),
// and for each row one broadcast of A's pair word and Vecs vdpbf16ps, each doing
// 32 multiply-adds where the float32 kernel's FMA does 16. As in that kernel, 24
// independent accumulators keep the instruction's latency off the critical path;
// what bounds the kernel is how often the CPU issues vdpbf16ps (docs/kernels.md).
template <int Rows, int Vecs>
__attribute__((target("avx512f,avx512bf16"))) void micro_kernel_bf16(std::int64_t kc,
                                                                     const std::uint32_t* a,
                                                                     const std::uint32_t* b,
                                                                     float* c, std::int64_t ldc,
                                                                     float alpha, float beta) {
  __m512 acc[Rows][Vecs];
#pragma GCC unroll 12
  for (int i = 0; i < Rows; ++i) {
    for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  const std::int64_t steps = (kc + 1) / 2;
#pragma GCC unroll 2
  for (std::int64_t s = 0; s < steps; ++s) {
    __m512bh bv[Vecs];
    for (int v = 0; v < Vecs; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + 16 * v);
#pragma GCC unroll 12
    for (int i = 0; i < Rows; ++i) {
      const __m512bh a_i = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i]));
      for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a_i, bv[v]);
    }
    a += kBf16Mr;
    b += kBf16Nr;
  }
  store_tile_avx512(acc, c, ldc, alpha, beta);
}

#endif  // TL_CPU_X86

}  // namespace

bool cpu_has_avx512_bf16() {
#if TL_CPU_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

Bf16MicroKernel bf16_kernel_for(std::int64_t rows, std::int64_t cols) {
#if TL_CPU_X86
  if (cols <= 16) {
    if (rows <= 4) return micro_kernel_bf16<4, 1>;
    return rows <= 8 ? micro_kernel_bf16<8, 1> : micro_kernel_bf16<12, 1>;
  }
  if (rows <= 4) return micro_kernel_bf16<4, 2>;
  return rows <= 8 ? micro_kernel_bf16<8, 2> : micro_kernel_bf16<12, 2>;
#else
  (void)rows;
  (void)cols;
  return nullptr;  // cpu_has_avx512_bf16() is false: never asked
#endif
}

#if TL_CPU_X86
void pack_bf16_a_along_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                         std::int64_t valid) {
  pack_along_k<kBf16Mr>(src, ld, kc, dst, valid);
}
void pack_bf16_b_along_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                         std::int64_t valid) {
  pack_along_k<kBf16Nr>(src, ld, kc, dst, valid);
}
void pack_bf16_a_across_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                          std::int64_t valid) {
  pack_across_k<kBf16Mr>(src, ld, kc, dst, valid);
}
void pack_bf16_b_across_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                          std::int64_t valid) {
  pack_across_k<kBf16Nr>(src, ld, kc, dst, valid);
}
#else
void pack_bf16_a_along_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                         std::int64_t valid) {
  pack_along_k_scalar(src, ld, kc, dst, kBf16Mr, valid, 0);
}
void pack_bf16_b_along_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                         std::int64_t valid) {
  pack_along_k_scalar(src, ld, kc, dst, kBf16Nr, valid, 0);
}
void pack_bf16_a_across_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                          std::int64_t valid) {
  pack_across_k_scalar(src, ld, kc, dst, kBf16Mr, valid, 0);
}
void pack_bf16_b_across_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                          std::int64_t valid) {
  pack_across_k_scalar(src, ld, kc, dst, kBf16Nr, valid, 0);
}
#endif

}  // namespace towerlab::cpu
