// Broadcasting's plain reference (contracts in kernels/reference/broadcast.h).
#include "kernels/reference/broadcast.h"

#include <vector>

namespace towerlab::reference {

namespace {

// The row-major strides of `shape` aligned to `rank` dimensions (leading 1s), with
// 0 wherever the size is 1: a repeated dimension's index does not move the offset.
std::vector<std::int64_t> broadcast_strides(const Shape& shape, std::size_t rank) {
  std::vector<std::int64_t> strides(rank, 0);
  std::int64_t stride = 1;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    const std::size_t from_end = shape.size() - 1 - k;
    const std::int64_t size = shape[from_end];
    strides[rank - 1 - k] = size == 1 ? 0 : stride;
    stride *= size;
  }
  return strides;
}

// The offset of flat index i of `shape` through `strides` (one per dimension).
std::int64_t offset_of(std::int64_t i, const Shape& shape,
                       const std::vector<std::int64_t>& strides) {
  std::int64_t offset = 0;
  for (std::size_t d = shape.size(); d-- > 0;) {
    offset += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return offset;
}

}  // namespace

template <typename T>
void broadcast_binary(T* out, const Shape& out_shape, const T* a, const Shape& a_shape, const T* b,
                      const Shape& b_shape, BroadcastOp op, std::int64_t first, std::int64_t last) {
  const auto a_strides = broadcast_strides(a_shape, out_shape.size());
  const auto b_strides = broadcast_strides(b_shape, out_shape.size());
  for (std::int64_t i = first; i < last; ++i) {
    const T va = a[offset_of(i, out_shape, a_strides)];
    const T vb = b[offset_of(i, out_shape, b_strides)];
    out[i] = op == BroadcastOp::Add ? T(va + vb) : op == BroadcastOp::Sub ? T(va - vb) : T(va * vb);
  }
}

template <typename T>
void sum_to_shape(T* out, const Shape& out_shape, const T* x, const Shape& x_shape,
                  std::int64_t first, std::int64_t last, GradWrite write) {
  // x's dimensions split in two: those out keeps (out's index walks them) and those
  // it repeats (each out value sums over them), each with its stride in x.
  const std::size_t rank = x_shape.size();
  Shape aligned_out(rank - out_shape.size(), 1);
  aligned_out.insert(aligned_out.end(), out_shape.begin(), out_shape.end());
  const std::vector<std::int64_t> x_strides = broadcast_strides(x_shape, rank);
  Shape reduced;  // sizes of the repeated dimensions, in x's order
  std::vector<std::int64_t> reduced_strides, kept_strides(rank, 0);
  for (std::size_t d = 0; d < rank; ++d) {
    if (aligned_out[d] == 1 && x_shape[d] != 1) {
      reduced.push_back(x_shape[d]);
      reduced_strides.push_back(x_strides[d]);
    } else {
      kept_strides[d] = x_strides[d];
    }
  }
  const std::int64_t count = numel_of(reduced);
  for (std::int64_t o = first; o < last; ++o) {
    const std::int64_t base = offset_of(o, aligned_out, kept_strides);
    double sum = 0;
    for (std::int64_t r = 0; r < count; ++r)
      sum += double(x[base + offset_of(r, reduced, reduced_strides)]);
    out[o] = write == GradWrite::Assign ? static_cast<T>(sum) : static_cast<T>(out[o] + sum);
  }
}

template void broadcast_binary<float>(float*, const Shape&, const float*, const Shape&,
                                      const float*, const Shape&, BroadcastOp, std::int64_t,
                                      std::int64_t);
template void broadcast_binary<double>(double*, const Shape&, const double*, const Shape&,
                                       const double*, const Shape&, BroadcastOp, std::int64_t,
                                       std::int64_t);
template void sum_to_shape<float>(float*, const Shape&, const float*, const Shape&, std::int64_t,
                                  std::int64_t, GradWrite);
template void sum_to_shape<double>(double*, const Shape&, const double*, const Shape&, std::int64_t,
                                   std::int64_t, GradWrite);

}  // namespace towerlab::reference
