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

#include "../engine/settings.h"
#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

void matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
            float alpha, float beta, const Stream& stream);

// The GEMM backend on CUDA (set_gemm_backend) and the CPU GEMM's micro-kernel
// (set_gemm_isa) are process-wide settings: engine/settings.h.

}  // namespace towerlab
