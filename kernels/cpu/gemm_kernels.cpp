// The CPU GEMM's float32 micro-kernels and their panel packers, one set per ISA
// (portable vector extensions, AVX2 + FMA, AVX-512), handed to the blocked driver
// (kernels/cpu/gemm_blocked.h, which states what a micro-kernel computes and which
// tile each ISA's is) as Kernels tables. The vdpbf16ps kernel and its packers are
// kernels/cpu/gemm_bf16.cpp's; which set runs, kernels/cpu/gemm_isa.cpp's.
//
// Each function compiled for an ISA carries its own __attribute__((target(...)))
// (kernels/cpu/x86.h); the driver reaches them only through the tables' function
// pointers, so they run the same code whichever file's entry point calls them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/half.h"
#include "kernels/cpu/gemm_blocked.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace gemm_detail {

namespace {

// Portable: GCC/Clang vector extensions (SSE on x86-64, NEON on ARM).
typedef float Vec4 __attribute__((vector_size(16)));

void micro_kernel_portable(std::int64_t kc, const float* a, const float* b, float* c,
                           std::int64_t ldc, float alpha, float beta) {
  Vec4 acc[kPortableMr][2] = {};
  for (std::int64_t p = 0; p < kc; ++p, a += kPortableMr, b += kPortableNr) {
    Vec4 b0, b1;
    std::memcpy(&b0, b, sizeof b0);
    std::memcpy(&b1, b + 4, sizeof b1);
#pragma GCC unroll 6
    for (int i = 0; i < kPortableMr; ++i) {
      acc[i][0] += a[i] * b0;
      acc[i][1] += a[i] * b1;
    }
  }
  for (int i = 0; i < kPortableMr; ++i) {
    for (int j = 0; j < kPortableNr; ++j) {
      const float v = alpha * acc[i][j / 4][j % 4];
      c[i * ldc + j] = beta == 0.0f ? v : v + beta * c[i * ldc + j];
    }
  }
}

#if TL_CPU_X86

// AVX2 + FMA: the kAvx2Mr x kAvx2Nr tile (gemm_blocked.h says why 6 x 16).

// The first Rows rows and 8 * Vecs columns of the 6 x 16 tile, from panels packed
// for the full tile (a [kc][6], b [kc][16]). The full tile is <6, 2>; an edge tile
// (Winograd's M = 32 = 5 x 6 + 2 in FashionNet's input gradient, M = 64 = 10 x 6 +
// 4 in its forward) takes the smallest that covers it instead of computing padding.
// Every variant runs each output's k-loop in the same order with the same FMAs: the
// same bits.
template <int Rows, int Vecs>
__attribute__((target("avx2,fma"))) void micro_kernel_avx2(std::int64_t kc, const float* a,
                                                           const float* b, float* c,
                                                           std::int64_t ldc, float alpha,
                                                           float beta) {
  __m256 acc[Rows][Vecs];
#pragma GCC unroll 6
  for (int i = 0; i < Rows; ++i) {
    for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm256_setzero_ps();
  }
  for (int i = 0; i < Rows; ++i)
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 4
  for (std::int64_t p = 0; p < kc; ++p) {
    __m256 bv[Vecs];
    for (int v = 0; v < Vecs; ++v) bv[v] = _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 6
    for (int i = 0; i < Rows; ++i) {
      const __m256 a_i = _mm256_broadcast_ss(a + i);
      for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm256_fmadd_ps(a_i, bv[v], acc[i][v]);
    }
    a += kAvx2Mr;
    b += kAvx2Nr;
  }
  const __m256 va = _mm256_set1_ps(alpha);
  if (beta == 0.0f) {
#pragma GCC unroll 6
    for (int i = 0; i < Rows; ++i) {
      for (int v = 0; v < Vecs; ++v) {
        _mm256_storeu_ps(c + i * ldc + 8 * v, _mm256_mul_ps(va, acc[i][v]));
      }
    }
  } else {
    const __m256 vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int i = 0; i < Rows; ++i) {
      for (int v = 0; v < Vecs; ++v) {
        float* out = c + i * ldc + 8 * v;
        _mm256_storeu_ps(out,
                         _mm256_fmadd_ps(va, acc[i][v], _mm256_mul_ps(vb, _mm256_loadu_ps(out))));
      }
    }
  }
}

// The AVX2 kernel for an edge tile of rows x cols.
MicroKernel<float> avx2_edge_kernel(std::int64_t rows, std::int64_t cols) {
  if (cols <= 8) {
    if (rows <= 2) return micro_kernel_avx2<2, 1>;
    return rows <= 4 ? micro_kernel_avx2<4, 1> : micro_kernel_avx2<6, 1>;
  }
  if (rows <= 2) return micro_kernel_avx2<2, 2>;
  return rows <= 4 ? micro_kernel_avx2<4, 2> : micro_kernel_avx2<6, 2>;
}

bool avx2_edge_fits(std::int64_t rows, std::int64_t cols) {
  return (rows == 2 || rows == 4 || rows == 6) && (cols == 8 || cols == 16);
}

// Eight consecutive source values as floats: a float's loaded, a bfloat16's
// widened exactly (its pattern shifted up 16 bits, engine/half.h's widening).
__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma"))) inline __m256 load8(const bfloat16* p) {
  const __m128i patterns = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(patterns), 16));
}

// The transposing packer of a panel `Width` wide (A's MR rows without transpose, or
// B's NR rows with transpose): dst [kc][Width] <- the first `valid` of Width source
// rows `ld` apart, each contiguous along k, and zeros for the rest (an edge panel's
// padding; those rows are not read). Eight k at a time, the rows in groups of eight
// transposed in registers (a last group of fewer rows padded with zero rows, its
// columns stored as `Width % 8` floats by plain 4-, 2- and 1-lane stores, x86.h's
// store_first_lanes, not the masked store vmaskmovps, which AMD runs slowly:
// bench/results/vit_attention_cpu_6446012.md). Only data moves (a bfloat16 Src widened
// exactly as it is loaded): the bits are the generic loop's. AVX2 is enough for
// the AVX-512 kernel's panels too (every AVX-512 CPU has it); the 8 x 8 transpose,
// not the vector width, is the cost.
template <int Width, typename Src = float>
__attribute__((target("avx2,fma"))) void pack_rows_avx2(const Src* src, std::int64_t ld,
                                                        std::int64_t kc, float* dst,
                                                        std::int64_t valid) {
  // Eight source rows at a time along the whole panel: eight streams for the
  // prefetcher and the TLB, where 32 rows at once (a fully connected layer's rows
  // lie 12 KiB apart) were 32 pages per block. The panel itself stays in L1.
  const std::int64_t whole = kc / 8 * 8;
  for (int g = 0; g < Width; g += 8) {
    const int rows = std::min(8, Width - g);
    const std::int64_t loaded = std::clamp<std::int64_t>(valid - g, 0, rows);
    for (std::int64_t p = 0; p < whole; p += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = i < loaded ? load8(src + (g + i) * ld + p) : _mm256_setzero_ps();
      }
      transpose8x8(r);
      for (int q = 0; q < 8; ++q) {
        // A panel narrower than eight (AVX2's A, six rows) stores whole vectors too,
        // but the group's last: the lanes past `rows` (zeros) land on the start of
        // the next k's row, which the next store writes. One store a k, not two.
        if (rows == 8 || (Width < 8 && q < 7)) {
          _mm256_storeu_ps(dst + (p + q) * Width + g, r[q]);
        } else {
          store_first_lanes(dst + (p + q) * Width + g, r[q], rows);
        }
      }
    }
  }
  for (std::int64_t p = whole; p < kc; ++p) {
    for (int i = 0; i < Width; ++i) {
      dst[p * Width + i] = i < valid ? static_cast<float>(src[i * ld + p]) : 0.0f;
    }
  }
}

// AVX-512 (Skylake-X, Ice Lake, Sapphire Rapids, Zen 4): 12x32 tile = 24 zmm
// AVX-512: the kAvx512Mr x kAvx512Nr tile (12 x 32).

// The first Rows rows and 16 * Vecs columns of the 12 x 32 tile, from panels
// packed for the full tile (a [kc][12], b [kc][32]). The full tile is <12, 2>; an
// edge tile (FashionNet's M = 64 = 5 x 12 + 4, N = 196 = 6 x 32 + 4) takes the
// smallest that covers it instead of computing padding. Every variant runs each
// output's k-loop in the same order with the same FMAs: the same bits.
template <int Rows, int Vecs>
__attribute__((target("avx512f"))) void micro_kernel_avx512(std::int64_t kc, const float* a,
                                                            const float* b, float* c,
                                                            std::int64_t ldc, float alpha,
                                                            float beta) {
  __m512 acc[Rows][Vecs];
#pragma GCC unroll 12
  for (int i = 0; i < Rows; ++i) {
    for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_setzero_ps();
  }
#pragma GCC unroll 2
  for (std::int64_t p = 0; p < kc; ++p) {
    __m512 bv[Vecs];
    for (int v = 0; v < Vecs; ++v) bv[v] = _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 12
    for (int i = 0; i < Rows; ++i) {
      const __m512 a_i = _mm512_set1_ps(a[i]);
      for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_fmadd_ps(a_i, bv[v], acc[i][v]);
    }
    a += kAvx512Mr;
    b += kAvx512Nr;
  }
  store_tile_avx512(acc, c, ldc, alpha, beta);
}

// The AVX-512 kernel for an edge tile of rows x cols.
MicroKernel<float> avx512_edge_kernel(std::int64_t rows, std::int64_t cols) {
  if (cols <= 16) {
    if (rows <= 4) return micro_kernel_avx512<4, 1>;
    return rows <= 8 ? micro_kernel_avx512<8, 1> : micro_kernel_avx512<12, 1>;
  }
  if (rows <= 4) return micro_kernel_avx512<4, 2>;
  return rows <= 8 ? micro_kernel_avx512<8, 2> : micro_kernel_avx512<12, 2>;
}

bool avx512_edge_fits(std::int64_t rows, std::int64_t cols) {
  return (rows == 4 || rows == 8 || rows == 12) && (cols == 16 || cols == 32);
}

// The vector packer of a panel `Width` wide from Src values: floats (moved without
// being looked at) and bfloat16 (widened as loaded); nullptr for float16, which the
// generic loops widen.
template <typename Src, int Width>
constexpr PanelPack<Src, float> rows_packer() {
  if constexpr (std::is_same_v<Src, float> || std::is_same_v<Src, bfloat16>) {
    return pack_rows_avx2<Width, Src>;
  } else {
    return nullptr;
  }
}

#endif  // TL_CPU_X86

}  // namespace

template <typename Src>
Kernels<Src, float> portable_kernels() {
  return Kernels<Src, float>{micro_kernel_portable, nullptr, nullptr};
}

#if TL_CPU_X86
template <typename Src>
Kernels<Src, float> avx2_kernels() {
  return Kernels<Src, float>{micro_kernel_avx2<kAvx2Mr, 2>,
                             rows_packer<Src, kAvx2Mr>(),
                             rows_packer<Src, kAvx2Nr>(),
                             avx2_edge_kernel,
                             nullptr,
                             nullptr,
                             avx2_edge_fits};
}

template <typename Src>
Kernels<Src, float> avx512_kernels() {
  return Kernels<Src, float>{micro_kernel_avx512<kAvx512Mr, 2>,
                             rows_packer<Src, kAvx512Mr>(),
                             rows_packer<Src, kAvx512Nr>(),
                             avx512_edge_kernel,
                             nullptr,
                             nullptr,
                             avx512_edge_fits};
}
#endif

// The sources the entry points take: float, and the 16-bit inputs of gemm_mixed.
#if TL_CPU_X86
#define TL_GEMM_KERNELS(Src)                            \
  template Kernels<Src, float> portable_kernels<Src>(); \
  template Kernels<Src, float> avx2_kernels<Src>();     \
  template Kernels<Src, float> avx512_kernels<Src>()
#else
#define TL_GEMM_KERNELS(Src) template Kernels<Src, float> portable_kernels<Src>()
#endif
TL_GEMM_KERNELS(float);
TL_GEMM_KERNELS(bfloat16);
TL_GEMM_KERNELS(float16);
#undef TL_GEMM_KERNELS

}  // namespace gemm_detail

#if TL_CPU_X86
void pack_32_rows_avx2(const float* src, std::int64_t ld, std::int64_t k, float* dst) {
  gemm_detail::pack_rows_avx2<32>(src, ld, k, dst, 32);
}
#endif

}  // namespace towerlab::cpu
