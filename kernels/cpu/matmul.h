// The CPU GEMM entry point (internal: not installed, not in towerlab.h). Public
// contract and dispatch in kernels/matmul.h.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"

namespace towerlab::cpu {

// Raw row-major pointers, arguments already checked. Serves matmul() and other
// families (conv2d via im2col). The leading dimensions are the row strides of A,
// B, C as stored (lda >= K without transpose, >= M with).
template <typename T>
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
          T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc);

}  // namespace towerlab::cpu
