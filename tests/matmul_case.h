// What the matmul tests share (matmul_test.cpp, matmul_cpu_test.cpp): a product's
// sizes, its operands' stored shapes, the library's plain reference result and the
// tolerance a float32 product is held to.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/reference/matmul.h"
#include "test_util.h"

namespace towerlab::testing {

struct Dims {
  std::int64_t m, n, k;
};

// Stored shapes of A and B for op(A) [m,k], op(B) [k,n].
inline Shape a_shape(const Dims& d, bool transpose_a) {
  return transpose_a ? Shape{d.k, d.m} : Shape{d.m, d.k};
}
inline Shape b_shape(const Dims& d, bool transpose_b) {
  return transpose_b ? Shape{d.n, d.k} : Shape{d.k, d.n};
}

// C = alpha op(A) op(B) + beta C from the library's plain reference
// (kernels/reference/matmul.h), in double (beta == 0 ignores C).
inline std::vector<float> reference(const std::vector<float>& a, const std::vector<float>& b,
                                    const std::vector<float>& c, const Dims& d, bool transpose_a,
                                    bool transpose_b, double alpha, double beta) {
  const std::vector<double> a64(a.begin(), a.end()), b64(b.begin(), b.end());
  std::vector<double> c64(static_cast<std::size_t>(d.m * d.n));
  if (beta != 0.0) c64.assign(c.begin(), c.end());
  reference::matmul(transpose_a, transpose_b, d.m, d.n, d.k, alpha, a64.data(),
                    transpose_a ? d.m : d.k, b64.data(), transpose_b ? d.k : d.n, beta, c64.data(),
                    d.n);
  return {c64.begin(), c64.end()};
}

// Float32 rounding grows with K; values are in [-1, 1).
inline ::testing::AssertionResult close_for_k(const std::vector<float>& actual,
                                              const std::vector<float>& expected, std::int64_t k) {
  return all_close(actual, expected, 2e-6 * static_cast<double>(k + 1), 1e-5);
}

inline std::string layout(bool transpose_a, bool transpose_b) {
  return std::string(transpose_a ? "T" : "N") + (transpose_b ? "T" : "N");
}

}  // namespace towerlab::testing
