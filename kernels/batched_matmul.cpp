// Checks and the per-entry products of batched_matmul (kernels/batched_matmul.h):
// on the CPU, the operands checked once as matmul checks them and the whole batch
// handed to the host GEMM on raw pointers (cpu::gemm_batched, which spreads the
// entries over the threads); on CUDA, matmul on views of the entries.
#include "kernels/batched_matmul.h"

#include <algorithm>
#include <string>

#include "kernels/checks.h"
#include "kernels/cpu/matmul.h"
#include "kernels/matmul.h"
#include "kernels/matmul_operands.h"

namespace towerlab {

namespace {

// "a float32[2,3,4] (transposed), b float32[4,5], c float32[2,3,5]": the operands as
// every message names them.
std::string operands(const Tensor& a, const Tensor& b, const Tensor& c, bool transpose_a,
                     bool transpose_b) {
  auto one = [](const Tensor& t) { return std::string(dtype_name(t.dtype())) + t.shape_str(); };
  return "a " + one(a) + (transpose_a ? " (transposed)" : "") + ", b " + one(b) +
         (transpose_b ? " (transposed)" : "") + ", c " + one(c);
}

// An entry of x: x itself when x is 2-D (shared), else matrix i of x [B, rows, cols].
Tensor entry(const Tensor& x, std::int64_t i) {
  if (x.dim() == 2) return x;
  const std::int64_t rows = x.size(1), cols = x.size(2);
  return x.view(i * rows * cols, {rows, cols});
}

// The CPU's products: c, a and b as the pointers and strides of cpu::gemm_batched
// (a 2-D operand shared, stride 0; a 2-D c the sum, stride 0).
template <typename In, typename Out>
void host_products(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a,
                   bool transpose_b, std::int64_t batch, std::int64_t m, std::int64_t n,
                   std::int64_t k, float alpha, float beta) {
  const auto stride = [](const Tensor& x) { return x.dim() == 2 ? 0 : x.size(1) * x.size(2); };
  cpu::gemm_batched(transpose_a, transpose_b, batch, m, n, k, alpha, a.data<In>(), stride(a),
                    b.data<In>(), stride(b), beta, c.data<Out>(), stride(c));
}

}  // namespace

void batched_matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool transpose_a,
                    bool transpose_b, float alpha, float beta, const Stream& stream,
                    Float32Math math) {
  for (const auto& [name, t] : {std::pair{"a", &a}, std::pair{"b", &b}, std::pair{"c", &c}}) {
    TL_CHECK(t->defined(), InvalidArgument, "batched_matmul: " << name << " is undefined");
  }
  const std::string what = operands(a, b, c, transpose_a, transpose_b);
  const auto rank_ok = [](const Tensor& t) { return t.dim() == 2 || t.dim() == 3; };
  TL_CHECK(rank_ok(a) && rank_ok(b) && rank_ok(c), ShapeError,
           "batched_matmul: " << what << ": each must be 3-D [B, rows, cols] or 2-D");
  const bool summed = c.dim() == 2;
  TL_CHECK(
      summed ? a.dim() == 3 && b.dim() == 3 : a.dim() == 3 || b.dim() == 3, ShapeError,
      "batched_matmul: " << what
                         << (summed ? ": a 2-D c is the sum over the batch, which needs a and b 3-D"
                                    : ": a 3-D c needs a or b 3-D (two matrices are matmul's)"));
  const std::int64_t batch = a.dim() == 3 ? a.size(0) : b.size(0);
  TL_CHECK((a.dim() == 2 || a.size(0) == batch) && (b.dim() == 2 || b.size(0) == batch) &&
               (summed || c.size(0) == batch),
           ShapeError, "batched_matmul: " << what << ": batch sizes differ");
  const std::int64_t m = a.size(transpose_a ? -1 : -2), ka = a.size(transpose_a ? -2 : -1);
  const std::int64_t kb = b.size(transpose_b ? -1 : -2), n = b.size(transpose_b ? -2 : -1);
  TL_CHECK(ka == kb, ShapeError,
           "batched_matmul: " << what << ": inner dimensions " << ka << " and " << kb << " differ");
  TL_CHECK(c.size(-2) == m && c.size(-1) == n, ShapeError,
           "batched_matmul: " << what << ": c must be " << (summed ? "" : "[B,") << m << "x" << n
                              << (summed ? "" : "]"));
  TL_CHECK(!kernels::overlap(c, a) && !kernels::overlap(c, b), InvalidArgument,
           "batched_matmul: " << what << ": c overlaps an operand in memory");
  TL_CHECK(!(summed && is_16bit(c.dtype())), NotSupported,
           "batched_matmul: " << what << ": the sum over the batch takes a float32 or float64 c");
  if (stream.device().is_cpu()) {
    // One check and one dispatch for the batch: per entry, the checks, three views
    // and the dispatch cost a noticeable share of a small product (an attention
    // head's). The CPU has no TF32 arithmetic: math changes nothing here, as in matmul.
    kernels::check_matmul_operands(stream, c, a, b);
    const auto run = [&]<typename In, typename Out>() {
      host_products<In, Out>(c, a, b, transpose_a, transpose_b, batch, m, n, ka, alpha, beta);
    };
    const bool float32_c = c.dtype() == DType::Float32;
    switch (a.dtype()) {
      case DType::BFloat16:
        float32_c ? run.operator()<bfloat16, float>() : run.operator()<bfloat16, bfloat16>();
        return;
      case DType::Float16:
        float32_c ? run.operator()<float16, float>() : run.operator()<float16, float16>();
        return;
      case DType::Float64:
        run.operator()<double, double>();
        return;
      default:
        run.operator()<float, float>();
        return;
    }
  }
  if (summed) {
    if (batch == 0) {  // an empty sum: matmul with K = 0 sets C = beta C
      const Tensor none_a = a.view(0, transpose_a ? Shape{0, m} : Shape{m, 0});
      const Tensor none_b = b.view(0, transpose_b ? Shape{n, 0} : Shape{0, n});
      matmul(c, none_a, none_b, transpose_a, transpose_b, alpha, beta, stream, math);
    }
    for (std::int64_t i = 0; i < batch; ++i) {
      matmul(c, entry(a, i), entry(b, i), transpose_a, transpose_b, alpha, i == 0 ? beta : 1.0f,
             stream, math);
    }
    return;
  }
  // One launch per entry on the stream, in order.
  for (std::int64_t i = 0; i < batch; ++i) {
    matmul(entry(c, i), entry(a, i), entry(b, i), transpose_a, transpose_b, alpha, beta, stream,
           math);
  }
}

}  // namespace towerlab
