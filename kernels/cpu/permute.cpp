// CPU permute (contract in kernels/permute.h) on the merged layout
// (kernels/permute_plan.h), in one of two shapes:
//   - x contiguous along y's last dimension (the permutation keeps the last
//     dimension): y is rows of that length, each one contiguous run of x, copied
//     whole (memcpy when assigned);
//   - otherwise x is contiguous along another of y's dimensions, q: y is moved in
//     kTile x kTile tiles of (q, last), whose reads (along q in x) and writes (along
//     the last dimension in y) each touch kTile cache lines that stay in L1 for the
//     tile, instead of one new line of x for every element written.
// Rows or tile strips are spread over the thread pool (kernels/cpu/parallel.h); each
// element is written once, by one thread, so the result does not depend on the
// threads. The reference (kernels/reference/permute.h) is the specification.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cpu/permute.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/move_element.h"

namespace towerlab::cpu {

namespace {

constexpr std::int64_t kTile = 32;

// The offsets in y and x of outer index o: o taken row-major over y's dimensions
// other than skip_a and skip_b.
struct Offsets {
  std::int64_t y = 0, x = 0;
};
Offsets outer_offsets(const PermutePlan& plan, const std::int64_t* y_stride, std::int64_t o,
                      int skip_a, int skip_b) {
  Offsets at;
  for (int k = plan.rank - 1; k >= 0; --k) {
    if (k == skip_a || k == skip_b) continue;
    const std::int64_t i = o % plan.shape[k];
    o /= plan.shape[k];
    at.y += i * y_stride[k];
    at.x += i * plan.x_stride[k];
  }
  return at;
}

// y's rows are consecutive (row r starts at r * length); x's start of row r+1 follows
// from row r's by an odometer over the outer dimensions (one add, a carry now and
// then), rather than a division per dimension for every row: a multi-head split's
// rows are a few dozen values each, and the divisions cost more than the copy.
template <typename T>
void permute_rows(T* y, const T* x, const PermutePlan& plan, const std::int64_t* y_stride,
                  bool accumulate) {
  const int last = plan.rank - 1;
  const std::int64_t length = plan.shape[last];  // [rows, length]
  parallel_rows(plan.numel / length, length, [&](std::int64_t lo, std::int64_t hi) {
    std::int64_t index[kMaxPermuteRank] = {};  // row lo's index along y's dimensions < last
    for (std::int64_t k = last - 1, o = lo; k >= 0; --k) {
      index[k] = o % plan.shape[k];
      o /= plan.shape[k];
    }
    std::int64_t x_at = outer_offsets(plan, y_stride, lo, last, last).x;
    for (std::int64_t r = lo; r < hi; ++r) {
      T* out = y + r * length;
      const T* in = x + x_at;
      if (!accumulate) {
        std::memcpy(out, in, static_cast<std::size_t>(length) * sizeof(T));
      } else {
        for (std::int64_t j = 0; j < length; ++j) move_element(out[j], in[j], true);
      }
      for (int k = last - 1; k >= 0; --k) {  // the next row's index and offset in x
        x_at += plan.x_stride[k];
        if (++index[k] < plan.shape[k]) break;
        x_at -= plan.x_stride[k] * plan.shape[k];
        index[k] = 0;
      }
    }
  });
}

template <typename T>
void permute_tiles(T* y, const T* x, const PermutePlan& plan, const std::int64_t* y_stride, int q,
                   bool accumulate) {
  const int last = plan.rank - 1;
  const std::int64_t rows = plan.shape[q], cols = plan.shape[last];
  const std::int64_t x_col_stride = plan.x_stride[last], y_row_stride = y_stride[q];
  const std::int64_t row_tiles = (rows + kTile - 1) / kTile;
  const std::int64_t outer = plan.numel / (rows * cols);
  // A work item is one strip of kTile rows (along q) and every column of one outer index.
  parallel_rows(outer * row_tiles, kTile * cols, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t w = lo; w < hi; ++w) {
      const Offsets at = outer_offsets(plan, y_stride, w / row_tiles, q, last);
      const std::int64_t i0 = w % row_tiles * kTile, i1 = std::min(rows, i0 + kTile);
      for (std::int64_t j0 = 0; j0 < cols; j0 += kTile) {
        const std::int64_t j1 = std::min(cols, j0 + kTile);
        for (std::int64_t i = i0; i < i1; ++i) {
          T* out = y + at.y + i * y_row_stride;  // contiguous along j
          const T* in = x + at.x + i;            // x is contiguous along q
          for (std::int64_t j = j0; j < j1; ++j) {
            move_element(out[j], in[j * x_col_stride], accumulate);
          }
        }
      }
    }
  });
}

}  // namespace

void permute(const Tensor& y, const Tensor& x, const PermutePlan& plan, GradWrite write) {
  const bool accumulate = write == GradWrite::Accumulate;
  with_any_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // y's merged shape
    const T* in = x.data<T>();  // x, strides plan.x_stride along y's dimensions
    if (plan.rank == 0) {       // one element
      move_element(out[0], in[0], accumulate);
      return;
    }
    std::int64_t y_stride[kMaxPermuteRank];
    for (int k = 0; k < plan.rank; ++k) y_stride[k] = plan.y_stride(k);
    const int q = plan.x_contiguous_dim();
    if (q == plan.rank - 1) {
      permute_rows(out, in, plan, y_stride, accumulate);
    } else {
      permute_tiles(out, in, plan, y_stride, q, accumulate);
    }
  });
}

}  // namespace towerlab::cpu
