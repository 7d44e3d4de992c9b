// cuBLAS on the emulated GPUs (include/cublas_v2.h): handles, and SGEMM as a
// reference loop queued on the handle's stream.
//
// Arithmetic: each element of C accumulates its k products in double, in k order,
// and is rounded to float once, after alpha and beta: a float product is exact in
// double, so the sum's bits do not depend on the loop order the layout picks (the
// two loops below give the same bits) nor on whether the compiler fuses a multiply
// and an add. Contraction is switched off for this file anyway, so that the scaling
// by alpha and beta is the same in every build.
//
// Handles are bookkeeping of the calling thread (cuBLAS handles are not
// thread-safe), looked up in a registry inside Hidden scopes: two threads' calls
// order nothing.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "internal.h"

struct cublasContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace tlemu::detail {
namespace {

struct Handles {
  std::mutex m;
  std::map<cublasContext*, std::unique_ptr<cublasContext>> live;
};

// Never destroyed: towerlab destroys its handles when its threads exit, the main
// thread's among the static destructors.
Handles& handles() {
  static Handles* h = new Handles;
  return *h;
}

// The handle's state (a copy: the caller's thread is the only one that changes it),
// or nullopt for a handle that is not live.
std::optional<cublasContext> find(cublasHandle_t handle) {
  Hidden hidden;
  Handles& h = handles();
  std::lock_guard lock(h.m);
  auto it = h.live.find(handle);
  if (it == h.live.end()) return std::nullopt;
  return *it->second;
}

template <typename Change>
bool change(cublasHandle_t handle, Change how) {
  Hidden hidden;
  Handles& h = handles();
  std::lock_guard lock(h.m);
  auto it = h.live.find(handle);
  if (it == h.live.end()) return false;
  how(*it->second);
  return true;
}

cublasStatus_t complain(cublasStatus_t status, const std::string& why) {
  std::fprintf(stderr, "emulated cuBLAS: %s: %s\n", cublasGetStatusName(status), why.c_str());
  return status;
}

const char* op_name(cublasOperation_t op) {
  switch (op) {
    case CUBLAS_OP_N:
      return "CUBLAS_OP_N";
    case CUBLAS_OP_T:
      return "CUBLAS_OP_T";
    case CUBLAS_OP_C:
      return "CUBLAS_OP_C";
    case CUBLAS_OP_CONJG:
      return "CUBLAS_OP_CONJG";
  }
  return "an unknown cublasOperation_t";
}

// Why the `rows` x `cols` column-major matrix at p with leading dimension ld is not
// memory a kernel on `device` may read or write; "" when it is.
std::string matrix_problem(const char* name, const float* p, std::int64_t rows, std::int64_t cols,
                           std::int64_t ld, int device) {
  const std::size_t bytes = static_cast<std::size_t>((cols - 1) * ld + rows) * sizeof(float);
  const std::string what = std::string(name) + " (" + std::to_string(rows) + "x" +
                           std::to_string(cols) + ", leading dimension " + std::to_string(ld) +
                           ", " + std::to_string(bytes) + " bytes)";
  if (p == nullptr) return what + " is null";
  auto a = find_allocation(p, bytes);
  if (!a) {
    if (find_allocation(p, 1)) {
      return what + " runs past the end of its allocation: it starts at " + describe_pointer(p);
    }
    return what + " is " + describe_pointer(p);
  }
  if (a->device >= 0 && !peer_enabled(device, a->device)) {
    return what + " is " + describe_pointer(p) +
           ", and peer access from cuda:" + std::to_string(device) +
           " to cuda:" + std::to_string(a->device) + " is not enabled";
  }
  return "";
}

// Rounds to TF32 (10 mantissa bits, to nearest, ties to even), as tensor cores read
// FP32 operands under CUBLAS_TF32_TENSOR_OP_MATH.
float to_tf32(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7f800000u) != 0x7f800000u) {  // finite
    bits += 0xfffu + ((bits >> 13) & 1u);
    bits &= 0xffffe000u;
  }
  std::memcpy(&x, &bits, sizeof bits);
  return x;
}

struct Gemm {
  bool ta = false, tb = false, tf32 = false;
  int m = 0, n = 0, k = 0;
  float alpha = 0, beta = 0;
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  std::int64_t lda = 0, ldb = 0, ldc = 0;

  float read(const float* p, std::int64_t i) const { return tf32 ? to_tf32(p[i]) : p[i]; }
  // op(A)[i, l] and op(B)[l, j]
  float A(std::int64_t i, std::int64_t l) const { return read(a, ta ? l + i * lda : i + l * lda); }
  float B(std::int64_t l, std::int64_t j) const { return read(b, tb ? j + l * ldb : l + j * ldb); }

  void store(std::int64_t i, std::int64_t j, double sum) const {
    float& out = c[i + j * ldc];
    double value = static_cast<double>(alpha) * sum;
    if (beta != 0.0f) value += static_cast<double>(beta) * static_cast<double>(out);
    out = static_cast<float>(value);
  }

  void run() const {
    const bool products = alpha != 0.0f && k > 0;
    std::vector<double> column(static_cast<std::size_t>(m));
    for (std::int64_t j = 0; j < n; ++j) {
      std::fill(column.begin(), column.end(), 0.0);
      if (products && !ta) {
        // op(A) = A: its columns are contiguous, so accumulate column by column.
        for (std::int64_t l = 0; l < k; ++l) {
          const double blj = B(l, j);
          const float* a_col = a + l * lda;
          for (std::int64_t i = 0; i < m; ++i) {
            column[static_cast<std::size_t>(i)] +=
                static_cast<double>(tf32 ? to_tf32(a_col[i]) : a_col[i]) * blj;
          }
        }
      } else if (products) {
        // op(A) = A^T: a row of op(A) is a contiguous column of A.
        for (std::int64_t i = 0; i < m; ++i) {
          double sum = 0.0;
          for (std::int64_t l = 0; l < k; ++l) sum += static_cast<double>(A(i, l)) * B(l, j);
          column[static_cast<std::size_t>(i)] = sum;
        }
      }
      for (std::int64_t i = 0; i < m; ++i) store(i, j, column[static_cast<std::size_t>(i)]);
    }
  }
};

}  // namespace
}  // namespace tlemu::detail

using namespace tlemu::detail;

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr)
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate: handle is null");
  *handle = nullptr;
  const int device = current_device();
  if (const cudaError_t e = sticky(device); e != cudaSuccess) {
    return complain(CUBLAS_STATUS_NOT_INITIALIZED, std::string("cublasCreate: cuda:") +
                                                       std::to_string(device) + " has the error " +
                                                       cudaGetErrorName(e));
  }
  auto context = std::make_unique<cublasContext>();
  context->device = device;
  cublasContext* raw = context.get();
  {
    Hidden hidden;
    Handles& h = handles();
    std::lock_guard lock(h.m);
    h.live[raw] = std::move(context);
  }
  *handle = raw;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  std::unique_ptr<cublasContext> context;
  {
    Hidden hidden;
    Handles& h = handles();
    std::lock_guard lock(h.m);
    auto it = h.live.find(handle);
    if (it != h.live.end()) {
      context = std::move(it->second);
      h.live.erase(it);
    }
  }
  if (!context) {
    return complain(CUBLAS_STATUS_NOT_INITIALIZED,
                    "cublasDestroy: the handle is not a live cuBLAS handle");
  }
  // As documented for cuBLAS: releasing the handle's resources synchronizes the device.
  synchronize_device(context->device);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!change(handle, [&](cublasContext& c) { c.stream = stream; })) {
    return complain(CUBLAS_STATUS_NOT_INITIALIZED,
                    "cublasSetStream: the handle is not a live cuBLAS handle");
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  const int base = static_cast<int>(mode) & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base < CUBLAS_DEFAULT_MATH || base > CUBLAS_TF32_TENSOR_OP_MATH) {
    return complain(
        CUBLAS_STATUS_INVALID_VALUE,
        "cublasSetMathMode: " + std::to_string(static_cast<int>(mode)) + " is not a cublasMath_t");
  }
  if (!change(handle, [&](cublasContext& c) { c.math = mode; })) {
    return complain(CUBLAS_STATUS_NOT_INITIALIZED,
                    "cublasSetMathMode: the handle is not a live cuBLAS handle");
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  const std::optional<cublasContext> context = find(handle);
  if (!context) {
    return complain(CUBLAS_STATUS_NOT_INITIALIZED,
                    "cublasSgemm: the handle is not a live cuBLAS handle");
  }
  auto valid_op = [](cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  if (!valid_op(transa) || !valid_op(transb)) {
    return complain(CUBLAS_STATUS_INVALID_VALUE, std::string("cublasSgemm: transa ") +
                                                     op_name(transa) + ", transb " +
                                                     op_name(transb) + " (N, T or C)");
  }
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  // op(A) is m x k, op(B) is k x n: A is stored rows_a x cols_a, B rows_b x cols_b.
  const int rows_a = ta ? k : m, cols_a = ta ? m : k;
  const int rows_b = tb ? n : k, cols_b = tb ? k : n;
  const std::string shape = "cublasSgemm(" + std::string(op_name(transa)) + ", " + op_name(transb) +
                            ", m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                            std::to_string(k) + ", lda " + std::to_string(lda) + ", ldb " +
                            std::to_string(ldb) + ", ldc " + std::to_string(ldc) + ")";
  if (m < 0 || n < 0 || k < 0) {
    return complain(CUBLAS_STATUS_INVALID_VALUE, shape + ": a negative dimension");
  }
  if (lda < std::max(1, rows_a)) {
    return complain(CUBLAS_STATUS_INVALID_VALUE, shape + ": lda must be at least max(1, " +
                                                     std::to_string(rows_a) +
                                                     "), the rows of the stored A");
  }
  if (ldb < std::max(1, rows_b)) {
    return complain(CUBLAS_STATUS_INVALID_VALUE, shape + ": ldb must be at least max(1, " +
                                                     std::to_string(rows_b) +
                                                     "), the rows of the stored B");
  }
  if (ldc < std::max(1, m)) {
    return complain(CUBLAS_STATUS_INVALID_VALUE,
                    shape + ": ldc must be at least max(1, m = " + std::to_string(m) + ")");
  }
  if (alpha == nullptr || beta == nullptr) {
    return complain(CUBLAS_STATUS_INVALID_VALUE, shape + ": alpha or beta is null");
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  Gemm g;
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k;
  g.alpha = *alpha, g.beta = *beta;  // host pointer mode: read now
  g.a = A, g.b = B, g.c = C, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.tf32 = (context->math & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) ==
           CUBLAS_TF32_TENSOR_OP_MATH;
  const bool products = g.alpha != 0.0f && k > 0;
  if (!products && g.beta == 1.0f) return CUBLAS_STATUS_SUCCESS;  // C unchanged, as BLAS

  const int device = context->device;
  const int stream_dev = stream_device(context->stream);
  if (stream_dev < 0) {
    return complain(CUBLAS_STATUS_EXECUTION_FAILED,
                    shape + ": the handle's stream is not a live stream of the emulated GPUs");
  }
  if (stream_dev != device) {
    return complain(CUBLAS_STATUS_INVALID_VALUE,
                    shape + ": the handle was made on cuda:" + std::to_string(device) +
                        " but its stream runs on cuda:" + std::to_string(stream_dev));
  }
  if (const cudaError_t e = sticky(device); e != cudaSuccess) {
    return complain(CUBLAS_STATUS_EXECUTION_FAILED, shape + ": cuda:" + std::to_string(device) +
                                                        " has the error " + cudaGetErrorName(e));
  }
  std::string problem;
  if (products) {
    problem = matrix_problem("A", A, rows_a, cols_a, lda, device);
    if (problem.empty()) problem = matrix_problem("B", B, rows_b, cols_b, ldb, device);
  }
  if (problem.empty()) problem = matrix_problem("C", C, m, n, ldc, device);
  if (!problem.empty()) {
    return complain(CUBLAS_STATUS_INVALID_VALUE,
                    shape + " on cuda:" + std::to_string(device) + ": " + problem);
  }

  const cudaError_t e = enqueue(context->stream, {"cublasSgemm", [g, device] {
                                                    if (take_kernel_fault(device)) {
                                                      raise_sticky(device, cudaErrorIllegalAddress,
                                                                   "cublasSgemm: an injected fault "
                                                                   "(tlemu::fault_kernel)");
                                                      return;
                                                    }
                                                    g.run();
                                                    count_kernel(1, 1);
                                                  }});
  if (e != cudaSuccess) {
    return complain(CUBLAS_STATUS_EXECUTION_FAILED,
                    shape + ": queuing on the stream failed with " + cudaGetErrorName(e));
  }
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
#define TLEMU_NAME(s) \
  case s:             \
    return #s;
    TLEMU_NAME(CUBLAS_STATUS_SUCCESS)
    TLEMU_NAME(CUBLAS_STATUS_NOT_INITIALIZED)
    TLEMU_NAME(CUBLAS_STATUS_ALLOC_FAILED)
    TLEMU_NAME(CUBLAS_STATUS_INVALID_VALUE)
    TLEMU_NAME(CUBLAS_STATUS_ARCH_MISMATCH)
    TLEMU_NAME(CUBLAS_STATUS_MAPPING_ERROR)
    TLEMU_NAME(CUBLAS_STATUS_EXECUTION_FAILED)
    TLEMU_NAME(CUBLAS_STATUS_INTERNAL_ERROR)
    TLEMU_NAME(CUBLAS_STATUS_NOT_SUPPORTED)
    TLEMU_NAME(CUBLAS_STATUS_LICENSE_ERROR)
#undef TLEMU_NAME
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "an error was detected when checking the current licensing";
  }
  return "unknown error";
}
