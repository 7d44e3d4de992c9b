// Checks and backend dispatch for matmul (kernels/matmul.h).
#include "kernels/matmul.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/checks.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_tc.h"
#include "kernels/matmul_operands.h"

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

// The 16-bit product's operands (kernels/matmul.h): defined, on the stream's
// device, a and b both bfloat16 or both float16, c float32 or their dtype.
// check_on_stream's counterpart, which refuses every 16-bit tensor.
void check_16bit_operands(const Stream& stream, const Tensor& c, const Tensor& a, const Tensor& b) {
  for (const auto& [name, t] : {std::pair{"c", &c}, std::pair{"a", &a}, std::pair{"b", &b}}) {
    TL_CHECK(t->defined(), InvalidArgument, "matmul: " << name << " is undefined");
    TL_CHECK(t->device() == stream.device(), InvalidArgument,
             "matmul: " << name << " is " << t->describe() << " but the stream is on "
                        << stream.device().str());
  }
  const bool inputs_ok = is_16bit(a.dtype()) && b.dtype() == a.dtype();
  const bool output_ok = c.dtype() == DType::Float32 || c.dtype() == a.dtype();
  TL_CHECK(inputs_ok && output_ok, NotSupported,
           "matmul: a " << dtype_name(a.dtype()) << ", b " << dtype_name(b.dtype()) << ", c "
                        << dtype_name(c.dtype())
                        << " is not a supported combination (a and b both bfloat16 or both "
                           "float16, c float32 or their dtype; a is "
                        << a.describe() << ", b " << b.describe() << ", c " << c.describe()
                        << "; cast() converts)");
}

// The CPU's 16-bit GEMM, its input and output types chosen from the dtypes.
template <typename In>
void host_gemm_16bit(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a,
                     bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                     float beta) {
  const std::int64_t lda = a.size(1), ldb = b.size(1), ldc = c.size(1);
  if (c.dtype() == DType::Float32) {
    cpu::gemm_mixed(transpose_a, transpose_b, m, n, k, alpha, a.data<In>(), lda, b.data<In>(), ldb,
                    beta, c.data<float>(), ldc);
  } else {
    cpu::gemm_mixed(transpose_a, transpose_b, m, n, k, alpha, a.data<In>(), lda, b.data<In>(), ldb,
                    beta, c.data<In>(), ldc);
  }
}

}  // namespace

namespace kernels {

void check_matmul_operands(const Stream& stream, const Tensor& c, const Tensor& a,
                           const Tensor& b) {
  if (is_16bit(a.dtype()) || is_16bit(b.dtype()) || is_16bit(c.dtype())) {
    check_16bit_operands(stream, c, a, b);
  } else {
    check_on_stream("matmul", stream, {{"c", &c}, {"a", &a}, {"b", &b}});
  }
}

}  // namespace kernels

void set_gemm_backend(GemmBackend backend) {
  g_gemm_backend.store(backend);
}
GemmBackend gemm_backend() {
  return g_gemm_backend.load();
}

void matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
            float alpha, float beta, const Stream& stream, Float32Math math) {
  const bool low_precision = is_16bit(a.dtype()) || is_16bit(b.dtype()) || is_16bit(c.dtype());
  kernels::check_matmul_operands(stream, c, a, b);
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
  TL_CHECK(!kernels::overlap(c, a) && !kernels::overlap(c, b), InvalidArgument,
           "matmul: c " << typed_shape(c) << " overlaps " << (kernels::overlap(c, a) ? "a" : "b")
                        << " in memory; write the product to a separate tensor");
  if (stream.device().is_cuda() && !low_precision) kernels::check_float32("matmul", "c", c);
  if (m == 0 || n == 0) return;
  if (low_precision) {  // the CPU's 16-bit GEMMs, or CUDA's tensor cores
    const auto host = [&] {
      if (a.dtype() == DType::BFloat16) {
        host_gemm_16bit<bfloat16>(c, a, b, transpose_a, transpose_b, m, n, k, alpha, beta);
      } else {
        host_gemm_16bit<float16>(c, a, b, transpose_a, transpose_b, m, n, k, alpha, beta);
      }
    };
    TL_DISPATCH(stream, host(),
                cuda::gemm_16bit(c, a, b, transpose_a, transpose_b, alpha, beta, stream));
    return;
  }

  // TF32 on CUDA's tensor cores; the CPU has no TF32 arithmetic and computes in float32.
  if (math == Float32Math::Tf32 && stream.device().is_cuda()) {
    TL_ON_CUDA(cuda::gemm_tf32(c, a, b, transpose_a, transpose_b, alpha, beta, stream));
    return;
  }
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
