// matmul's plain reference (contract in kernels/reference/matmul.h): the i-p-j
// loop order, so that the innermost loop walks a row of C; the mixed-precision
// and TF32 ones sum each output on its own, in double.
#include "kernels/reference/matmul.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace towerlab::reference {

template <typename T>
void matmul(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
            T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
            std::int64_t ldc) {
  auto a_at = [&](std::int64_t i, std::int64_t p) {  // op(A)[i,p]
    return transpose_a ? a[p * lda + i] : a[i * lda + p];
  };
  auto b_at = [&](std::int64_t p, std::int64_t j) {  // op(B)[p,j]
    return transpose_b ? b[j * ldb + p] : b[p * ldb + j];
  };
  for (std::int64_t i = 0; i < m; ++i) {
    T* c_row = c + i * ldc;  // [N]
    for (std::int64_t j = 0; j < n; ++j) c_row[j] = beta == T(0) ? T(0) : beta * c_row[j];
    for (std::int64_t p = 0; p < k; ++p) {
      const T a_ip = alpha * a_at(i, p);
      for (std::int64_t j = 0; j < n; ++j) c_row[j] += a_ip * b_at(p, j);
    }
  }
}

template void matmul<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float,
                            const float*, std::int64_t, const float*, std::int64_t, float, float*,
                            std::int64_t);
template void matmul<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double,
                             const double*, std::int64_t, const double*, std::int64_t, double,
                             double*, std::int64_t);

namespace {

// matmul_mixed's and matmul_tf32's loop: each value x of A and B enters as
// widen(x), a double that holds it exactly.
template <typename In, typename Out, typename Widen>
void sum_in_double(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n,
                   std::int64_t k, float alpha, const In* a, std::int64_t lda, const In* b,
                   std::int64_t ldb, float beta, Out* c, std::int64_t ldc, Widen widen) {
  auto a_at = [&](std::int64_t i, std::int64_t p) {  // op(A)[i,p]
    return widen(transpose_a ? a[p * lda + i] : a[i * lda + p]);
  };
  auto b_at = [&](std::int64_t p, std::int64_t j) {  // op(B)[p,j]
    return widen(transpose_b ? b[j * ldb + p] : b[p * ldb + j]);
  };
  for (std::int64_t i = 0; i < m; ++i) {
    Out* c_row = c + i * ldc;  // [N]
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (std::int64_t p = 0; p < k; ++p) sum += a_at(i, p) * b_at(p, j);
      double value = static_cast<double>(alpha) * sum;
      if (beta != 0.0f) value += static_cast<double>(beta) * static_cast<double>(c_row[j]);
      c_row[j] = static_cast<Out>(value);
    }
  }
}

}  // namespace

template <typename In, typename Out>
void matmul_mixed(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n,
                  std::int64_t k, float alpha, const In* a, std::int64_t lda, const In* b,
                  std::int64_t ldb, float beta, Out* c, std::int64_t ldc) {
  sum_in_double(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                [](In x) { return static_cast<double>(x); });
}

template void matmul_mixed<bfloat16, float>(bool, bool, std::int64_t, std::int64_t, std::int64_t,
                                            float, const bfloat16*, std::int64_t, const bfloat16*,
                                            std::int64_t, float, float*, std::int64_t);
template void matmul_mixed<bfloat16, bfloat16>(bool, bool, std::int64_t, std::int64_t, std::int64_t,
                                               float, const bfloat16*, std::int64_t,
                                               const bfloat16*, std::int64_t, float, bfloat16*,
                                               std::int64_t);
template void matmul_mixed<float16, float>(bool, bool, std::int64_t, std::int64_t, std::int64_t,
                                           float, const float16*, std::int64_t, const float16*,
                                           std::int64_t, float, float*, std::int64_t);
template void matmul_mixed<float16, float16>(bool, bool, std::int64_t, std::int64_t, std::int64_t,
                                             float, const float16*, std::int64_t, const float16*,
                                             std::int64_t, float, float16*, std::int64_t);

float round_tf32(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  int exponent = 0;
  std::frexp(x, &exponent);  // |x| in [2^(exponent - 1), 2^exponent)
  // The spacing of 11 significant bits in that binade; below float32's normals
  // (2^-126) the spacing stays that of the lowest binade.
  const double step = std::ldexp(1.0, std::max(exponent, -125) - 11);
  const double rounded = std::round(static_cast<double>(x) / step) * step;  // ties away
  if (std::fabs(rounded) > std::numeric_limits<float>::max()) {
    return std::copysign(std::numeric_limits<float>::infinity(), x);
  }
  return static_cast<float>(rounded);  // exact: 11 significant bits
}

void matmul_tf32(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 float beta, float* c, std::int64_t ldc) {
  sum_in_double(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                [](float x) { return static_cast<double>(round_tf32(x)); });
}

}  // namespace towerlab::reference
