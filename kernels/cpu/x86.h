// The x86 vector code of the CPU kernels: one switch for whether it is compiled,
// one rule for which of it runs, and the helpers more than one kernel uses.
//
// Which code runs is decided at run time from CPUID (kernels/cpu/gemm_isa.cpp), never
// from the build machine, and follows the GEMM's choice (gemm_isa()): the direct
// convolution, the pooling and Winograd run AVX-512 code exactly where the GEMM
// runs its AVX-512 kernel, so TOWERLAB_GEMM_ISA=avx2 (or set_gemm_isa) pins them
// all. Each function compiled for an ISA carries its own
// __attribute__((target(...))); the translation units stay baseline x86-64.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/settings.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TL_CPU_X86 1
#else
#define TL_CPU_X86 0
#endif

namespace towerlab::cpu {

// Whether the AVX-512 code runs (the GEMM runs its AVX-512 kernel).
inline bool avx512_selected() {
  return TL_CPU_X86 && gemm_isa() == GemmIsa::Avx512;
}

// Whether code needing AVX2 runs (the GEMM runs its AVX2 or AVX-512 kernel).
inline bool avx2_selected() {
  const GemmIsa isa = gemm_isa();
  return TL_CPU_X86 && (isa == GemmIsa::Avx2 || isa == GemmIsa::Avx512);
}

#if TL_CPU_X86
// On a vector function that must round a product and a sum apart, as the scalar
// code it gives the bits of does: GCC contracts them into a fused multiply-add by
// default in C++ (-ffp-contract=fast, ISO mode or not), and AVX-512 has one for any
// target. Clang fuses only within one expression, which intrinsics never are.
#if defined(__clang__)
#define TL_NO_CONTRACTION
#else
#define TL_NO_CONTRACTION __attribute__((optimize("fp-contract=off")))
#endif

// Lanes 0 .. count - 1 of sixteen: none for count <= 0, all for count >= 16 (the
// mask of a row's last, partial group).
__attribute__((target("avx512f"))) inline __mmask16 first_lanes(std::int64_t count) {
  if (count <= 0) return 0;
  return count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
}

// The AVX2 counterpart: lanes 0 .. count - 1 of eight as a mask vector (all bits set
// in a chosen lane), for _mm256_maskload_ps and _mm256_maskstore_ps.
__attribute__((target("avx2"))) inline __m256i first_lanes8(std::int64_t count) {
  const int n = static_cast<int>(std::clamp<std::int64_t>(count, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The first `count` (0 to 7) lanes of v to out, by a 4-, a 2- and a 1-lane store as
// count needs: nothing is written past them. AMD's masked store (vmaskmovps) is slow:
// it took a third of Winograd's output transform where this takes a few percent.
__attribute__((target("avx2"))) inline void store_first_lanes(float* out, __m256 v,
                                                              std::int64_t count) {
  __m128 part = _mm256_castps256_ps128(v);
  if (count & 4) {
    _mm_storeu_ps(out, part);
    part = _mm256_extractf128_ps(v, 1);
    out += 4;
  }
  if (count & 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(out), part);
    part = _mm_movehl_ps(part, part);
    out += 2;
  }
  if (count & 1) _mm_store_ss(out, part);
}

// Lanes 0, 2, .., 14 (even_lanes) or 1, 3, .., 15 (odd_lanes) of a and b end to end:
// the even and odd columns of a row of sixteen floats.
__attribute__((target("avx2"))) inline __m256 even_lanes(__m256 a, __m256 b) {
  const __m256 t = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));  // a0 a2 b0 b2 | a4 a6 b4 b6
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), _MM_SHUFFLE(3, 1, 2, 0)));
}
__attribute__((target("avx2"))) inline __m256 odd_lanes(__m256 a, __m256 b) {
  const __m256 t = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));  // a1 a3 b1 b3 | a5 a7 b5 b7
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), _MM_SHUFFLE(3, 1, 2, 0)));
}

// 8x8 transpose in registers: rows r[0..7] in, columns out.
__attribute__((target("avx2,fma"))) inline void transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
// The epilogue of the AVX-512 GEMM micro-kernels (float32 FMA and vdpbf16ps): the
// Rows x 16 Vecs tile C = alpha acc + beta C, with C unread when beta is 0 (so a NaN
// there does not survive), one rounding per output as a float32 FMA gives it.
template <int Rows, int Vecs>
__attribute__((target("avx512f"))) inline void store_tile_avx512(const __m512 (&acc)[Rows][Vecs],
                                                                 float* c, std::int64_t ldc,
                                                                 float alpha, float beta) {
  const __m512 va = _mm512_set1_ps(alpha);
  if (beta == 0.0f) {
#pragma GCC unroll 12
    for (int i = 0; i < Rows; ++i) {
      for (int v = 0; v < Vecs; ++v) {
        _mm512_storeu_ps(c + i * ldc + 16 * v, _mm512_mul_ps(va, acc[i][v]));
      }
    }
    return;
  }
  const __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int i = 0; i < Rows; ++i) {
    for (int v = 0; v < Vecs; ++v) {
      float* out = c + i * ldc + 16 * v;
      _mm512_storeu_ps(out,
                       _mm512_fmadd_ps(va, acc[i][v], _mm512_mul_ps(vb, _mm512_loadu_ps(out))));
    }
  }
}
#endif

// Calls fn(first) for the groups of `width` consecutive outputs that cover a row of
// n >= width outputs, in order: the last group ends at n and may overlap the one
// before it (those outputs are computed twice, with the same values), so that no
// output falls to a scalar tail.
template <typename Fn>
void for_each_group(std::int64_t n, std::int64_t width, const Fn& fn) {
  std::int64_t first = 0;
  for (std::int64_t next = 0; next < n; next = first + width) {
    first = std::min(next, n - width);
    fn(first);
  }
}

}  // namespace towerlab::cpu
