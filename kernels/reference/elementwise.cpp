// The elementwise kernels' plain reference (contracts in
// kernels/reference/elementwise.h): one loop each, which the compiler vectorizes.
#include "kernels/reference/elementwise.h"

namespace towerlab::reference {

template <typename T>
void fill(T* x, T value, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = value;
}

template <typename D, typename S>
void copy(D* dst, const S* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<D>(src[i]);
}

template <typename T>
void add(T* out, const T* a, const T* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void sub(T* out, const T* a, const T* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
}

template <typename T>
void mul(T* out, const T* a, const T* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

template <typename T>
void scale(T* out, const T* x, T alpha, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = alpha * x[i];
}

template <typename T>
void axpy(T* y, T alpha, const T* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template <typename T>
void add_scalar(T* y, T v, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += v;
}

#define TL_ELEMENTWISE(T)                                         \
  template void fill<T>(T*, T, std::int64_t);                     \
  template void copy<T, float>(T*, const float*, std::int64_t);   \
  template void copy<T, double>(T*, const double*, std::int64_t); \
  template void add<T>(T*, const T*, const T*, std::int64_t);     \
  template void sub<T>(T*, const T*, const T*, std::int64_t);     \
  template void mul<T>(T*, const T*, const T*, std::int64_t);     \
  template void scale<T>(T*, const T*, T, std::int64_t);          \
  template void axpy<T>(T*, T, const T*, std::int64_t);           \
  template void add_scalar<T>(T*, T, std::int64_t);
TL_ELEMENTWISE(float)
TL_ELEMENTWISE(double)
#undef TL_ELEMENTWISE

}  // namespace towerlab::reference
