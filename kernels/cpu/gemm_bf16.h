// The AVX-512 BF16 pieces of the CPU's bfloat16 GEMM (internal): the micro-kernel
// on vdpbf16ps and the packers that lay its operands out, run when
// set_bf16_gemm_kernel(Bf16GemmKernel::Avx512Bf16) asks (engine/settings.h says
// why Auto does not). The blocked driver and the thread split are
// kernels/cpu/gemm_blocked.h's, the choice of path kernels/cpu/matmul.cpp's
// (gemm_mixed); the contract and the tolerance kernels/matmul.h's.
//
// vdpbf16ps multiplies pairs: lane j of the float32 accumulator gets
//   acc[j] += a.bf16[2j+1] * b.bf16[2j+1];  acc[j] += a.bf16[2j] * b.bf16[2j]
// (two float32 additions of exact products, rounded to nearest even, bfloat16 and
// float32 subnormals read and written as zero whatever MXCSR says). So both
// packed operands hold k in pairs: one 32-bit word is two bfloat16 values, k = 2s
// in its low half and k = 2s + 1 in its high half, and a panel is
//   A panel [ceil(kc/2)][kBf16Mr] words, B panel [ceil(kc/2)][kBf16Nr] words
// (a panel `Width` wide in general), the GEMM's float panels with every k row
// holding two k. An odd kc gets a zero in the high half of its last words (a zero
// product adds nothing); rows or columns past `valid` are zero words.
#pragma once

#include <cstdint>

#include "engine/half.h"

namespace towerlab::cpu {

// The tile: 12 rows of C by 32 columns (two zmm of float32), 24 accumulators of
// the 32 zmm registers, as the float32 AVX-512 kernel.
constexpr int kBf16Mr = 12, kBf16Nr = 32;

// Whether this CPU (and its OS) runs vdpbf16ps on zmm registers.
bool cpu_has_avx512_bf16();

// c[rows, cols] = alpha * a_panel * b_panel + beta * c (c not read when beta is 0),
// kc the panel's k count (not its words): the kernel for a tile of rows x cols, the
// full one for kBf16Mr x kBf16Nr, the smallest that covers a ragged edge otherwise.
// Each variant runs every output's k-loop in the same order: the same bits.
using Bf16MicroKernel = void (*)(std::int64_t kc, const std::uint32_t* a, const std::uint32_t* b,
                                 float* c, std::int64_t ldc, float alpha, float beta);
Bf16MicroKernel bf16_kernel_for(std::int64_t rows, std::int64_t cols);

// The packers, each writing one panel `Width` wide (kBf16Mr for A, kBf16Nr for B)
// for kc values of k, from the first `valid` of its Width rows or columns:
//   along_k: source rows `ld` apart, each contiguous along k (A [M,K] untransposed,
//            B stored [N,K]): each pair is already one word, moved by 8x8 transposes.
//   across_k: source rows of k, `ld` apart, each holding Width values of m or n
//            (A stored [K,M], B [K,N]): rows 2s and 2s+1 interleaved.
void pack_bf16_a_along_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                         std::int64_t valid);
void pack_bf16_b_along_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                         std::int64_t valid);
void pack_bf16_a_across_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                          std::int64_t valid);
void pack_bf16_b_across_k(const bfloat16* src, std::int64_t ld, std::int64_t kc, std::uint32_t* dst,
                          std::int64_t valid);

}  // namespace towerlab::cpu
