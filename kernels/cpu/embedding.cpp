// CPU embedding. The forward is the reference (kernels/reference/embedding.h) on
// each thread's range of ids. The backward lists each table row's ids in index
// order first (a stable counting sort, one sequential pass over the ids), then
// each thread adds the rows of grad_y of its range of table rows, each row's in
// that order: the reference's additions in the reference's order, so its bits,
// in O(M + V) bookkeeping instead of the reference's scan of every id per range.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cpu/embedding.h"

#include <vector>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/embedding.h"

namespace towerlab::cpu {

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& table) {
  const std::int64_t cols = table.size(1);
  with_dtype(table.dtype(), [&]<typename T>() {
    T* out = y.data<T>();             // [M, D]
    const T* id = ids.data<T>();      // [M]
    const T* rows = table.data<T>();  // [V, D]
    parallel_rows(ids.numel(), cols, [&](std::int64_t lo, std::int64_t hi) {
      reference::embedding_forward(out, id, rows, lo, hi, cols);
    });
  });
}

void embedding_backward(const Tensor& grad_table, const Tensor& grad_y, const Tensor& ids,
                        GradWrite write) {
  const std::int64_t rows = grad_table.size(0);
  const std::int64_t cols = grad_table.size(1);
  const std::int64_t count = ids.numel();
  with_dtype(grad_table.dtype(), [&]<typename T>() {
    T* grad = grad_table.data<T>();  // [V, D]
    const T* gy = grad_y.data<T>();  // [M, D]
    const T* id = ids.data<T>();     // [M]
    // first[v] .. first[v + 1]: where row v's ids sit in `order`, in index order.
    std::vector<std::int64_t> first(static_cast<std::size_t>(rows) + 1, 0);
    for (std::int64_t m = 0; m < count; ++m) ++first[static_cast<std::size_t>(id[m]) + 1];
    for (std::int64_t v = 0; v < rows; ++v) first[v + 1] += first[v];
    std::vector<std::int64_t> order(static_cast<std::size_t>(count));
    std::vector<std::int64_t> next(first.begin(), first.end() - 1);
    for (std::int64_t m = 0; m < count; ++m) order[next[static_cast<std::size_t>(id[m])]++] = m;
    parallel_rows(rows, cols, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t v = lo; v < hi; ++v) {
        T* row = grad + v * cols;  // [D]
        if (write == GradWrite::Assign) {
          for (std::int64_t j = 0; j < cols; ++j) row[j] = T(0);
        }
        for (std::int64_t k = first[v]; k < first[v + 1]; ++k) {
          const T* g = gy + order[k] * cols;  // [D]
          for (std::int64_t j = 0; j < cols; ++j) row[j] += g[j];
        }
      }
    });
  });
}

std::int64_t first_invalid_id(const Tensor& ids, std::int64_t rows) {
  std::int64_t bad = -1;
  with_dtype(ids.dtype(), [&]<typename T>() {
    bad = reference::first_invalid_id(ids.data<T>(), ids.numel(), rows);
  });
  return bad;
}

}  // namespace towerlab::cpu
