// CPU elementwise kernels: the specification the CUDA kernels are tested against.
// Plain loops over n elements, which the compiler vectorizes. Element i depends on
// element i alone, so the loops split over the thread pool at any boundary
// (kernels/cpu/parallel.h).
#include "kernels/cpu/elementwise.h"

#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"

namespace towerlab::cpu {

void fill(const Tensor& x, double value) {
  with_dtype(x.dtype(), [&]<typename T>() {
    T* p = x.data<T>();  // [n]
    const auto v = static_cast<T>(value);
    parallel_rows(x.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) p[i] = v;
    });
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  with_dtype(dst.dtype(), [&]<typename D>() {
    with_dtype(src.dtype(), [&]<typename S>() {
      D* out = dst.data<D>();       // [n]
      const S* in = src.data<S>();  // [n]
      parallel_rows(dst.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t i = lo; i < hi; ++i) out[i] = static_cast<D>(in[i]);
      });
    });
  });
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  with_dtype(out.dtype(), [&]<typename T>() {
    T* o = out.data<T>();      // [n]
    const T* x = a.data<T>();  // [n]
    const T* y = b.data<T>();  // [n]
    parallel_rows(out.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      switch (op) {
        case BinaryOp::Add:
          for (std::int64_t i = lo; i < hi; ++i) o[i] = x[i] + y[i];
          break;
        case BinaryOp::Sub:
          for (std::int64_t i = lo; i < hi; ++i) o[i] = x[i] - y[i];
          break;
        case BinaryOp::Mul:
          for (std::int64_t i = lo; i < hi; ++i) o[i] = x[i] * y[i];
          break;
      }
    });
  });
}

void scale(const Tensor& out, const Tensor& x, double alpha) {
  with_dtype(out.dtype(), [&]<typename T>() {
    T* o = out.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    const auto a = static_cast<T>(alpha);
    parallel_rows(out.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) o[i] = a * in[i];
    });
  });
}

void axpy(const Tensor& y, double alpha, const Tensor& x) {
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    const auto a = static_cast<T>(alpha);
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) out[i] += a * in[i];
    });
  });
}

void axpy_scalar(const Tensor& y, double alpha, const Tensor& s) {
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();  // [n]
    const T v = static_cast<T>(alpha) * s.data<T>()[0];
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) out[i] += v;
    });
  });
}

}  // namespace towerlab::cpu
