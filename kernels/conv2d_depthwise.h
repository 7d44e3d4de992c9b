// Depthwise conv2d (kernels/conv2d.h with groups G = C): what one output, one input
// gradient and one term of a weight gradient are, written once for the CPU kernels
// (kernels/cpu/conv2d_depthwise.cpp) and the CUDA kernels
// (kernels/cuda/conv2d_depthwise.cu), which differ only in how they spread these over
// threads. Host and device code; internal: not installed.
//
// Dimension letters as in kernels/conv2d.h, and M = K / C, the channel multiplier:
// output channel k reads input channel c(k) = k / M with its own filter.
//   x [N,C,H,W], weight [K,1,R,S] read as [K,R,S], y and grad_y [N,K,P,Q].
//   y[n,k,p,q]      = bias[k] + sum_{r,s} weight[k,r,s] * x[n,c(k),h(p,r),w(q,s)]
//   grad_x[n,c,h,w] = sum_{m<M, r,s : h(p,r)=h, w(q,s)=w} grad_y[n,c*M+m,p,q] * weight[c*M+m,r,s]
//   grad_weight[k,r,s] = sum_{n,p,q} grad_y[n,k,p,q] * x[n,c(k),h(p,r),w(q,s)]
// Every sum runs in the order its indices are written, taps in the padding skipped.
// The input gradient is gathered (each grad_x value from the outputs that read it),
// not scattered: one writer per value, no atomics, assign or accumulate alike.
#pragma once

#include <cstdint>

#include "../engine/host_device.h"
#include "conv2d.h"

namespace towerlab {

struct DepthwiseShape {
  std::int64_t N, C, H, W;
  std::int64_t K, M, R, S;
  std::int64_t P, Q;
  std::int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
};

inline DepthwiseShape depthwise_shape(std::int64_t N, std::int64_t C, std::int64_t H,
                                      std::int64_t W, std::int64_t K, std::int64_t R,
                                      std::int64_t S, std::int64_t P, std::int64_t Q,
                                      const Conv2dParams& p) {
  return {N, C,          H,          W,       K,       K / C,        R,           S, P,
          Q, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w};
}

// y[n,k,p,q] less its bias, accumulated in Acc.
template <typename Acc, typename T>
TL_HOST_DEVICE inline Acc depthwise_output(const DepthwiseShape& d, const T* x, const T* weight,
                                           std::int64_t n, std::int64_t k, std::int64_t p,
                                           std::int64_t q) {
  const T* plane = x + (n * d.C + k / d.M) * d.H * d.W;  // [H,W]
  const T* filter = weight + k * d.R * d.S;              // [R,S]
  Acc acc = 0;
  for (std::int64_t r = 0; r < d.R; ++r) {
    const std::int64_t h = p * d.stride_h - d.pad_h + r * d.dilation_h;
    if (h < 0 || h >= d.H) continue;
    for (std::int64_t s = 0; s < d.S; ++s) {
      const std::int64_t w = q * d.stride_w - d.pad_w + s * d.dilation_w;
      if (w < 0 || w >= d.W) continue;
      acc += Acc(filter[r * d.S + s]) * Acc(plane[h * d.W + w]);
    }
  }
  return acc;
}

// grad_x[n,c,h,w] (the sum, before it is assigned or added), accumulated in Acc. An
// output row p reads h through tap r when p*stride_h = h + pad_h - r*dilation_h.
template <typename Acc, typename T>
TL_HOST_DEVICE inline Acc depthwise_grad_input(const DepthwiseShape& d, const T* grad_y,
                                               const T* weight, std::int64_t n, std::int64_t c,
                                               std::int64_t h, std::int64_t w) {
  Acc acc = 0;
  for (std::int64_t m = 0; m < d.M; ++m) {
    const std::int64_t k = c * d.M + m;
    const T* plane = grad_y + (n * d.K + k) * d.P * d.Q;  // [P,Q]
    const T* filter = weight + k * d.R * d.S;             // [R,S]
    for (std::int64_t r = 0; r < d.R; ++r) {
      const std::int64_t ph = h + d.pad_h - r * d.dilation_h;
      if (ph < 0 || ph % d.stride_h != 0 || ph / d.stride_h >= d.P) continue;
      for (std::int64_t s = 0; s < d.S; ++s) {
        const std::int64_t qw = w + d.pad_w - s * d.dilation_w;
        if (qw < 0 || qw % d.stride_w != 0 || qw / d.stride_w >= d.Q) continue;
        acc += Acc(plane[(ph / d.stride_h) * d.Q + qw / d.stride_w]) * Acc(filter[r * d.S + s]);
      }
    }
  }
  return acc;
}

// Term i = (n*P + p)*Q + q of grad_weight[k,r,s]: grad_y[n,k,p,q] * x[n,c(k),h,w], or 0
// where the tap falls in the padding.
template <typename Acc, typename T>
TL_HOST_DEVICE inline Acc depthwise_weight_term(const DepthwiseShape& d, const T* grad_y,
                                                const T* x, std::int64_t k, std::int64_t r,
                                                std::int64_t s, std::int64_t i) {
  const std::int64_t q = i % d.Q, p = (i / d.Q) % d.P, n = i / (d.P * d.Q);
  const std::int64_t h = p * d.stride_h - d.pad_h + r * d.dilation_h;
  const std::int64_t w = q * d.stride_w - d.pad_w + s * d.dilation_w;
  if (h < 0 || h >= d.H || w < 0 || w >= d.W) return Acc(0);
  return Acc(grad_y[((n * d.K + k) * d.P + p) * d.Q + q]) *
         Acc(x[((n * d.C + k / d.M) * d.H + h) * d.W + w]);
}

}  // namespace towerlab
