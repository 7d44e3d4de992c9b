// Permute's plain reference (contract in kernels/reference/permute.h).
#include "kernels/reference/permute.h"

#include "kernels/move_element.h"

namespace towerlab::reference {

template <typename T>
void permute(T* y, const T* x, const Shape& x_shape, const std::vector<std::int64_t>& dims,
             GradWrite write) {
  const std::size_t rank = x_shape.size();
  std::vector<std::int64_t> x_stride(rank, 1);  // row-major strides of x
  for (std::size_t d = rank; d-- > 1;) x_stride[d - 1] = x_stride[d] * x_shape[d];
  Shape y_shape(rank);
  for (std::size_t k = 0; k < rank; ++k) y_shape[k] = x_shape[static_cast<std::size_t>(dims[k])];
  const std::int64_t n = numel_of(y_shape);
  for (std::int64_t e = 0; e < n; ++e) {
    // y's index (i_0, ..., i_{R-1}) of element e, last dimension fastest; the
    // element of x at j with j[dims[k]] = i_k.
    std::int64_t rest = e, at = 0;
    for (std::size_t k = rank; k-- > 0;) {
      const std::int64_t i = rest % y_shape[k];
      rest /= y_shape[k];
      at += i * x_stride[static_cast<std::size_t>(dims[k])];
    }
    move_element(y[e], x[at], write == GradWrite::Accumulate);
  }
}

template void permute<float>(float*, const float*, const Shape&, const std::vector<std::int64_t>&,
                             GradWrite);
template void permute<double>(double*, const double*, const Shape&,
                              const std::vector<std::int64_t>&, GradWrite);
template void permute<bfloat16>(bfloat16*, const bfloat16*, const Shape&,
                                const std::vector<std::int64_t>&, GradWrite);
template void permute<float16>(float16*, const float16*, const Shape&,
                               const std::vector<std::int64_t>&, GradWrite);

}  // namespace towerlab::reference
