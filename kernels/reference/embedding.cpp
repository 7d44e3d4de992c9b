// Embedding's plain reference (contracts in kernels/reference/embedding.h).
#include "kernels/reference/embedding.h"

namespace towerlab::reference {

template <typename T>
std::int64_t first_invalid_id(const T* ids, std::int64_t count, std::int64_t rows) {
  for (std::int64_t m = 0; m < count; ++m) {
    if (!is_row_id(ids[m], rows)) return m;
  }
  return -1;
}

template <typename T>
void embedding_forward(T* y, const T* ids, const T* table, std::int64_t first, std::int64_t last,
                       std::int64_t cols) {
  for (std::int64_t m = first; m < last; ++m) {
    const T* row = table + static_cast<std::int64_t>(ids[m]) * cols;  // [D]
    T* out = y + m * cols;                                            // [D]
    for (std::int64_t j = 0; j < cols; ++j) out[j] = row[j];
  }
}

template <typename T>
void embedding_backward(T* grad_table, const T* grad_y, const T* ids, std::int64_t count,
                        std::int64_t cols, std::int64_t first_row, std::int64_t last_row,
                        GradWrite write) {
  if (write == GradWrite::Assign) {
    for (std::int64_t i = first_row * cols; i < last_row * cols; ++i) grad_table[i] = T(0);
  }
  for (std::int64_t m = 0; m < count; ++m) {
    const auto v = static_cast<std::int64_t>(ids[m]);
    if (v < first_row || v >= last_row) continue;
    T* row = grad_table + v * cols;   // [D]
    const T* gy = grad_y + m * cols;  // [D]
    for (std::int64_t j = 0; j < cols; ++j) row[j] += gy[j];
  }
}

template std::int64_t first_invalid_id<float>(const float*, std::int64_t, std::int64_t);
template std::int64_t first_invalid_id<double>(const double*, std::int64_t, std::int64_t);
template void embedding_forward<float>(float*, const float*, const float*, std::int64_t,
                                       std::int64_t, std::int64_t);
template void embedding_forward<double>(double*, const double*, const double*, std::int64_t,
                                        std::int64_t, std::int64_t);
template void embedding_backward<float>(float*, const float*, const float*, std::int64_t,
                                        std::int64_t, std::int64_t, std::int64_t, GradWrite);
template void embedding_backward<double>(double*, const double*, const double*, std::int64_t,
                                         std::int64_t, std::int64_t, std::int64_t, GradWrite);

}  // namespace towerlab::reference
