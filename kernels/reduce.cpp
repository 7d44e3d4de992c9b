// Checks and backend dispatch for the reductions (kernels/reduce.h).
#include "kernels/reduce.h"

#include "kernels/checks.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"

namespace towerlab {

namespace {

void check_reduction(const char* op, const Tensor& out, const Tensor& x, const Stream& stream) {
  kernels::check_on_stream(op, stream, {{"out", &out}, {"x", &x}});
  TL_CHECK(out.numel() == 1, ShapeError,
           op << ": out must have one element, got " << out.describe());
}

void reduce(const char* op, const Tensor& out, const Tensor& x, bool average,
            const Stream& stream) {
  check_reduction(op, out, x, stream);
  const double scale = average && x.numel() > 0 ? 1.0 / static_cast<double>(x.numel()) : 1.0;
  TL_DISPATCH(stream, cpu::sum(out, x, scale),
              cuda::sum(out, x, static_cast<float>(scale), stream));
}

}  // namespace

void sum(const Tensor& out, const Tensor& x, const Stream& stream) {
  reduce("sum", out, x, false, stream);
}

void mean(const Tensor& out, const Tensor& x, const Stream& stream) {
  reduce("mean", out, x, true, stream);
}

void sum_squares(const Tensor& out, const Tensor& x, const Stream& stream) {
  check_reduction("sum_squares", out, x, stream);
  TL_CHECK(stream.device().is_cpu() || x.dtype() == DType::Float32, NotSupported,
           "sum_squares: CUDA tensors are float32, got " << x.describe());
  TL_DISPATCH(stream, cpu::sum_squares(out, x), cuda::sum_squares(out, x, stream));
}

std::int64_t first_nonfinite(const Tensor& x, const Stream& stream) {
  kernels::check_on_stream("first_nonfinite", stream, {{"x", &x}});
  if (stream.device().is_cpu()) return cpu::first_nonfinite(x);
  TL_CHECK(x.dtype() == DType::Float32, NotSupported,
           "first_nonfinite: CUDA tensors are float32, got " << x.describe());
  std::int64_t first = -1;
  TL_ON_CUDA(first = cuda::first_nonfinite(x, stream));
  return first;
}

}  // namespace towerlab
