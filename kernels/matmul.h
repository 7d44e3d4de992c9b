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
// gradient checks); CUDA runs float32 with towerlab's own SGEMM, or with cuBLAS
// (TF32 off) when set_gemm_backend(GemmBackend::Cublas) asks, for comparison.
//
// Mixed precision. The accepted dtypes:
//   a and b               c
//   float32               float32        (every device)
//   float64               float64        (CPU)
//   bfloat16              float32 or bfloat16 (every device)
//   float16               float32 or float16 (every device)
// Any other combination (a and b of different dtypes, a float64 c with bfloat16
// inputs, ...) throws NotSupported naming the three dtypes. On CUDA, 16-bit a and
// b run on the tensor cores (kernels/cuda/matmul_tc.h, towerlab's own kernel
// whatever set_gemm_backend says): mma.sync adds the exact products in float32,
// alpha and beta are applied in float32 with the same beta == 0 rule, and a 16-bit
// c is rounded once (to nearest even) from that float32 value; where K is split,
// the splits' float32 sums are added in a fixed tree before alpha and beta. On the
// emulated GPUs the mma adds the products one at a time in k order
// (docs/emulator.md), within E below; a real GPU's mma adds each k16 block in an
// order and internal precision PTX does not state, so there the bound is to be
// confirmed by these tests on the hardware (docs/gpu.md lists what ran where).
// On the CPU the 16-bit values are widened
// exactly, their products (exact in float32) are summed in float32, alpha and beta
// are applied in float32 with the same beta == 0 rule, and a 16-bit c is rounded
// once from that float32 value (to nearest even, engine/half.h). The values are
// widened while packing for the float32 kernel (as fast as float32 inputs, no
// faster), or for bfloat16, on request where the CPU has AVX-512 BF16, multiplied
// by vdpbf16ps (engine/settings.h: set_bf16_gemm_kernel; docs/kernels.md).
//
// Tolerance of the 16-bit products against kernels/reference/matmul.h's
// matmul_mixed (which sums in double and rounds once), for each output of C:
//   |c - c_ref| <= E = 2 (K + 2) 2^-24 (|alpha| S + |beta c0|),
//   S = sum_p |op(A)[i,p] op(B)[p,j]|, c0 the value c held before,
// and for a 16-bit c, E + u (|c_ref| + E) with u = 2^-8 (bfloat16) or 2^-11
// (float16), the half ulp of its rounding (float16 adds 2^-25 where the result is
// subnormal). Why: a product enters the float32 sum exactly and passes through at
// most d = K + ceil(K / 256) + 2 <= 2K + 2 roundings on its way to C (the k-loop's
// additions, each K block's sum added onto C, alpha, beta c0), and the summation
// bound d 2^-24 / (1 - d 2^-24) is below 2 (K + 2) 2^-24 for K < 2^20. The paths
// add in different orders (the float32 kernels k by k, CUDA's too, vdpbf16ps k = 2s + 1 before
// k = 2s), so they agree within E, not bit for bit. vdpbf16ps reads bfloat16
// subnormals as zero and flushes float32 subnormal sums to zero whatever MXCSR
// says: the bound assumes no product or partial sum below 2^-126 in magnitude.
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
