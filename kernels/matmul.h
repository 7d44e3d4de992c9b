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
// TF32. A float32 product takes a Float32Math, per call (cuDNN's math type, cuBLAS's
// math mode; PyTorch's torch.backends.cuda.matmul.allow_tf32 is the same choice as
// a process-wide flag, which towerlab avoids so that two trainers in one process
// may differ):
//   Ieee (the default)  float32 products and sums: the bits matmul always gave.
//   Tf32                allows TF32 tensor cores. On CUDA each value of A and B is
//       rounded to TF32 as the kernel reads it (to nearest, ties away from zero,
//       to 10 mantissa bits: cvt.rna.tf32.f32, a relative change of at most
//       2^-11), the products (exact in float32) are summed in float32 by mma.sync
//       m16n8k8, and alpha and beta are applied in float32 with the beta == 0
//       rule; towerlab's kernel whatever set_gemm_backend says
//       (kernels/cuda/matmul_tc.h). On the CPU, which has no TF32 arithmetic,
//       Ieee's bits. Operands of another dtype ignore it.
// A tape under the tf32 precision passes Tf32 to every float32 GEMM it records
// (Tape::float32_math, docs/precision.md), and to conv2d, which takes a
// Float32Math too (kernels/conv2d.h).
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
// matmul_mixed (which sums in double and rounds once), and of Tf32's on CUDA
// against its matmul_tf32 (the same, of float32 values rounded to TF32), for each
// output of C:
//   |c - c_ref| <= E = 2 (K + 2) 2^-24 (|alpha| S + |beta c0|),
//   S = sum_p |op(A)[i,p] op(B)[p,j]| (of the rounded values), c0 the value c held before,
// and for a 16-bit c, E + u (|c_ref| + E) with u = 2^-8 (bfloat16) or 2^-11
// (float16), the half ulp of its rounding (float16 adds 2^-25 where the result is
// subnormal). Why: a product enters the float32 sum exactly (its factors have 8
// or, for TF32, 11 significant bits, and float32 24) and passes through at most
// d = K + ceil(K / 256) + 2 <= 2K + 2 roundings on its way to C (the k-loop's
// additions, each K block's sum added onto C, alpha, beta c0), and the summation
// bound d 2^-24 / (1 - d 2^-24) is below 2 (K + 2) 2^-24 for K < 2^20. The paths
// add in different orders (the float32 kernels k by k, CUDA's too, vdpbf16ps k = 2s + 1 before
// k = 2s), so they agree within E, not bit for bit. vdpbf16ps reads bfloat16
// subnormals as zero and flushes float32 subnormal sums to zero whatever MXCSR
// says: the bound assumes no product or partial sum below 2^-126 in magnitude.
// Tf32 on CUDA, within E of matmul_tf32 (on the emulated GPUs, whose mma adds k by
// k; on a real one to be confirmed as for the 16-bit products), is within
// E + 2^-10 (1 + 2^-12) |alpha| S of the product of the unrounded float32 values:
// rounding both factors moves a product by at most (1 + 2^-11)^2 - 1 of itself.
#pragma once

#include <cstdint>

#include "../engine/settings.h"
#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

// How a float32 product may multiply (above).
enum class Float32Math { Ieee, Tf32 };

void matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
            float alpha, float beta, const Stream& stream, Float32Math math = Float32Math::Ieee);

// The GEMM backend on CUDA (set_gemm_backend) and the CPU GEMM's micro-kernel
// (set_gemm_isa) are process-wide settings: engine/settings.h.

}  // namespace towerlab
