// CPU conv2d: the specification for kernels/cuda/conv2d.cu (contracts and
// dimension letters in kernels/conv2d.h).
//
// Each image is lowered to a matrix product ("im2col"): the patch matrix
//   col[(c,r,s), (p,q)] = x[n, c, h(p,r), w(q,s)]            [C*R*S, P*Q]
// turns the convolution into
//   forward          y[n]        = weight · col                [K,P*Q] = [K,CRS]·[CRS,P*Q]
//   backward-weight  grad_weight += grad_y[n] · colᵀ           [K,CRS] = [K,P*Q]·[P*Q,CRS]
//   backward-data    grad_col     = weightᵀ · grad_y[n]         [CRS,P*Q], then col2im adds
//                    each patch element back onto the input pixel it came from.
// A 1x1 kernel with stride 1 and no padding needs no lowering: col is x[n] itself.
#include <algorithm>
#include <cstdint>

#include "engine/allocator.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/dtype_dispatch.h"

namespace towerlab::cpu {

namespace {

// Scratch memory for one patch matrix, from the host allocator's cache.
template <typename T>
class Scratch {
 public:
  explicit Scratch(std::int64_t count)
      : allocator_(device_allocator(Device::cpu())),
        data_(static_cast<T*>(allocator_.allocate(static_cast<std::size_t>(count) * sizeof(T)))) {}
  ~Scratch() { allocator_.deallocate(data_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return data_; }

 private:
  Allocator& allocator_;
  T* data_;
};

// C = alpha * op(A) · op(B) + beta * C, row-major, op = transpose when asked.
// A stand-in with cpu::gemm's signature until kernels/matmul.h lands.
template <typename T>
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
          T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i) {
    T* c_row = c + i * ldc;
    for (std::int64_t j = 0; j < n; ++j) c_row[j] = beta == T(0) ? T(0) : beta * c_row[j];
    for (std::int64_t l = 0; l < k; ++l) {
      const T a_il = alpha * (transpose_a ? a[l * lda + i] : a[i * lda + l]);
      if (transpose_b) {
        for (std::int64_t j = 0; j < n; ++j) c_row[j] += a_il * b[j * ldb + l];
      } else {
        const T* b_row = b + l * ldb;
        for (std::int64_t j = 0; j < n; ++j) c_row[j] += a_il * b_row[j];
      }
    }
  }
}

bool needs_lowering(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  return !(s.R == 1 && s.S == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 &&
           p.pad_w == 0);
}

// col[(c,r,s), (p,q)] = x[c, h(p,r), w(q,s)], zero where (h, w) falls in the padding.
template <typename T>
void im2col(T* col, const T* x, const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  // x: [C,H,W], col: [C*R*S, P*Q]
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t r = 0; r < s.R; ++r) {
      for (std::int64_t t = 0; t < s.S; ++t) {
        T* row = col + ((c * s.R + r) * s.S + t) * s.P * s.Q;
        for (std::int64_t op = 0; op < s.P; ++op) {
          const std::int64_t h = op * p.stride_h - p.pad_h + r * p.dilation_h;
          T* out = row + op * s.Q;
          if (h < 0 || h >= s.H) {
            std::fill(out, out + s.Q, T(0));
            continue;
          }
          const T* in = x + (c * s.H + h) * s.W;
          for (std::int64_t oq = 0; oq < s.Q; ++oq) {
            const std::int64_t w = oq * p.stride_w - p.pad_w + t * p.dilation_w;
            out[oq] = (w >= 0 && w < s.W) ? in[w] : T(0);
          }
        }
      }
    }
  }
}

// The adjoint of im2col: x[c, h(p,r), w(q,s)] += col[(c,r,s), (p,q)] for every
// patch element that is not padding.
template <typename T>
void col2im_add(T* x, const T* col, const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  // x: [C,H,W], col: [C*R*S, P*Q]
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t r = 0; r < s.R; ++r) {
      for (std::int64_t t = 0; t < s.S; ++t) {
        const T* row = col + ((c * s.R + r) * s.S + t) * s.P * s.Q;
        for (std::int64_t op = 0; op < s.P; ++op) {
          const std::int64_t h = op * p.stride_h - p.pad_h + r * p.dilation_h;
          if (h < 0 || h >= s.H) continue;
          T* out = x + (c * s.H + h) * s.W;
          const T* in = row + op * s.Q;
          for (std::int64_t oq = 0; oq < s.Q; ++oq) {
            const std::int64_t w = oq * p.stride_w - p.pad_w + t * p.dilation_w;
            if (w >= 0 && w < s.W) out[w] += in[oq];
          }
        }
      }
    }
  }
}

}  // namespace

void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dShape& s) {
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();                                    // [N,K,P,Q]
    const T* in = x.data<T>();                               // [N,C,H,W]
    const T* w = weight.data<T>();                           // [K, C*R*S]
    const T* b = bias.defined() ? bias.data<T>() : nullptr;  // [K]
    const std::int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
    const bool lower = needs_lowering(s);
    Scratch<T> col(lower ? crs * pq : 0);  // [C*R*S, P*Q]
    for (std::int64_t n = 0; n < s.N; ++n) {
      const T* patches = in + n * chw;
      if (lower) {
        im2col(col.get(), patches, s);
        patches = col.get();
      }
      T* y_n = out + n * s.K * pq;  // [K, P*Q]
      for (std::int64_t k = 0; k < s.K; ++k)
        std::fill(y_n + k * pq, y_n + (k + 1) * pq, b ? b[k] : T(0));
      gemm<T>(false, false, s.K, pq, crs, T(1), w, crs, patches, pq, T(1), y_n, pq);
    }
  });
}

void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dShape& s) {
  with_dtype(grad_y.dtype(), [&]<typename T>() {
    const T* gy = grad_y.data<T>();  // [N,K,P,Q]
    const T* in = x.data<T>();       // [N,C,H,W]
    const T* w = weight.data<T>();   // [K, C*R*S]
    const std::int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
    const bool lower = needs_lowering(s);
    Scratch<T> col((lower && (grad_weight.defined() || grad_x.defined())) ? crs * pq : 0);

    if (grad_bias.defined()) {
      T* gb = grad_bias.data<T>();  // [K]
      for (std::int64_t k = 0; k < s.K; ++k) {
        T total = 0;
        for (std::int64_t n = 0; n < s.N; ++n) {
          const T* plane = gy + (n * s.K + k) * pq;  // [P*Q]
          for (std::int64_t i = 0; i < pq; ++i) total += plane[i];
        }
        gb[k] += total;
      }
    }
    if (grad_weight.defined()) {
      T* gw = grad_weight.data<T>();  // [K, C*R*S]
      for (std::int64_t n = 0; n < s.N; ++n) {
        const T* patches = in + n * chw;
        if (lower) {
          im2col(col.get(), patches, s);
          patches = col.get();
        }
        gemm<T>(false, true, s.K, crs, pq, T(1), gy + n * s.K * pq, pq, patches, pq, T(1), gw, crs);
      }
    }
    if (grad_x.defined()) {
      T* gx = grad_x.data<T>();  // [N,C,H,W]
      for (std::int64_t n = 0; n < s.N; ++n) {
        if (!lower) {  // grad_x[n] is the patch matrix's gradient itself: accumulate in place
          gemm<T>(true, false, crs, pq, s.K, T(1), w, crs, gy + n * s.K * pq, pq, T(1),
                  gx + n * chw, pq);
          continue;
        }
        gemm<T>(true, false, crs, pq, s.K, T(1), w, crs, gy + n * s.K * pq, pq, T(0), col.get(),
                pq);
        col2im_add(gx + n * chw, col.get(), s);
      }
    }
  });
}

}  // namespace towerlab::cpu
