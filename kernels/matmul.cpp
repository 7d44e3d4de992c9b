// Checks and backend dispatch for matmul (kernels/matmul.h).
#include "kernels/matmul.h"

#include <atomic>
#include <cstdint>
#include <string>

#include "kernels/checks.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/matmul.h"

namespace towerlab {

namespace {

std::atomic<GemmBackend> g_gemm_backend{GemmBackend::Towerlab};

// "float32[3,4]": the form the shape messages use.
std::string typed_shape(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + t.shape_str();
}

void check_2d(const char* name, const Tensor& t) {
  TL_CHECK(t.dim() == 2, ShapeError,
           "matmul: " << name << " is " << typed_shape(t) << " but must be 2-D (a matrix)");
}

bool overlaps(const Tensor& x, const Tensor& y) {
  if (x.numel() == 0 || y.numel() == 0) return false;
  const auto* x0 = static_cast<const char*>(x.raw_data());
  const auto* y0 = static_cast<const char*>(y.raw_data());
  return x0 < y0 + y.nbytes() && y0 < x0 + x.nbytes();
}

}  // namespace

void set_gemm_backend(GemmBackend backend) {
  g_gemm_backend.store(backend);
}
GemmBackend gemm_backend() {
  return g_gemm_backend.load();
}

void matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
            float alpha, float beta, const Stream& stream) {
  kernels::check_on_stream("matmul", stream, {{"c", &c}, {"a", &a}, {"b", &b}});
  check_2d("a", a);
  check_2d("b", b);
  check_2d("c", c);
  const std::int64_t m = transpose_a ? a.size(1) : a.size(0);
  const std::int64_t k = transpose_a ? a.size(0) : a.size(1);
  const std::int64_t kb = transpose_b ? b.size(1) : b.size(0);
  const std::int64_t n = transpose_b ? b.size(0) : b.size(1);
  TL_CHECK(k == kb, ShapeError,
           "matmul: a is " << typed_shape(a) << " (op(a) " << m << "x" << k << ") but b is "
                           << typed_shape(b) << " (op(b) " << kb << "x" << n
                           << "): inner dimensions " << k << " and " << kb << " differ");
  TL_CHECK(c.size(0) == m && c.size(1) == n, ShapeError,
           "matmul: c is " << typed_shape(c) << " but op(a)*op(b) is " << m << "x" << n << " (a "
                           << typed_shape(a) << (transpose_a ? " transposed" : "") << ", b "
                           << typed_shape(b) << (transpose_b ? " transposed" : "") << ")");
  TL_CHECK(!overlaps(c, a) && !overlaps(c, b), InvalidArgument,
           "matmul: c " << typed_shape(c) << " overlaps " << (overlaps(c, a) ? "a" : "b")
                        << " in memory; write the product to a separate tensor");
  if (stream.device().is_cuda()) kernels::check_float32("matmul", "c", c);
  if (m == 0 || n == 0) return;

  const std::int64_t lda = a.size(1), ldb = b.size(1), ldc = c.size(1);
  // The host's GEMM runs in c's dtype (float64 for the gradient checks).
  const auto host_gemm = [&]<typename T>() {
    cpu::gemm<T>(transpose_a, transpose_b, m, n, k, alpha, a.data<T>(), lda, b.data<T>(), ldb, beta,
                 c.data<T>(), ldc);
  };
  TL_DISPATCH(stream, cpu::with_dtype(c.dtype(), host_gemm),
              cuda::gemm(transpose_a, transpose_b, m, n, k, alpha, a.data<float>(), lda,
                         b.data<float>(), ldb, beta, c.data<float>(), ldc, stream));
}

}  // namespace towerlab
