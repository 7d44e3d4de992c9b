// CPU elementwise kernels: the plain reference (kernels/reference/elementwise.h)
// on each thread's range. Element i depends on element i alone, so the loops split
// over the thread pool at any boundary (kernels/cpu/parallel.h).
#include "kernels/cpu/elementwise.h"

#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/elementwise.h"

namespace towerlab::cpu {

void fill(const Tensor& x, double value) {
  with_dtype(x.dtype(), [&]<typename T>() {
    T* p = x.data<T>();  // [n]
    const auto v = static_cast<T>(value);
    parallel_rows(x.numel(), 1,
                  [&](std::int64_t lo, std::int64_t hi) { reference::fill(p + lo, v, hi - lo); });
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  with_dtype(dst.dtype(), [&]<typename D>() {
    with_dtype(src.dtype(), [&]<typename S>() {
      D* out = dst.data<D>();       // [n]
      const S* in = src.data<S>();  // [n]
      parallel_rows(dst.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
        reference::copy(out + lo, in + lo, hi - lo);
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
          reference::add(o + lo, x + lo, y + lo, hi - lo);
          break;
        case BinaryOp::Sub:
          reference::sub(o + lo, x + lo, y + lo, hi - lo);
          break;
        case BinaryOp::Mul:
          reference::mul(o + lo, x + lo, y + lo, hi - lo);
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
      reference::scale(o + lo, in + lo, a, hi - lo);
    });
  });
}

void axpy(const Tensor& y, double alpha, const Tensor& x) {
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    const auto a = static_cast<T>(alpha);
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::axpy(out + lo, a, in + lo, hi - lo);
    });
  });
}

void axpy_scalar(const Tensor& y, double alpha, const Tensor& s) {
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();  // [n]
    const T v = static_cast<T>(alpha) * s.data<T>()[0];
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::add_scalar(out + lo, v, hi - lo);
    });
  });
}

}  // namespace towerlab::cpu
