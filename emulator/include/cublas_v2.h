// cuBLAS on the emulated GPUs: the calls towerlab makes (kernels/cuda/matmul.cu,
// engine/cuda_check.h), with cuBLAS's names, values and column-major semantics.
//
//   cublasCreate / cublasDestroy       a handle tied to the device current at creation
//   cublasSetStream / cublasSetMathMode
//   cublasSgemm                        C = alpha op(A) op(B) + beta C, column-major
//   cublasGetStatusName / cublasGetStatusString
//
// The SGEMM is a reference loop queued on the handle's stream (src/cublas.cpp): each
// element of C is one float accumulation in k order with fmaf, whatever the layout,
// so the bits are the same run to run. Like cuBLAS it never reads C when beta is 0
// (NaN in C does not leak into the result) and never reads A or B when alpha is 0 or
// k is 0. Under CUBLAS_TF32_TENSOR_OP_MATH the inputs are rounded to TF32 first, as
// tensor cores may; the other math modes compute in full FP32.
//
// Where cuBLAS would launch a kernel that faults later, the emulator checks at the
// call: A, B and C must be the memory the call reads and writes (their last column
// included) on the stream's device, on a peer the device has enabled, or pinned host
// memory; otherwise cublasSgemm returns CUBLAS_STATUS_INVALID_VALUE and says why on
// stderr ("emulated cuBLAS: ..."). The run itself counts as one kernel
// (tlemu::counters) and can be made to fault with tlemu::fault_kernel.
#pragma once

#include <cuda_runtime.h>

#define CUBLAS_VER_MAJOR 13
#define CUBLAS_VER_MINOR 0
#define CUBLAS_VER_PATCH 0
#define CUBLAS_VERSION (CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH)

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef enum {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,  // for real data, the same as CUBLAS_OP_T
  CUBLAS_OP_HERMITAN = 2,
  CUBLAS_OP_CONJG = 3,  // not accepted by cublasSgemm
} cublasOperation_t;

typedef enum {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TENSOR_OP_MATH = 1,  // deprecated in cuBLAS 11, accepted
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,  // a flag, or'ed with the others
} cublasMath_t;

typedef struct cublasContext* cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);

// alpha and beta are host pointers (cuBLAS's default pointer mode), read during the call.
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc);

const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);
