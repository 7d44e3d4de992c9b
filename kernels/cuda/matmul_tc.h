// The CUDA GEMM of 16-bit operands on tensor cores (internal: not installed, not in
// towerlab.h). Public contract, dtypes and tolerance in kernels/matmul.h.
//
//   gemm_16bit(c, a, b, transpose_a, transpose_b, alpha, beta, stream)
//     C = alpha * op(A) op(B) + beta * C
//   a, b: both bfloat16 or both float16, 2-D, on the stream's CUDA device (as stored:
//         A [M,K] or [K,M], B [K,N] or [N,K]); c: [M,N], float32 or a's dtype.
//   The caller (kernels/matmul.cpp) has checked shapes, dtypes, devices and overlap,
//   and returns before an empty C.
//
// Every shape and layout runs on the tensor cores: no fallback to the widening path.
// The kernel copies 16-byte chunks (8 values) of A and B into shared memory, so it
// needs each operand's base address 16-byte aligned and its row length (lda, ldb) a
// multiple of 8; an operand that is not (K = 9 in A [M,K], N = 70 in B [K,N], a view
// at an odd offset) is first copied into scratch with rows padded to a multiple of
// 8 (one pass over the operand's 16-bit bytes; the zeros in the padding are the
// values the kernel multiplies past the edge of a ragged chunk). Chunks past the
// edges of the tiles (M, N, K not multiples of 128, 128, 32) are zero-filled by the
// copies themselves, so the kernel reads no byte outside A and B (or the copy).
//
// Sums: each output's products (exact in float32) are added in float32 by the
// tensor cores' mma in k order, then alpha and beta are applied in float32
// (beta == 0: C not read) and a 16-bit C is rounded once, to nearest even. When
// the tiles of C alone cannot fill the GPU, K is split and the float32 partial sums
// are added in split_reduce's fixed tree (kernels/cuda/split_reduce.cuh): the same
// bits every run for a given GPU model.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"

namespace towerlab::cuda {

void gemm_16bit(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a,
                bool transpose_b, float alpha, float beta, const Stream& stream);

}  // namespace towerlab::cuda
