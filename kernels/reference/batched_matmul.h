// The plain reference of batched_matmul (contract in kernels/batched_matmul.h): the
// reference GEMM (kernels/reference/matmul.h) on each entry, in order. T is float or
// double; the 16-bit products are matmul's (reference::matmul_mixed per entry).
// B == 0 with the 2-D sum is the reference GEMM with K = 0: C = beta C.
#pragma once

#include <cstdint>

#include "kernels/reference/matmul.h"

namespace towerlab::reference {

// Entries are a_stride, b_stride, c_stride elements apart: 0 for a shared 2-D operand
// and, with c_stride 0, the sum of kernels/batched_matmul.h's 2-D c (each entry after
// the first added with beta 1). Each operand is row-major with its own rows as leading
// dimension: op(A_i) [M,K], op(B_i) [K,N], C_i [M,N].
template <typename T>
void batched_matmul(bool transpose_a, bool transpose_b, std::int64_t batch, std::int64_t m,
                    std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t a_stride,
                    const T* b, std::int64_t b_stride, T beta, T* c, std::int64_t c_stride) {
  const std::int64_t lda = transpose_a ? m : k, ldb = transpose_b ? k : n;
  if (batch == 0 && c_stride == 0) {  // an empty sum: C = beta C
    matmul(transpose_a, transpose_b, m, n, std::int64_t{0}, alpha, a, lda, b, ldb, beta, c, n);
  }
  for (std::int64_t i = 0; i < batch; ++i) {
    const T entry_beta = c_stride == 0 && i > 0 ? T(1) : beta;
    matmul(transpose_a, transpose_b, m, n, k, alpha, a + i * a_stride, lda, b + i * b_stride, ldb,
           entry_beta, c + i * c_stride, n);
  }
}

}  // namespace towerlab::reference
