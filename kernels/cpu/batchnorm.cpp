// CPU batch normalization, tested against kernels/reference/batchnorm.h as
// kernels/cuda/batchnorm.cu is.
// x is viewed as [N,C,S] (S = H*W). The per-channel sums go row by row: a float32
// row of S values is summed in float, in 32 lanes (float_lane_sums), and the rows'
// totals in double, as the CUDA kernels sum blocks in float and the blocks'
// partials in double; a float64 row is summed in double. The float32 passes have
// AVX-512 and AVX2 forms, chosen at run time (kernels/cpu/x86.h), that give the
// portable code's bits.
//
// Threads (kernels/cpu/parallel.h): the reductions split over channels, and each
// channel sums its rows in order n = 0, 1, ... on whichever thread runs it, so the
// statistics are the same bits for any number of threads; the elementwise passes
// split over the N images.
//
// The fused ReLU (a.activation) is a compile-time parameter of the loops that
// use it, so the plain batch norm pays no test per element: clamp() in the
// forwards, masked() on grad_y in the backwards, each written once. The backward's
// mask is recomputed from x (batchnorm_affine, as the forward computed y), so a
// ReLU backward reads what the plain one reads.
//
// The fused max pool (a.max_pool) works a plane (n, c) at a time: the forward
// pools the plane's activation into y and argmax, computing it as the windows are
// read where AVX2 runs 2x2 windows (max_pool_affine_plane, kernels/cpu/pool2d.h),
// else into a thread's scratch first (PoolScratch); the backwards write the plane's
// gradient into that scratch from grad_y and argmax (with the ReLU's mask, folded
// into argmax by the forward) and run the plain per-row code on it, as if read from
// memory. Either way the bits of the batch norm followed by the pool.
//
// Every pass over x but the AVX-512 forward asks for the plane two ahead of the
// one it reads (prefetch_plane): x is the size of the previous layer's output,
// beyond the L2, and the passes stalled on their loads (the AVX-512 forward
// measured slower with it).
//
// A 16-bit x, y, grad_y or grad_x (kernels/reference/math_type.h) runs the
// float32 code above on float32 copies of its rows (MathRows): each row widened
// exactly into a thread's buffer before it is read, and each row written there
// rounded once, to nearest even, into the tensor; the per-channel tensors are
// float32. So every result is the float32 path's on the widened values, each
// 16-bit output that result rounded once. float32 and float64 rows are read and
// written where they lie: their code is what it was. The backwards also take a
// 16-bit x beside float32 grad_y and grad_x (with_backward_dtypes): x's rows
// widened as they are read, the gradients' rows where they lie.
//
// Where AVX-512 runs, x's 16-bit rows skip the copies in the statistics, the
// forward and the backward's sums: they read the rows as they lie, widened in
// registers as they are loaded (load16, kernels/cpu/convert16.h), and the forward
// without a pool rounds y in registers as it stores it (store16). The same
// operations on the same float32 values, so the same bits. The backward's apply
// keeps the copy: its sixteen-lane form ran slower in the training step, as the
// float32 one does (apply_row_avx2). Measured in bfloat16 ResNet-20 and FashionNet
// steps: batch norm's own time 3 to 8 % less (docs/kernels.md, "Measured choices").
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/batchnorm.h"
#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/lane_sums.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/per_channel.h"
#include "kernels/cpu/pool2d.h"
#include "kernels/cpu/relu.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/x86.h"
#include "kernels/reference/math_type.h"

namespace towerlab::cpu {

namespace {

using reference::kIs16Bit;
using reference::math_t;

// A thread's float32 copies of the rows of 16-bit tensors, in up to three slots
// (x, y or grad_y, grad_x), each allocated at first use; for float32 and float64
// rows (T the math type) the rows themselves, and no buffer.
template <typename T>
class MathRows {
 public:
  using M = math_t<T>;

  // row [n] as M: widened into `slot`, or the row itself.
  const M* read(const T* row, std::int64_t n, int slot) {
    if constexpr (kIs16Bit<T>) {
      M* b = buffer(slot, n);
      widen_16bit(b, row, n);
      return b;
    } else {
      (void)n, (void)slot;
      return row;
    }
  }

  // Where the M code writes row [n]: `slot` (holding the row widened when
  // `widened`, for an accumulation), to be rounded into the row by store(); or
  // the row itself.
  M* write(T* row, std::int64_t n, int slot, bool widened) {
    if constexpr (kIs16Bit<T>) {
      if (widened) read(row, n, slot);
      return buffer(slot, n);
    } else {
      (void)n, (void)slot, (void)widened;
      return row;
    }
  }

  // Rounds `slot` once, to nearest even, into row [n] (nothing for an M row).
  void store(T* row, std::int64_t n, int slot) const {
    if constexpr (kIs16Bit<T>) {
      round_to_16bit(row, buffers_[slot].data(), n);
    } else {
      (void)row, (void)n, (void)slot;
    }
  }

 private:
  M* buffer(int slot, std::int64_t n) {
    std::vector<M>& b = buffers_[slot];
    if (b.size() < static_cast<std::size_t>(n)) b.resize(static_cast<std::size_t>(n));
    return b.data();
  }

  std::array<std::vector<M>, 3> buffers_;
};

// Calls fn.template operator()<T, X>() for a backward: T the gradients' type
// (grad_y's and grad_x's), X x's. The same type, or float beside a 16-bit x (the
// policy's float32 gradients, kernels/batchnorm.h): x's rows are then widened as
// they are read (MathRows<X>), the float32 code's bits on a widened copy of x.
template <typename Fn>
void with_backward_dtypes(const BatchNormArgs& a, Fn&& fn) {
  if (a.grad_y.dtype() == DType::Float32 && a.x.dtype() == DType::BFloat16) {
    fn.template operator()<float, bfloat16>();
  } else if (a.grad_y.dtype() == DType::Float32 && a.x.dtype() == DType::Float16) {
    fn.template operator()<float, float16>();
  } else {
    with_any_dtype(a.x.dtype(), [&]<typename T>() { fn.template operator()<T, T>(); });
  }
}

// ReLU's forward when Relu (the NaN rule of kernels/cpu/relu.cpp), else v.
template <bool Relu, typename T>
T clamp(T v) {
  if constexpr (Relu) {
    return v < T(0) ? T(0) : v;
  } else {
    return v;
  }
}

// The per-channel coefficients of batchnorm_affine, as the forward computes them.
template <typename T>
struct Affine {
  T center, scale, shift;
};

// grad_y masked by the forward's y > 0, recomputed from x, when Relu; else grad_y.
template <bool Relu, typename T>
T masked(T grad_y, T x, const Affine<T>& k) {
  if constexpr (Relu) {
    return relu_mask(grad_y, batchnorm_affine(x, k.center, k.scale, k.shift));
  } else {
    return grad_y;
  }
}

// Channel c's coefficients from gamma, beta, mean and inv_std (only a ReLU
// backward reads them: zeros otherwise).
template <typename T>  // the math type
Affine<T> affine_of(const BatchNormArgs& a, std::int64_t c) {
  if (a.activation != Activation::ReLU) return {T(0), T(0), T(0)};
  const T istd = a.inv_std.data<T>()[c];
  return {a.mean.data<T>()[c], a.gamma.data<T>()[c] * istd, a.beta.data<T>()[c]};
}

#if TL_CPU_X86
// activate with AVX-512, sixteen values a vector: the same operations, lane by
// lane, so the same bits. x and out are float32 or 16-bit: a 16-bit x widened as it
// is loaded, a 16-bit out rounded once as it is stored.
template <bool Relu, typename In, typename Out>
__attribute__((target("avx512f"))) void activate_avx512(Out* out, const In* x, std::int64_t S,
                                                        const Affine<float>& k) {
  const __m512 center = _mm512_set1_ps(k.center), scale = _mm512_set1_ps(k.scale),
               shift = _mm512_set1_ps(k.shift), zero = _mm512_setzero_ps();
  auto activate16 = [&](__m512 v) __attribute__((target("avx512f"))) {
    v = _mm512_add_ps(mul_exact(_mm512_sub_ps(v, center), scale), shift);
    if constexpr (Relu) {  // clamp: v < 0 ? 0 : v (a NaN stays)
      v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), zero);
    }
    return v;
  };
  std::int64_t s = 0;
  for (; s + 16 <= S; s += 16) store16(out + s, activate16(load16(x + s)));
  if (s < S) store_first16(out + s, activate16(load_first16(x + s, S - s)), S - s);
}
#endif

// The activation of one plane (or row) of S values, value by value.
template <bool Relu, typename T>
__attribute__((always_inline)) inline void activate_loop(T* out, const T* x, std::int64_t S,
                                                         const Affine<T>& k) {
  for (std::int64_t s = 0; s < S; ++s) {
    out[s] = clamp<Relu>(batchnorm_affine(x[s], k.center, k.scale, k.shift));
  }
}

#if TL_CPU_X86
// activate_loop compiled for AVX2, which the compiler vectorizes eight values a
// vector: the same operations (the target has no FMA to fuse them), so the same bits.
template <bool Relu>
__attribute__((target("avx2"))) void activate_avx2(float* out, const float* x, std::int64_t S,
                                                   const Affine<float>& k) {
  activate_loop<Relu>(out, x, S, k);
}
#endif

// The activation of one plane (or row) of S values: what the forward stores.
template <bool Relu, typename T>
void activate(T* out, const T* x, std::int64_t S, const Affine<T>& k, bool avx512, bool avx2) {
#if TL_CPU_X86
  if constexpr (std::is_same_v<T, float>) {
    if (avx512) return activate_avx512<Relu>(out, x, S, k);
    if (avx2) return activate_avx2<Relu>(out, x, S, k);
  }
#endif
  (void)avx512, (void)avx2;
  activate_loop<Relu>(out, x, S, k);
}

// A thread's scratch for the fused max pool: one plane [H*W] of the activation
// (forward) or of the pool's gradient (backward). Empty without a max pool.
template <typename T>
class PoolScratch {
 public:
  explicit PoolScratch(const BatchNormArgs& a)
      : z_{a.H, a.W, a.Ho, a.Wo},
        pool_(a.max_pool.value_or(Pool2dParams{})),
        plane_(a.max_pool ? a.S : 0) {}

  // y and where [Ho,Wo]: the max pool of the activation of x's plane [H*W] and its
  // argmax, -1 where the ReLU zeroes the window (its maximum is not > 0, so
  // relu_mask stops its gradient).
  // x is T, or 16-bit where AVX-512 runs (activate_avx512 widens it as it reads).
  template <bool Relu, typename In>
  void forward(T* y, T* where, const In* x, const Affine<T>& k, bool avx512, bool avx2) {
    bool pooled = false;
    if constexpr (std::is_same_v<In, float>) {
      pooled = max_pool_affine_plane(x, y, where, z_, pool_, {k.center, k.scale, k.shift, Relu});
    }
    if (!pooled) {
      if constexpr (std::is_same_v<In, T>) {
        activate<Relu>(plane_.data(), x, z_.H * z_.W, k, avx512, avx2);
      } else {
#if TL_CPU_X86
        activate_avx512<Relu>(plane_.data(), x, z_.H * z_.W, k);
#endif
      }
      max_pool_plane(plane_.data(), y, where, z_, pool_);
    }
    if constexpr (Relu) {
      for (std::int64_t o = 0; o < z_.Ho * z_.Wo; ++o) where[o] = y[o] > T(0) ? where[o] : T(-1);
    }
  }

  // The plane's gradient [H*W] from grad_y and where [Ho,Wo]: the pool's, with
  // the ReLU's mask (the unfused pair's), valid until the next call.
  const T* gradient(const T* grad_y, const T* where) {
    max_pool_plane_gradient(where, grad_y, plane_.data(), z_, pool_);
    return plane_.data();
  }

 private:
  PoolPlane z_;
  Pool2dParams pool_;
  std::vector<T> plane_;
};

// fn.template operator()<Relu>() with Relu = (activation == ReLU).
template <typename Fn>
void with_activation(Activation activation, const Fn& fn) {
  if (activation == Activation::ReLU) {
    fn.template operator()<true>();
  } else {
    fn.template operator()<false>();
  }
}

// Asks for the plane of S values two after `plane`, where x's planes lie one after
// another (FashionNet's 28 x 28 planes are 49 cache lines): the hardware prefetcher
// left the passes over x stalled on their loads. With it, and the pool fused into
// the forward, bn1's forward and bn2's backward in the training step took less CPU
// time (docs/kernels.md, "Measured choices").
template <typename T>
void prefetch_plane(const T* plane, std::int64_t S) {
  const char* ahead = reinterpret_cast<const char*>(plane + 2 * S);
  for (std::int64_t b = 0; b < S * std::int64_t{sizeof(T)}; b += 64) __builtin_prefetch(ahead + b);
}

}  // namespace

namespace {

// Row (n, c)'s mean and sum of squared deviations from it, in two passes over the
// row (the second from L1): never E[x^2] - E[x]^2, which loses everything in float
// when the mean is large against the spread.
struct RowMoments {
  double mean, m2;
};

#if TL_CPU_X86
// row_moments of a float32 or 16-bit row with AVX-512 (a 16-bit row widened as it
// is loaded): the same sums, so the same bits.
template <typename R>
__attribute__((target("avx512f"))) RowMoments row_moments_avx512(const R* row, std::int64_t S) {
  const auto [sum] = float_lane_sums_avx512<1>(
      S, [](__m512 v) __attribute__((target("avx512f"))) { return Zmm<1>{{v}}; }, row);
  const double mean = sum / static_cast<double>(S);
  const __m512 m = _mm512_set1_ps(static_cast<float>(mean));
  const auto [sq] = float_lane_sums_avx512<1>(
      S,
      [&](__m512 v) __attribute__((target("avx512f"))) {
        const __m512 dev = _mm512_sub_ps(v, m);
        return Zmm<1>{{mul_exact(dev, dev)}};
      },
      row);
  return {mean, sq};
}

// row_moments of a float32 row with AVX2: the same sums, so the same bits.
__attribute__((target("avx2"))) RowMoments row_moments_avx2(const float* row, std::int64_t S) {
  const auto [sum] = float_lane_sums_avx2<1>(
      S, [](__m256 v) __attribute__((target("avx2"))) { return Ymm<1>{{v}}; }, row);
  const double mean = sum / static_cast<double>(S);
  const __m256 m = _mm256_set1_ps(static_cast<float>(mean));
  const auto [sq] = float_lane_sums_avx2<1>(
      S,
      [&](__m256 v) __attribute__((target("avx2"))) {
        const __m256 dev = _mm256_sub_ps(v, m);
        return Ymm<1>{{_mm256_mul_ps(dev, dev)}};
      },
      row);
  return {mean, sq};
}
#endif

template <typename T>
RowMoments row_moments(const T* row, std::int64_t S, bool avx512, bool avx2) {
  if constexpr (std::is_same_v<T, float>) {
#if TL_CPU_X86
    if (avx512) return row_moments_avx512(row, S);
    if (avx2) return row_moments_avx2(row, S);
#endif
    const auto [sum] = float_lane_sums<1>(
        S, [](Vec4 v) { return std::array{v}; }, row);
    const double mean = sum / static_cast<double>(S);
    const Vec4 m = splat(static_cast<float>(mean));
    const auto [sq] = float_lane_sums<1>(
        S,
        [&](Vec4 v) {
          const Vec4 dev = v - m;
          return std::array{dev * dev};
        },
        row);
    return {mean, sq};
  } else {
    (void)avx512, (void)avx2;
    const double mean = sum_over(S, [&](std::int64_t s) { return static_cast<double>(row[s]); }) /
                        static_cast<double>(S);
    return {mean, sum_over(S, [&](std::int64_t s) {
              const double dev = static_cast<double>(row[s]) - mean;
              return dev * dev;
            })};
  }
}

// row_moments of a row of x: a 16-bit row as it lies where AVX-512 runs, else as
// `math` gives it (the row itself, or its float32 copy).
template <typename T>
RowMoments moments_of(const T* row, std::int64_t S, MathRows<T>& math, bool avx512, bool avx2) {
#if TL_CPU_X86
  if constexpr (kIs16Bit<T>) {
    if (avx512) return row_moments_avx512(row, S);
  }
#endif
  return row_moments(math.read(row, S, 0), S, avx512, avx2);
}

}  // namespace

// Each channel's rows in order n = 0, 1, ..., each row's moments merged into the
// channel's (Chan, Golub and LeVeque's pairwise update, as batchnorm_merge_stats
// merges towers): rows of equal length S, so after n rows the update weighs the
// next row's deviation from the running mean by n / (n + 1).
void batchnorm_stats(const BatchNormArgs& a) {
  const std::int64_t N = a.N, C = a.C, S = a.S;
  with_any_dtype(a.x.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    const T* in = a.x.data<T>();     // [N,C,S]
    M* mean_out = a.mean.data<M>();  // [C]
    M* m2_out = a.m2.data<M>();      // [C]
    const bool avx512 = avx512_selected(), avx2 = avx2_selected();
    parallel_rows(C, 2 * N * S, [&](std::int64_t first, std::int64_t last) {
      MathRows<T> math;
      // Image by image over this thread's channels: their rows of one image are
      // contiguous, one stream the prefetcher follows (a channel's rows are C*S apart).
      std::vector<RowMoments> channels(last - first, RowMoments{0.0, 0.0});
      for (std::int64_t n = 0; S > 0 && n < N; ++n) {
        const double rows = static_cast<double>(n);
        for (std::int64_t c = first; c < last; ++c) {
          prefetch_plane(in + (n * C + c) * S, S);
          const RowMoments row = moments_of(in + (n * C + c) * S, S, math, avx512, avx2);
          auto& [mean, m2] = channels[c - first];
          const double delta = row.mean - mean;
          mean += delta / (rows + 1.0);
          m2 += row.m2 + delta * delta * rows * static_cast<double>(S) / (rows + 1.0);
        }
      }
      for (std::int64_t c = first; c < last; ++c) {
        mean_out[c] = static_cast<M>(channels[c - first].mean);
        m2_out[c] = static_cast<M>(channels[c - first].m2);
      }
    });
  });
}

void batchnorm_merge_stats(const BatchNormMergeStats& a) {
  with_dtype(a.mean_a.dtype(), [&]<typename T>() {
    T* ma = a.mean_a.data<T>();        // [C]
    T* qa = a.m2_a.data<T>();          // [C]
    const T* mb = a.mean_b.data<T>();  // [C]
    const T* qb = a.m2_b.data<T>();    // [C]
    const double na = static_cast<double>(a.count_a), nb = static_cast<double>(a.count_b);
    const double n = na + nb;
    for (std::int64_t c = 0; c < a.mean_a.numel(); ++c) {
      const double delta = static_cast<double>(mb[c]) - static_cast<double>(ma[c]);
      ma[c] = static_cast<T>(static_cast<double>(ma[c]) + delta * nb / n);
      qa[c] = static_cast<T>(static_cast<double>(qa[c]) + static_cast<double>(qb[c]) +
                             delta * delta * na * nb / n);
    }
  });
}

namespace {

// y[n,c,s] = batchnorm_affine(x[n,c,s], center[c], scale[c], shift[c]), then ReLU
// when the activation asks (y may alias x); with a max pool, y[n,c] is the pool of
// that plane (a 16-bit T's pooled plane rounded once as it is stored).
template <typename T>
void normalize(const BatchNormArgs& a, const std::vector<math_t<T>>& center,
               const std::vector<math_t<T>>& scale) {
  using M = math_t<T>;
  const std::int64_t N = a.N, C = a.C, S = a.S;
  const std::int64_t y_plane = a.max_pool ? a.Ho * a.Wo : S;
  T* y = a.y.data<T>();                                  // [N,C,S] or [N,C,Ho*Wo]
  M* where = a.max_pool ? a.argmax.data<M>() : nullptr;  // [N,C,Ho*Wo]
  const T* x = a.x.data<T>();                            // [N,C,S]
  const M* shift = a.beta.data<M>();                     // [C]
  const bool avx512 = avx512_selected(), avx2 = avx2_selected();
  with_activation(a.activation, [&]<bool Relu>() {
    parallel_rows(N, C * S, [&](std::int64_t first, std::int64_t last) {
      PoolScratch<M> pool(a);
      MathRows<T> math;
      for (std::int64_t n = first; n < last; ++n) {
        for (std::int64_t c = 0; c < C; ++c) {
          const Affine<M> k{center[c], scale[c], shift[c]};
          const T* x_row = x + (n * C + c) * S;
          T* out_row = y + (n * C + c) * y_plane;
          M* where_row = a.max_pool ? where + (n * C + c) * y_plane : nullptr;
          // Not where AVX-512 runs: its activation reads the plane from start to end
          // into the pool's scratch, which the hardware prefetcher follows, and asking
          // as well made bn1's forward slower (docs/kernels.md, "Measured choices").
          if (!avx512) prefetch_plane(x_row, S);
#if TL_CPU_X86
          if constexpr (kIs16Bit<T>) {
            if (avx512) {  // x's row read, and y's (without a pool) written, as they lie
              if (a.max_pool) {
                M* out = math.write(out_row, y_plane, 1, false);
                pool.template forward<Relu>(out, where_row, x_row, k, avx512, avx2);
                math.store(out_row, y_plane, 1);
              } else {
                activate_avx512<Relu>(out_row, x_row, S, k);
              }
              continue;
            }
          }
#endif
          const M* in = math.read(x_row, S, 0);
          M* out = math.write(out_row, y_plane, 1, false);
          if (a.max_pool) {
            pool.template forward<Relu>(out, where_row, in, k, avx512, avx2);
          } else {
            activate<Relu>(out, in, S, k, avx512, avx2);
          }
          math.store(out_row, y_plane, 1);
        }
      }
    });
  });
}

}  // namespace

void batchnorm_forward_from_stats(const BatchNormArgs& a) {
  const std::int64_t C = a.C, count = a.count;
  const double eps = a.eps, momentum = a.momentum;
  with_any_dtype(a.x.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    const M* mu = a.mean.data<M>();      // [C]
    const M* q = a.m2.data<M>();         // [C]
    const M* g = a.gamma.data<M>();      // [C]
    M* istd = a.inv_std.data<M>();       // [C]
    std::vector<M> center(C), scale(C);  // [C]
    for (std::int64_t c = 0; c < C; ++c) {
      const double var = static_cast<double>(q[c]) / static_cast<double>(count);  // biased
      istd[c] = static_cast<M>(1.0 / std::sqrt(var + eps));
      center[c] = mu[c];
      scale[c] = g[c] * istd[c];
    }
    if (a.moving_mean.defined()) {
      M* mm = a.moving_mean.data<M>();  // [C]
      M* mv = a.moving_var.data<M>();   // [C]
      for (std::int64_t c = 0; c < C; ++c) {
        const double unbiased = static_cast<double>(q[c]) / static_cast<double>(count - 1);
        mm[c] = static_cast<M>(momentum * mm[c] + (1.0 - momentum) * mu[c]);
        mv[c] = static_cast<M>(momentum * mv[c] + (1.0 - momentum) * unbiased);
      }
    }
    normalize<T>(a, center, scale);
  });
}

void batchnorm_forward_inference(const BatchNormArgs& a) {
  const std::int64_t C = a.C;
  with_any_dtype(a.x.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    const M* g = a.gamma.data<M>();         // [C]
    const M* mm = a.moving_mean.data<M>();  // [C]
    const M* mv = a.moving_var.data<M>();   // [C]
    std::vector<M> center(C), scale(C);     // [C]
    for (std::int64_t c = 0; c < C; ++c) {
      center[c] = mm[c];
      scale[c] = static_cast<M>(g[c] / std::sqrt(static_cast<double>(mv[c]) + a.eps));
    }
    normalize<T>(a, center, scale);
  });
}

namespace {

#if TL_CPU_X86
// row_sums of float32 rows with AVX-512, x's row float32 or 16-bit (widened as it
// is loaded): the same sums, so the same bits.
template <bool Relu, typename X>
__attribute__((target("avx512f"))) std::pair<double, double> row_sums_avx512(
    const float* gy, const X* x, std::int64_t S, const Affine<float>& k, float m) {
  const __m512 mean = _mm512_set1_ps(m), center = _mm512_set1_ps(k.center),
               scale = _mm512_set1_ps(k.scale), shift = _mm512_set1_ps(k.shift);
  const auto [sum_g, sum_g_dev] = float_lane_sums_avx512<2>(
      S,
      [&](__m512 g, __m512 xv) __attribute__((target("avx512f"))) {
        if constexpr (Relu) {  // relu_mask of batchnorm_affine, lane by lane
          const __m512 y = _mm512_add_ps(mul_exact(_mm512_sub_ps(xv, center), scale), shift);
          g = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), g);
        }
        return Zmm<2>{{g, mul_exact(g, _mm512_sub_ps(xv, mean))}};
      },
      gy, x);
  return {sum_g, sum_g_dev};
}
#endif

#if TL_CPU_X86
// row_sums of float32 rows with AVX2: the same sums, so the same bits.
template <bool Relu>
__attribute__((target("avx2"))) std::pair<double, double> row_sums_avx2(
    const float* gy, const float* x, std::int64_t S, const Affine<float>& k, float m) {
  const __m256 mean = _mm256_set1_ps(m), center = _mm256_set1_ps(k.center),
               scale = _mm256_set1_ps(k.scale), shift = _mm256_set1_ps(k.shift);
  const auto [sum_g, sum_g_dev] = float_lane_sums_avx2<2>(
      S,
      [&](__m256 g, __m256 xv) __attribute__((target("avx2"))) {
        if constexpr (Relu) {  // relu_mask of batchnorm_affine, lane by lane
          const __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(xv, center), scale), shift);
          g = _mm256_and_ps(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GT_OQ), g);
        }
        return Ymm<2>{{g, _mm256_mul_ps(g, _mm256_sub_ps(xv, mean))}};
      },
      gy, x);
  return {sum_g, sum_g_dev};
}
#endif

// One row's sum of g = masked grad_y and of g * (x - m), float32 rows as
// float_lane_sums adds them, float64 rows in double.
template <bool Relu, typename T>
std::pair<double, double> row_sums(const T* gy, const T* x, std::int64_t S, const Affine<T>& k, T m,
                                   bool avx512, bool avx2) {
  if constexpr (std::is_same_v<T, float>) {
#if TL_CPU_X86
    if (avx512) return row_sums_avx512<Relu>(gy, x, S, k, m);
    if (avx2) return row_sums_avx2<Relu>(gy, x, S, k, m);
#endif
    const Vec4 mean = splat(m), center = splat(k.center), scale = splat(k.scale),
               shift = splat(k.shift);
    const auto [sum_g, sum_g_dev] = float_lane_sums<2>(
        S,
        [&](Vec4 g, Vec4 xv) {
          if constexpr (Relu) {  // relu_mask of batchnorm_affine, lane by lane
            const Vec4 y = (xv - center) * scale + shift;
            g = reinterpret_cast<Vec4>(reinterpret_cast<Mask4>(g) & (y > splat(0.0f)));
          }
          return std::array{g, g * (xv - mean)};
        },
        gy, x);
    return {sum_g, sum_g_dev};
  } else {
    (void)avx512, (void)avx2;
    return sum_pair_over(S, [&](std::int64_t s) {
      const double g = static_cast<double>(masked<Relu>(gy[s], x[s], k));
      return std::pair{g, g * (static_cast<double>(x[s]) - static_cast<double>(m))};
    });
  }
}

// row_sums of a row of g (math type M) beside a row of x (X): a 16-bit x as it lies
// where AVX-512 runs, else as `x_rows` gives it.
template <bool Relu, typename M, typename X>
std::pair<double, double> sums_of(const M* g, const X* x, std::int64_t S, const Affine<M>& k, M m,
                                  MathRows<X>& x_rows, bool avx512, bool avx2) {
#if TL_CPU_X86
  if constexpr (kIs16Bit<X>) {
    if (avx512) return row_sums_avx512<Relu>(g, x, S, k, m);
  }
#endif
  return row_sums<Relu>(g, x_rows.read(x, S, 0), S, k, m, avx512, avx2);
}

}  // namespace

void batchnorm_backward_reduce(const BatchNormArgs& a) {
  const std::int64_t N = a.N, C = a.C, S = a.S;
  with_backward_dtypes(a, [&]<typename T, typename X>() {
    using M = math_t<T>;
    static_assert(std::is_same_v<M, math_t<X>>);
    const T* gy = a.grad_y.data<T>();                            // [N,C,S] or [N,C,Ho*Wo]
    const M* where = a.max_pool ? a.argmax.data<M>() : nullptr;  // [N,C,Ho*Wo]
    const X* in = a.x.data<X>();                                 // [N,C,S]
    const M* mu = a.mean.data<M>();                              // [C]
    const M* istd = a.inv_std.data<M>();                         // [C]
    M* out_a = a.sum_grad_y.data<M>();                           // [C]
    M* out_b = a.sum_grad_y_xhat.data<M>();                      // [C]
    const std::int64_t gy_plane = a.max_pool ? a.Ho * a.Wo : S;
    const bool avx512 = avx512_selected(), avx2 = avx2_selected();
    with_activation(a.activation, [&]<bool Relu>() {
      parallel_rows(C, 2 * N * S, [&](std::int64_t first, std::int64_t last) {
        PoolScratch<M> pool(a);
        MathRows<T> math;
        MathRows<X> x_rows;
        std::vector<Affine<M>> ks(last - first);
        for (std::int64_t c = first; c < last; ++c) ks[c - first] = affine_of<M>(a, c);
        // Image by image over this thread's channels, as batchnorm_stats goes.
        std::vector<std::pair<double, double>> sums(last - first, {0.0, 0.0});
        for (std::int64_t n = 0; n < N; ++n) {
          for (std::int64_t c = first; c < last; ++c) {
            const std::int64_t base = (n * C + c) * S;
            const M* g = math.read(gy + (n * C + c) * gy_plane, gy_plane, 1);
            prefetch_plane(in + base, S);
            if (a.max_pool) g = pool.gradient(g, where + (n * C + c) * gy_plane);
            const auto [row_gy, row_gy_xhat] =
                sums_of<Relu>(g, in + base, S, ks[c - first], mu[c], x_rows, avx512, avx2);
            sums[c - first].first += row_gy;
            sums[c - first].second += row_gy_xhat;
          }
        }
        for (std::int64_t c = first; c < last; ++c) {
          out_a[c] = static_cast<M>(sums[c - first].first);
          out_b[c] = static_cast<M>(sums[c - first].second * static_cast<double>(istd[c]));
        }
      });
    });
  });
}

namespace {

// Channel c's coefficients of grad_x = k * (gy - mean_gy - xhat * mean_gy_xhat),
// xhat = (x - mean) * inv_std, and of the ReLU's mask (relu).
template <typename T>
struct ApplyCoefficients {
  T k, mean_gy, mean_gy_xhat, mean, inv_std;
  Affine<T> relu;
};

// One row of grad_x [S] from its grad_y [S] and x [S] (assigned or added).
template <bool Relu, typename T>
__attribute__((always_inline)) inline void apply_row(T* gx, const T* gy, const T* x, std::int64_t S,
                                                     const ApplyCoefficients<T>& a, bool assign) {
  for (std::int64_t s = 0; s < S; ++s) {
    const T xhat = (x[s] - a.mean) * a.inv_std;
    const T gys = masked<Relu>(gy[s], x[s], a.relu);
    const T g = a.k * (gys - a.mean_gy - xhat * a.mean_gy_xhat);
    gx[s] = assign ? g : gx[s] + g;
  }
}

#if TL_CPU_X86

// apply_row compiled for AVX2, which the compiler vectorizes eight values a
// vector: the same operations (the target has no FMA to fuse them), so the same
// bits. AVX-512 machines run it too: a sixteen-lane form of this loop measured
// slower in the training step, though faster on data left in L3
// (docs/kernels.md, "Measured choices").
template <bool Relu>
__attribute__((target("avx2"))) void apply_row_avx2(float* gx, const float* gy, const float* x,
                                                    std::int64_t S,
                                                    const ApplyCoefficients<float>& a,
                                                    bool assign) {
  apply_row<Relu>(gx, gy, x, S, a, assign);
}

#endif  // TL_CPU_X86

// batchnorm_backward_apply with grad_y of T, grad_x of GX (T, or a 16-bit x's dtype
// beside float32 grad_y: the float32 row rounded once as it is stored) and x of X.
template <typename T, typename GX, typename X>
void apply_backward(const BatchNormArgs& a) {
  using M = math_t<T>;
  static_assert(std::is_same_v<M, math_t<X>> && std::is_same_v<M, math_t<GX>>);
  const std::int64_t N = a.N, C = a.C, S = a.S;
  GX* gx = a.grad_x.data<GX>();                                // [N,C,S]
  const T* gy = a.grad_y.data<T>();                            // [N,C,S] or [N,C,Ho*Wo]
  const M* where = a.max_pool ? a.argmax.data<M>() : nullptr;  // [N,C,Ho*Wo]
  const X* in = a.x.data<X>();                                 // [N,C,S]
  const M* g = a.gamma.data<M>();                              // [C]
  const M* mu = a.mean.data<M>();                              // [C]
  const M* istd = a.inv_std.data<M>();                         // [C]
  const M* sa = a.sum_grad_y.data<M>();                        // [C]
  const M* sb = a.sum_grad_y_xhat.data<M>();                   // [C]
  const M inv_count = static_cast<M>(1.0 / static_cast<double>(a.count));
  const bool assign = a.grad_x_write == GradWrite::Assign;
  const std::int64_t gy_plane = a.max_pool ? a.Ho * a.Wo : S;
  const bool avx2 = avx2_selected();
  with_activation(a.activation, [&]<bool Relu>() {
    parallel_rows(N, C * S, [&](std::int64_t first, std::int64_t last) {
      PoolScratch<M> pool(a);
      MathRows<T> gy_rows;
      MathRows<GX> gx_rows;
      MathRows<X> x_rows;
      for (std::int64_t n = first; n < last; ++n) {
        for (std::int64_t c = 0; c < C; ++c) {
          const std::int64_t base = (n * C + c) * S, y_base = (n * C + c) * gy_plane;
          const ApplyCoefficients<M> k{g[c] * istd[c], sa[c] * inv_count, sb[c] * inv_count,
                                       mu[c],          istd[c],           affine_of<M>(a, c)};
          const M* gy_row = gy_rows.read(gy + y_base, gy_plane, 1);
          prefetch_plane(in + base, S);
          if (a.max_pool) gy_row = pool.gradient(gy_row, where + y_base);
          const M* x_row = x_rows.read(in + base, S, 0);
          // A 16-bit grad_x is added to in float32 and rounded once.
          M* gx_row = gx_rows.write(gx + base, S, 2, !assign);
#if TL_CPU_X86
          if constexpr (std::is_same_v<M, float>) {
            if (avx2) {  // also where AVX-512 runs: see apply_row_avx2
              apply_row_avx2<Relu>(gx_row, gy_row, x_row, S, k, assign);
              gx_rows.store(gx + base, S, 2);
              continue;
            }
          }
#endif
          apply_row<Relu>(gx_row, gy_row, x_row, S, k, assign);
          gx_rows.store(gx + base, S, 2);
        }
      }
    });
  });
}

}  // namespace

void batchnorm_backward_apply(const BatchNormArgs& a) {
  with_backward_dtypes(a, [&]<typename T, typename X>() {
    if constexpr (kIs16Bit<X> && !kIs16Bit<T>) {
      if (a.grad_x.dtype() == a.x.dtype()) return apply_backward<T, X, X>(a);
    }
    apply_backward<T, T, X>(a);
  });
}

}  // namespace towerlab::cpu
