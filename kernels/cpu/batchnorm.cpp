// CPU batch normalization, tested against kernels/reference/batchnorm.h as
// kernels/cuda/batchnorm.cu is: the statistics and the forwards here, the backwards
// in kernels/cpu/batchnorm_backward.cpp, what both share in kernels/cpu/batchnorm_rows.h.
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
// float32 one does (apply_row_avx2, in batchnorm_backward.cpp); what each choice
// measured is in docs/kernels.md, "Measured choices".
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/batchnorm.h"
#include "kernels/cpu/batchnorm_rows.h"
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

using namespace batchnorm_rows;

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

}  // namespace towerlab::cpu
