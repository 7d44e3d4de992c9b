// The emulated cuBLAS: SGEMM against a naive column-major reference (every layout,
// beta zero, TF32 rounding), its argument checks and peer access between devices.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "libraries_test.h"

namespace {

using namespace libraries_test;

// C := alpha op(A) op(B) + beta C, column-major, as BLAS defines it; double sums.
void reference_sgemm(bool ta, bool tb, int m, int n, int k, float alpha,
                     const std::vector<float>& a, int lda, const std::vector<float>& b, int ldb,
                     float beta, std::vector<float>& c, int ldc) {
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double sum = 0;
      for (int l = 0; l < k; ++l) {
        const float x = ta ? a[std::size_t(l + i * lda)] : a[std::size_t(i + l * lda)];
        const float y = tb ? b[std::size_t(j + l * ldb)] : b[std::size_t(l + j * ldb)];
        sum += double(x) * double(y);
      }
      float& out = c[std::size_t(i + j * ldc)];
      out = float(double(alpha) * sum + (beta != 0.0f ? double(beta) * double(out) : 0.0));
    }
  }
}

struct Cublas {
  cublasHandle_t handle = nullptr;
  Cublas() { EXPECT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS); }
  ~Cublas() { EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS); }
};

TEST_F(Libraries, SgemmAllFourLayoutsMatchTheReference) {
  const int m = 7, n = 5, k = 9;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Cublas blas;
  ASSERT_EQ(cublasSetMathMode(blas.handle, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(blas.handle, stream), CUBLAS_STATUS_SUCCESS);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Stored shapes, each with a leading dimension above its rows.
      const int rows_a = ta ? k : m, cols_a = ta ? m : k, lda = rows_a + 3;
      const int rows_b = tb ? n : k, cols_b = tb ? k : n, ldb = rows_b + 2;
      const int ldc = m + 4;
      const auto a = random_floats(std::size_t(lda * cols_a), 1 + ta);
      const auto b = random_floats(std::size_t(ldb * cols_b), 3 + tb);
      auto c = random_floats(std::size_t(ldc * n), 5);
      (void)rows_b;
      float* da = device_copy(a);
      float* db = device_copy(b);
      float* dc = device_copy(c);
      const float alpha = 1.5f, beta = -0.75f;
      ASSERT_EQ(
          cublasSgemm(blas.handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                      m, n, k, &alpha, da, lda, db, ldb, &beta, dc, ldc),
          CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto got = host_copy(dc, c.size());
      auto expected = c;
      reference_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, expected, ldc);
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < ldc; ++i) {
          const std::size_t at = std::size_t(i + j * ldc);
          if (i >= m) {
            // The rows between m and ldc are not C's: untouched.
            EXPECT_EQ(std::bit_cast<std::uint32_t>(got[at]), std::bit_cast<std::uint32_t>(c[at]));
          } else {
            EXPECT_NEAR(got[at], expected[at], 1e-5f * (1.0f + std::fabs(expected[at])))
                << "ta " << ta << " tb " << tb << " at (" << i << ", " << j << ")";
          }
        }
      }
      cudaFree(da);
      cudaFree(db);
      cudaFree(dc);
    }
  }
  cudaStreamDestroy(stream);
}

TEST_F(Libraries, SgemmWithBetaZeroNeverReadsC) {
  const int m = 3, n = 4, k = 5;
  const auto a = random_floats(std::size_t(m * k), 11);
  const auto b = random_floats(std::size_t(k * n), 12);
  std::vector<float> nan(std::size_t(m * n), std::numeric_limits<float>::quiet_NaN());
  float* da = device_copy(a);
  float* db = device_copy(b);
  float* dc = device_copy(nan);
  Cublas blas;  // on the legacy default stream
  const float alpha = 2.0f, beta = 0.0f;
  ASSERT_EQ(cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, db, k, &beta,
                        dc, m),
            CUBLAS_STATUS_SUCCESS);
  auto expected = nan;
  reference_sgemm(false, false, m, n, k, alpha, a, m, b, k, beta, expected, m);
  const auto got = host_copy(dc, nan.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    EXPECT_NEAR(got[i], expected[i], 1e-5f * (1.0f + std::fabs(expected[i])));
  }
  // alpha 0 and beta 0: C becomes 0 without A or B being read (NaN in A stays out).
  std::vector<float> nan_a(a.size(), std::numeric_limits<float>::quiet_NaN());
  float* dnan_a = device_copy(nan_a);
  upload(dc, nan);
  const float zero = 0.0f;
  ASSERT_EQ(cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &zero, dnan_a, m, db, k,
                        &zero, dc, m),
            CUBLAS_STATUS_SUCCESS);
  for (float x : host_copy(dc, nan.size())) EXPECT_EQ(std::bit_cast<std::uint32_t>(x), 0u);
  // k = 0: A and B are not read (null here), C := beta C.
  upload(dc, std::vector<float>(a.begin(), a.begin() + m * n));
  const float half = 0.5f;
  ASSERT_EQ(cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, 0, &alpha, nullptr, m, nullptr,
                        1, &half, dc, m),
            CUBLAS_STATUS_SUCCESS);
  const auto scaled = host_copy(dc, std::size_t(m * n));
  for (int i = 0; i < m * n; ++i) EXPECT_EQ(scaled[std::size_t(i)], a[std::size_t(i)] * 0.5f);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dnan_a);
}

TEST_F(Libraries, SgemmRoundsToTf32OnlyWhenAskedTo) {
  const float a = 1.0f + 1.0f / 4096.0f;  // 12 mantissa bits: TF32 keeps 10
  float* da = device_copy(std::vector<float>{a});
  float* db = device_copy(std::vector<float>{1.0f});
  float* dc = device_copy(std::vector<float>{0.0f});
  Cublas blas;
  const float one = 1.0f, zero = 0.0f;
  ASSERT_EQ(
      cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, 1, db, 1, &zero, dc, 1),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(host_copy(dc, 1)[0], a);
  ASSERT_EQ(cublasSetMathMode(blas.handle, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(
      cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, 1, db, 1, &zero, dc, 1),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(host_copy(dc, 1)[0], 1.0f);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

TEST_F(Libraries, SgemmRefusesBadArguments) {
  const int m = 4, n = 3, k = 2;
  float* da = device_copy(std::vector<float>(std::size_t(m * k), 1.0f));
  float* db = device_copy(std::vector<float>(std::size_t(k * n), 1.0f));
  float* dc = device_copy(std::vector<float>(std::size_t(m * n), 0.0f));
  Cublas blas;
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&](cublasOperation_t ta, cublasOperation_t tb, int mm, int nn, int kk,
                  const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
    return cublasSgemm(blas.handle, ta, tb, mm, nn, kk, &one, a, lda, b, ldb, &zero, c, ldc);
  };
  const auto N = CUBLAS_OP_N, T = CUBLAS_OP_T;
  EXPECT_EQ(gemm(N, N, m, n, k, da, m, db, k, dc, m), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(N, N, -1, n, k, da, m, db, k, dc, m), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(N, N, m, n, -2, da, m, db, k, dc, m), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(N, N, m, n, k, da, m - 1, db, k, dc, m), CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(gemm(T, N, m, n, k, da, k - 1, db, k, dc, m), CUBLAS_STATUS_INVALID_VALUE);  // lda < k
  EXPECT_EQ(gemm(N, N, m, n, k, da, m, db, k - 1, dc, m), CUBLAS_STATUS_INVALID_VALUE);  // ldb < k
  EXPECT_EQ(gemm(N, T, m, n, k, da, m, db, n - 1, dc, m), CUBLAS_STATUS_INVALID_VALUE);  // ldb < n
  EXPECT_EQ(gemm(N, N, m, n, k, da, m, db, k, dc, m - 1), CUBLAS_STATUS_INVALID_VALUE);  // ldc < m
  EXPECT_EQ(gemm(CUBLAS_OP_CONJG, N, m, n, k, da, m, db, k, dc, m), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(static_cast<cublasOperation_t>(7), N, m, n, k, da, m, db, k, dc, m),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSgemm(blas.handle, N, N, m, n, k, nullptr, da, m, db, k, &zero, dc, m),
            CUBLAS_STATUS_INVALID_VALUE);
  // Memory: host memory, a range past the allocation's end (lda too large for A's
  // block), null, freed.
  std::vector<float> host(std::size_t(m * k), 1.0f);
  EXPECT_EQ(gemm(N, N, m, n, k, host.data(), m, db, k, dc, m), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(N, N, m, n, k, da, m + 1, db, k, dc, m), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(N, N, m, n, k, da, m, db, k, nullptr, m), CUBLAS_STATUS_INVALID_VALUE);
  float* freed = device_copy(std::vector<float>(std::size_t(m * n), 0.0f));
  cudaFree(freed);
  EXPECT_EQ(gemm(N, N, m, n, k, da, m, db, k, freed, m), CUBLAS_STATUS_INVALID_VALUE);
  // m or n 0: nothing to do, nothing checked.
  EXPECT_EQ(gemm(N, N, 0, n, k, nullptr, 1, nullptr, k, nullptr, 1), CUBLAS_STATUS_SUCCESS);
  // Handles.
  EXPECT_EQ(cublasSgemm(nullptr, N, N, m, n, k, &one, da, m, db, k, &zero, dc, m),
            CUBLAS_STATUS_NOT_INITIALIZED);
  cublasHandle_t gone;
  ASSERT_EQ(cublasCreate(&gone), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasDestroy(gone), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasSetStream(gone, nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasDestroy(gone), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasSetMathMode(blas.handle, static_cast<cublasMath_t>(9)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasCreate(nullptr), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // no call above faulted the device
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

TEST_F(Libraries, SgemmOnAnotherDeviceNeedsPeerAccess) {
  if (devices() < 2) GTEST_SKIP() << "needs two emulated devices";
  const int m = 2, n = 2, k = 2;
  float* da = device_copy(std::vector<float>{1, 2, 3, 4});  // on cuda:0
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  float* db = device_copy(std::vector<float>{1, 0, 0, 1});
  float* dc = device_copy(std::vector<float>(4, 0.0f));
  cudaStream_t stream1;
  ASSERT_EQ(cudaStreamCreate(&stream1), cudaSuccess);
  Cublas blas;  // made on cuda:1
  ASSERT_EQ(cublasSetStream(blas.handle, stream1), CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, zero = 0.0f;
  EXPECT_EQ(
      cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, db, k, &zero, dc, m),
      CUBLAS_STATUS_INVALID_VALUE);
  ASSERT_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaSuccess);
  EXPECT_EQ(
      cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, db, k, &zero, dc, m),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(stream1), cudaSuccess);
  EXPECT_EQ(host_copy(dc, 4), (std::vector<float>{1, 2, 3, 4}));
  // A stream of cuda:0 for a handle of cuda:1.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t stream0;
  ASSERT_EQ(cudaStreamCreate(&stream0), cudaSuccess);
  ASSERT_EQ(cublasSetStream(blas.handle, stream0), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(
      cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, db, k, &zero, dc, m),
      CUBLAS_STATUS_INVALID_VALUE);
  cudaStreamDestroy(stream0);
  cudaStreamDestroy(stream1);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

}  // namespace
