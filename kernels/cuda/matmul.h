// The CUDA GEMM entry point (internal: not installed, not in towerlab.h). Public
// contract and dispatch in kernels/matmul.h.
#pragma once

#include <cstdint>

#include "engine/stream.h"
#include "kernels/matmul.h"

namespace towerlab::cuda {

// As cpu::gemm (kernels/cpu/matmul.h), float32 only; uses the backend chosen by
// set_gemm_backend().
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
          float beta, float* c, std::int64_t ldc, const Stream& stream);

}  // namespace towerlab::cuda
