// The CUDA GEMMs on tensor cores (internal: not installed, not in towerlab.h).
// Public contract, dtypes and tolerances in kernels/matmul.h.
//
//   gemm_16bit(c, a, b, transpose_a, transpose_b, alpha, beta, stream)
//   gemm_tf32(c, a, b, transpose_a, transpose_b, alpha, beta, stream)
//     C = alpha * op(A) op(B) + beta * C
//   gemm_16bit: a, b both bfloat16 or both float16; c float32 or a's dtype.
//   gemm_tf32:  a, b and c float32; each value of A and B is rounded to TF32 (to
//               nearest, ties away from zero, 10 mantissa bits: cvt.rna.tf32.f32)
//               as the kernel loads it, the tensors themselves unchanged.
//   Both: 2-D, on the stream's CUDA device (as stored: A [M,K] or [K,M], B [K,N] or
//   [N,K]); c [M,N]. The caller (kernels/matmul.cpp) has checked shapes, dtypes,
//   devices and overlap, and returns before an empty C.
//
// One kernel serves both (kernels/cuda/matmul_tc.cu: mma.sync m16n8k16 for 16-bit
// operands, m16n8k8 for TF32, one pipeline), and every shape and layout runs on
// the tensor cores: no fallback to another path. The kernel copies 16-byte chunks
// (8 16-bit values, 4 float32) of A and B into shared memory, so it needs each
// operand's base address 16-byte aligned and its row length (lda, ldb) a multiple
// of a chunk; an operand that is not (K = 9 in A [M,K], N = 70 in B [K,N], a view
// at an odd offset) is first copied into scratch with rows padded to a multiple of
// a chunk (one pass over the operand's bytes; the zeros in the padding are the
// values the kernel multiplies past the edge of a ragged chunk). Chunks past the
// edges of the tiles (M, N not multiples of 128, K not of the K step: 32 values
// for 16-bit, 16 for float32) are zero-filled by the copies themselves, so the
// kernel reads no byte outside A and B (or the copy).
//
// Sums: each output's products (exact in float32: 8 x 8 or 11 x 11 significant
// bits) are added in float32 by the tensor cores' mma in k order, then alpha and
// beta are applied in float32 (beta == 0: C not read) and a 16-bit C is rounded
// once, to nearest even. When the tiles of C alone cannot fill the GPU, K is split
// and the float32 partial sums are added in split_reduce's fixed tree
// (kernels/cuda/split_reduce.cuh): the same bits every run for a given GPU model.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"

namespace towerlab::cuda {

void gemm_16bit(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a,
                bool transpose_b, float alpha, float beta, const Stream& stream);

void gemm_tf32(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a,
               bool transpose_b, float alpha, float beta, const Stream& stream);

}  // namespace towerlab::cuda
