// The plain reference of the elementwise kernels (contracts in
// kernels/elementwise.h), on n values. The CPU backend runs it on each thread's
// range (kernels/cpu/elementwise.cpp); the CUDA kernels are tested against it. T
// (and D, S) are float or double; every output may alias any input.
#pragma once

#include <cstdint>

namespace towerlab::reference {

// x[i] = value; x [n].
template <typename T>
void fill(T* x, T value, std::int64_t n);

// dst[i] = src[i], converted to D; dst [n], src [n].
template <typename D, typename S>
void copy(D* dst, const S* src, std::int64_t n);

// out[i] = a[i] + b[i], a[i] - b[i], a[i] * b[i]; out, a, b [n].
template <typename T>
void add(T* out, const T* a, const T* b, std::int64_t n);
template <typename T>
void sub(T* out, const T* a, const T* b, std::int64_t n);
template <typename T>
void mul(T* out, const T* a, const T* b, std::int64_t n);

// out[i] = alpha * x[i]; out, x [n].
template <typename T>
void scale(T* out, const T* x, T alpha, std::int64_t n);

// y[i] += alpha * x[i] (ACCUMULATES); y, x [n].
template <typename T>
void axpy(T* y, T alpha, const T* x, std::int64_t n);

// y[i] += v (ACCUMULATES): axpy_scalar's broadcast, v = alpha * s[0]; y [n].
template <typename T>
void add_scalar(T* y, T v, std::int64_t n);

}  // namespace towerlab::reference
