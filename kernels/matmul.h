// Matrix multiplication (GEMM), the workhorse of linear layers and of conv2d
// through im2col.
//
// Dimension letters: M rows of C, N columns of C, K the inner (summed) dimension.
// All matrices are row-major. op(X) is X or its transpose:
//   op(A): [M,K]; A is stored [M,K] (transpose_a false) or [K,M] (transpose_a true)
//   op(B): [K,N]; B is stored [K,N] (transpose_b false) or [N,K] (transpose_b true)
//   C:     [M,N]
//
//   matmul(c, a, b, transpose_a, transpose_b, alpha, beta)
//     C = alpha * op(A) * op(B) + beta * C
// beta == 0 assigns: C is not read, so NaN or garbage in C does not leak into the
// result. beta == 1 accumulates, which is how backward passes add into gradients.
// K == 0 gives C = beta * C. C must not overlap A or B.
//
// The three products of training a linear layer y = x w (x [M,K], w [K,N]):
//   forward   y      = x w           matmul(y, x, w, false, false, 1, 0)
//   backward  grad_x += grad_y w^T   matmul(grad_x, grad_y, w, false, true, 1, 1)
//             grad_w += x^T grad_y   matmul(grad_w, x, grad_y, true, false, 1, 1)
//
// The CPU backend runs float32 and float64 (the latter with plain loops, for the
// gradient checks); CUDA runs float32 with towerlab's own kernel, or with cuBLAS
// (TF32 off) when set_gemm_backend(GemmBackend::Cublas) asks, for comparison.
#pragma once

#include <cstdint>

#include "engine/stream.h"
#include "engine/tensor.h"

namespace towerlab {

void matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
            float alpha, float beta, const Stream& stream);

// Which code runs float32 GEMM on CUDA devices: towerlab's kernel (the default)
// or cuBLAS. Process-wide; may be changed at any time from any thread (a call
// already in flight finishes with the backend it started with).
enum class GemmBackend { Towerlab, Cublas };
void set_gemm_backend(GemmBackend backend);
GemmBackend gemm_backend();

// The CPU's float32 GEMM picks its vector micro-kernel from the host CPU (AVX-512,
// AVX2+FMA, or portable vector code). Tests and benches may force one: only
// supported ISAs can be chosen, and Auto restores the automatic choice. The
// environment variable TOWERLAB_GEMM_ISA=portable|avx2|avx512 sets the initial one.
// Process-wide, like the GEMM backend.
enum class GemmIsa { Auto, Portable, Avx2, Avx512 };
bool gemm_isa_supported(GemmIsa isa);
void set_gemm_isa(GemmIsa isa);  // throws NotSupported for an ISA this CPU lacks
GemmIsa gemm_isa();              // the one in use (never Auto)

}  // namespace towerlab
