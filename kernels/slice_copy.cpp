// Checks, the block's layout and backend dispatch for slice copy
// (kernels/slice_copy.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/slice_copy.h"

#include "kernels/checks.h"
#include "kernels/cpu/slice_copy.h"
#include "kernels/cuda/slice_copy.h"

namespace towerlab {

std::int64_t resolve_dim(const char* op, std::int64_t dim, const Shape& shape) {
  const auto rank = static_cast<std::int64_t>(shape.size());
  const std::int64_t d = dim < 0 ? dim + rank : dim;
  TL_CHECK(d >= 0 && d < rank, InvalidArgument,
           op << ": dimension " << dim << " is out of range for " << to_string(shape) << " (rank "
              << rank << ": expected " << -rank << ".." << rank - 1 << ")");
  return d;
}

void slice_copy(const Tensor& dst, std::int64_t dst_begin, const Tensor& src,
                std::int64_t src_begin, std::int64_t length, std::int64_t dim, GradWrite write,
                const Stream& stream) {
  const char* op = "slice_copy";
  kernels::check_placed(op, stream, {{"dst", &dst}, {"src", &src}});
  const std::int64_t d = resolve_dim(op, dim, dst.shape());
  bool agree = dst.dim() == src.dim();
  for (std::int64_t k = 0; agree && k < dst.dim(); ++k) {
    agree = k == d || dst.size(k) == src.size(k);
  }
  TL_CHECK(agree, ShapeError,
           op << ": dst " << dst.describe() << " and src " << src.describe()
              << " must have one rank and agree in every dimension but " << d);
  const std::int64_t m = dst.size(d), n = src.size(d);
  TL_CHECK(length >= 0 && dst_begin >= 0 && src_begin >= 0 && dst_begin + length <= m &&
               src_begin + length <= n,
           InvalidArgument,
           op << ": entries [" << src_begin << ", " << src_begin + length << ") of src "
              << src.describe() << " into [" << dst_begin << ", " << dst_begin + length
              << ") of dst " << dst.describe() << " along dimension " << d
              << " do not lie inside both");
  TL_CHECK(!kernels::overlap(dst, src), InvalidArgument,
           op << ": dst " << dst.describe() << " overlaps src in memory");
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t k = 0; k < d; ++k) outer *= dst.size(k);
  for (std::int64_t k = d + 1; k < dst.dim(); ++k) inner *= dst.size(k);
  const SliceCopyPlan plan{outer,     length * inner,   m * inner, dst_begin * inner,
                           n * inner, src_begin * inner};
  if (plan.outer == 0 || plan.run == 0) return;
  TL_DISPATCH(stream, cpu::slice_copy(dst, src, plan, write),
              cuda::slice_copy(dst, src, plan, write, stream));
}

}  // namespace towerlab
