// CPU depthwise conv2d (kernels/conv2d_depthwise.h has the formulas, kernels/conv2d.h
// the contract). Each loop is split over the thread pool by what it writes: the
// forward by output plane (n, k), the input gradient by input plane (n, c), the
// weight gradient by filter k. A value's sum runs in one thread in the header's
// order, so the bits do not depend on the thread count. Sums over taps accumulate in
// T; the weight gradient, a sum over the whole batch, in double.
#include <cstdint>

#include "kernels/conv2d_depthwise.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"

namespace towerlab::cpu {

namespace {

DepthwiseShape depthwise_of(const Conv2dShape& s) {
  return depthwise_shape(s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.P, s.Q, s.params);
}

}  // namespace

void conv2d_depthwise_forward(const Tensor& y, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, const Conv2dShape& shape) {
  const DepthwiseShape d = depthwise_of(shape);
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();                                    // [N,K,P,Q]
    const T* in = x.data<T>();                               // [N,C,H,W]
    const T* filters = weight.data<T>();                     // [K,R,S]
    const T* b = bias.defined() ? bias.data<T>() : nullptr;  // [K]
    parallel_rows(d.N * d.K, d.P * d.Q * d.R * d.S, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t plane = lo; plane < hi; ++plane) {
        const std::int64_t n = plane / d.K, k = plane % d.K;
        const T base = b != nullptr ? b[k] : T(0);
        T* row = out + plane * d.P * d.Q;
        for (std::int64_t p = 0; p < d.P; ++p) {
          for (std::int64_t q = 0; q < d.Q; ++q) {
            row[p * d.Q + q] = base + depthwise_output<T>(d, in, filters, n, k, p, q);
          }
        }
      }
    });
  });
}

void conv2d_depthwise_backward(const Tensor& grad_x, const Tensor& grad_weight,
                               const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                               const Conv2dShape& shape, GradWrite grad_x_write) {
  const DepthwiseShape d = depthwise_of(shape);
  with_dtype(grad_y.dtype(), [&]<typename T>() {
    const T* gy = grad_y.data<T>();  // [N,K,P,Q]
    if (grad_x.defined()) {
      T* gx = grad_x.data<T>();             // [N,C,H,W]
      const T* filters = weight.data<T>();  // [K,R,S]
      const bool assign = grad_x_write == GradWrite::Assign;
      parallel_rows(d.N * d.C, d.H * d.W * d.M * d.R * d.S, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t plane = lo; plane < hi; ++plane) {
          const std::int64_t n = plane / d.C, c = plane % d.C;
          T* row = gx + plane * d.H * d.W;
          for (std::int64_t h = 0; h < d.H; ++h) {
            for (std::int64_t w = 0; w < d.W; ++w) {
              const T sum = depthwise_grad_input<T>(d, gy, filters, n, c, h, w);
              row[h * d.W + w] = assign ? sum : row[h * d.W + w] + sum;
            }
          }
        }
      });
    }
    if (grad_weight.defined()) {
      T* gw = grad_weight.data<T>();  // [K,R,S]
      const T* in = x.data<T>();      // [N,C,H,W]
      const std::int64_t terms = d.N * d.P * d.Q;
      parallel_rows(d.K, terms * d.R * d.S, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t k = lo; k < hi; ++k) {
          for (std::int64_t r = 0; r < d.R; ++r) {
            for (std::int64_t s = 0; s < d.S; ++s) {
              double sum = 0.0;
              for (std::int64_t i = 0; i < terms; ++i) {
                sum += depthwise_weight_term<double>(d, gy, in, k, r, s, i);
              }
              T& out = gw[(k * d.R + r) * d.S + s];
              out = static_cast<T>(out + sum);
            }
          }
        }
      });
    }
  });
}

}  // namespace towerlab::cpu
