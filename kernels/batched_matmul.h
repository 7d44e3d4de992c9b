// Batched matrix multiplication: one GEMM (kernels/matmul.h) per batch entry, the
// products of attention (Q K^T, then the probabilities times V) and of any layer
// that multiplies stacks of matrices.
//
// Dimension letters: B batch entries, M rows of C, N columns of C, K the inner
// (summed) dimension. op(X) is X or its transpose, as in kernels/matmul.h:
//   a  [B,M,K] (transpose_a false) or [B,K,M] (true), or 2-D [M,K] / [K,M]
//   b  [B,K,N] (transpose_b false) or [B,N,K] (true), or 2-D [K,N] / [N,K]
//   c  [B,M,N], or 2-D [M,N]
//
//   batched_matmul(c, a, b, transpose_a, transpose_b, alpha, beta)
//     c 3-D:  C_i = alpha op(A_i) op(B_i) + beta C_i          for i < B
//             a 2-D operand is shared by every entry (op(A_i) = op(A)), so a
//             [B,T,D] activation times a [D,N] weight needs no copy of the weight;
//             at least one of a and b is 3-D.
//     c 2-D:  C = alpha sum_i op(A_i) op(B_i) + beta C          (a and b 3-D)
//             the sum over the batch, which is the gradient of a shared operand.
// beta == 0 assigns (C not read), beta == 1 accumulates, as matmul. B == 0 leaves a
// 3-D c empty and sets a 2-D c to beta C (0 when beta == 0).
//
// Each entry is matmul(C_i, A_i, B_i, ..., math) on views of the three tensors (on
// the CPU the operands are checked once and the whole batch goes to the GEMM, each
// entry with one matmul's bits), so the dtypes, devices, backends and Float32Math are
// matmul's: float32 on
// every device (the CPU's blocked driver; CUDA's SGEMM or cuBLAS as
// set_gemm_backend says, or its TF32 tensor cores under Float32Math::Tf32), float64
// on the CPU, and bfloat16 / float16 a and b with a float32 c (on the CPU a 16-bit
// c too; the 2-D sum takes a float32 or float64 c only: a 16-bit one would be rounded
// once per entry). On the CPU the entries are shared among the threads when there are at
// least as many entries as threads (each GEMM then runs on one thread, with the bits
// it has on any number); otherwise one after another, each on every thread. On CUDA
// they are one launch each on the stream, in order.
//
// Tolerance: each entry's is matmul's, against kernels/reference/batched_matmul.h
// (the reference GEMM per entry): |c - c_ref| <= 2 (K + 2) 2^-24 (|alpha| S + |beta
// c0|), S = sum_p |op(A_i)[m,p] op(B_i)[p,n]| (plus half an ulp of a 16-bit c; under
// Tf32 on CUDA, against the reference on the operands rounded to TF32). The
// 2-D sum adds the entries onto C in order i = 0 .. B-1 (each entry's GEMM with beta
// 1 after the first), at most B (K + ceil(K / 256) + 2) roundings: K becomes B K in
// the bound and S sums over the entries too.
//
// Errors (each naming batched_matmul and the three tensors' dtypes and shapes):
// ranks other than 2 or 3, two 2-D operands with a 3-D c, a 2-D c with a 2-D
// operand, batch sizes or inner dimensions that differ, and a c of the wrong shape
// are ShapeError; c overlapping a or b is InvalidArgument; dtypes are checked by
// matmul (NotSupported naming them), a 16-bit c in the 2-D sum here.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "matmul.h"

namespace towerlab {

void batched_matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a,
                    bool transpose_b, float alpha, float beta, const Stream& stream,
                    Float32Math math = Float32Math::Ieee);

}  // namespace towerlab
