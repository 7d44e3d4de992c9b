// The reductions' plain reference (contracts in kernels/reference/reduce.h).
#include "kernels/reference/reduce.h"

namespace towerlab::reference {

template <typename T>
double sum(const T* x, std::int64_t n) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(x[i]);
  return total;
}

template <typename T>
double sum_squares(const T* x, std::int64_t n) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i)
    total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return total;
}

template double sum<float>(const float*, std::int64_t);
template double sum<double>(const double*, std::int64_t);
template double sum_squares<float>(const float*, std::int64_t);
template double sum_squares<double>(const double*, std::int64_t);

}  // namespace towerlab::reference
