// The plain reference of matmul (GEMM): the specification that the CPU's blocked
// micro-kernels, the CUDA kernels and the emulated cuBLAS are tested against, and
// the CPU's float64 path itself (the gradient checks' problems are small).
//
// Dimension letters, as in kernels/matmul.h: M rows of C, N columns of C, K the
// inner (summed) dimension. Matrices are row-major with leading dimensions
// lda, ldb, ldc (the distance between rows); op(X) is X or its transpose.
#pragma once

#include <cstdint>

#include "engine/half.h"

namespace towerlab::reference {

// C = alpha * op(A) * op(B) + beta * C, for T float or double.
//   op(A) [M,K]: a stored [M,K] (transpose_a false) or [K,M] (true)
//   op(B) [K,N]: b stored [K,N] (transpose_b false) or [N,K] (true)
//   c [M,N]
// beta == 0 assigns (C not read: a NaN there does not leak); beta == 1 accumulates.
// Each product is added in order p = 0, 1, ..., K-1, in T.
template <typename T>
void matmul(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
            T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
            std::int64_t ldc);

// The mixed-precision product: In is bfloat16 or float16 (engine/half.h), Out is
// float or In. Each a and b value is widened exactly to double, the products are
// summed in double in order p = 0 .. K-1, and
//   c = round_Out(alpha * sum + beta * c)     (beta == 0: c not read)
// is rounded once, to nearest even (a 16-bit Out from the double directly). The
// fast paths round more often (kernels/matmul.h states by how much).
// x rounded to TF32 (kernels/matmul.h's Float32Math::Tf32): to nearest with ties
// away from zero, to 11 significant bits (10 of float32's 23 mantissa bits kept).
// TF32 has float32's exponent range, so a subnormal keeps its 10 upper mantissa
// bits (steps of 2^-136), a value past the largest TF32, (2 - 2^-10) 2^127, rounds
// to an infinity, and infinities, zeros and NaN stay what they are. This is what
// cvt.rna.tf32.f32 gives, written as arithmetic rather than as bits.
float round_tf32(float x);

template <typename In, typename Out>
void matmul_mixed(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n,
                  std::int64_t k, float alpha, const In* a, std::int64_t lda, const In* b,
                  std::int64_t ldb, float beta, Out* c, std::int64_t ldc);

// The TF32 product: matmul_mixed's sums, in double in order p = 0 .. K-1, of the
// float32 a and b each rounded by round_tf32, and c = float(alpha * sum + beta * c)
// rounded once (beta == 0: c not read).
void matmul_tf32(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 float beta, float* c, std::int64_t ldc);

}  // namespace towerlab::reference
