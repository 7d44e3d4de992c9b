// The backwards of the CPU batch norm (kernels/cpu/batchnorm.h): each channel's sums
// of grad_y and of grad_y (x - mean) (batchnorm_backward_reduce), then grad_x from
// them (batchnorm_backward_apply), tested against kernels/reference/batchnorm.h. How
// the rows, the threads, the fused ReLU and pool and the 16-bit rows go is
// kernels/cpu/batchnorm.cpp's header; what both halves share, kernels/cpu/batchnorm_rows.h.
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
