// Slice copy: the one strided copy behind concat, split and slice (autograd/ops.h),
// forward and backward.
//
// Dimensions: dst and src have one rank R >= 1 and the same size in every dimension
// but `dim` (which may count from the end: -1 is the last). Along dim, dst has m
// entries and src n; with O the product of the sizes before dim and I of those after,
// dst is [O, m, I] and src [O, n, I], and
//   slice_copy(dst, dst_begin, src, src_begin, length, dim, write)
//     dst[o, dst_begin + i, j] = (or +=) src[o, src_begin + i, j]
//     for o < O, i < length, j < I
// (assigned or added, kernels/grad_write.h). The rest of dst is not touched. A copy
// moves bits; accumulating adds (16-bit values in float32, rounded once).
//
// The ops it serves, each a call per piece:
//   concat  y = cat(x_0, ..., x_{k-1}) along dim, x_k at offset s_k = the sizes of
//           x_0 .. x_{k-1}: forward   y at s_k <- x_k whole
//                           backward  grad_x_k <- grad_y at s_k (assigned or added)
//   split   the pieces of x at offsets s_k: forward y_k <- x at s_k; backward: each
//           piece's gradient added into grad_x at s_k
//   slice   x[begin:end) along dim: one piece of a split; the backward adds into a
//           zero-filled grad_x, so the entries outside the slice get gradient 0.
//
// dtypes: every dtype the device holds (float32, bfloat16, float16; float64 on the
// CPU), one for both tensors. Aliasing: dst must not overlap src.
//
// Errors: a dim out of range, a negative length or begin, or a range past the end of
// either tensor are InvalidArgument; ranks that differ or sizes that differ outside
// dim are ShapeError; each names the op and both tensors.
#pragma once

#include <cstdint>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

void slice_copy(const Tensor& dst, std::int64_t dst_begin, const Tensor& src,
                std::int64_t src_begin, std::int64_t length, std::int64_t dim, GradWrite write,
                const Stream& stream);

// dim resolved against `rank` (negative counts from the end); InvalidArgument naming
// `op` and `shape` when out of range. Shared by the ops that take a dimension.
std::int64_t resolve_dim(const char* op, std::int64_t dim, const Shape& shape);

// The block a slice copy moves, in elements, as the backends read it: `outer` runs of
// `run` contiguous values, run o at o * dst_pitch + dst_offset in dst and
// o * src_pitch + src_offset in src. Built once by the dispatch (kernels/slice_copy.cpp).
struct SliceCopyPlan {
  std::int64_t outer, run;
  std::int64_t dst_pitch, dst_offset;
  std::int64_t src_pitch, src_offset;
};

}  // namespace towerlab
