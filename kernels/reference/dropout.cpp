// Dropout's plain reference (contracts in kernels/reference/dropout.h).
#include "kernels/reference/dropout.h"

#include "kernels/dropout_unit.h"

namespace towerlab::reference {

template <typename T>
T dropout_scale(double p) {
  return static_cast<T>(1.0 / (1.0 - p));
}

namespace {

// m(e): the kept element's scale or 0 (kernels/dropout.h).
template <typename T>
T multiplier(double p, T scale, std::uint64_t seed, std::uint64_t subsequence, std::uint64_t e) {
  return static_cast<double>(dropout_unit(seed, subsequence, e)) >= p ? scale : T(0);
}

}  // namespace

template <typename T>
void dropout_forward(T* y, const T* x, double p, std::uint64_t seed, std::uint64_t subsequence,
                     std::uint64_t first_element, std::int64_t n) {
  const T scale = dropout_scale<T>(p);
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = x[i] * multiplier(p, scale, seed, subsequence, first_element + i);
  }
}

template <typename T>
void dropout_backward(T* grad_x, const T* grad_y, double p, std::uint64_t seed,
                      std::uint64_t subsequence, std::uint64_t first_element, std::int64_t n,
                      GradWrite write) {
  const T scale = dropout_scale<T>(p);
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = grad_y[i] * multiplier(p, scale, seed, subsequence, first_element + i);
    grad_x[i] = write == GradWrite::Assign ? g : grad_x[i] + g;
  }
}

#define TL_DROPOUT(T)                                                                   \
  template T dropout_scale<T>(double);                                                  \
  template void dropout_forward<T>(T*, const T*, double, std::uint64_t, std::uint64_t,  \
                                   std::uint64_t, std::int64_t);                        \
  template void dropout_backward<T>(T*, const T*, double, std::uint64_t, std::uint64_t, \
                                    std::uint64_t, std::int64_t, GradWrite);
TL_DROPOUT(float)
TL_DROPOUT(double)
#undef TL_DROPOUT

}  // namespace towerlab::reference
