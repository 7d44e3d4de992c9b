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

// The GEMM's block of the inner dimension: each output sums its products kGemmKc at
// a time in registers, and the blocks' sums onto C in order. A kernel that must give
// the GEMM's bits (conv2d's implicit weight gradient) blocks its sums the same way.
constexpr std::int64_t kGemmKc = 256;

#if defined(__x86_64__)
// dst [k][32] <- 32 rows of src, `ld` apart, each contiguous along k: the GEMM's
// packer for a full panel of its AVX-512 kernel's B (or of any 32 rows), with AVX2.
void pack_32_rows_avx2(const float* src, std::int64_t ld, std::int64_t k, float* dst);
#endif

}  // namespace towerlab::cpu
