// CPU optimizer updates, tested against the plain reference
// (kernels/reference/optimizer.h), as kernels/cuda/optimizer.cu is. One loop
// per update over the n elements of the flat buffers, in the buffers' dtype; the
// loops carry no dependence between elements, so the compiler vectorizes them and
// they split over the thread pool at any boundary (kernels/cpu/parallel.h). The
// range bodies capture by value: with the scalars captured by reference, a store
// through p might change them as far as the compiler knows, and the loops stay scalar.
//
// Adam's float32 loop, whose square root and division the baseline build runs four
// lanes at a time, also has AVX2 and AVX-512 versions picked at run time
// (kernels/cpu/x86.h). They make the same IEEE operations in the same order, one
// rounding each, so every ISA gives the same bits: no fused multiply-add, which
// would round a product and a sum once (the baseline x86-64 build has none to use;
// the vector versions turn GCC's contraction off, TL_NO_CONTRACTION in
// kernels/cpu/x86.h).
// OptimizerAdam.EveryIsaGivesTheSameBits checks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

// Adam's scalars in the element type.
template <typename T>
struct AdamScalars {
  T beta1, beta2, one_minus_beta1, one_minus_beta2, eps, wd, decay_factor, step_size, bc2_sqrt;
};

template <typename T>
AdamScalars<T> adam_scalars(const AdamStep& step) {
  return {
      static_cast<T>(step.beta1),
      static_cast<T>(step.beta2),
      // 1 - beta in double: in float, 1 - 0.999f is off by 1.3e-5 relative.
      static_cast<T>(1.0 - step.beta1),
      static_cast<T>(1.0 - step.beta2),
      static_cast<T>(step.epsilon),
      static_cast<T>(step.weight_decay),
      static_cast<T>(step.decay_factor),
      static_cast<T>(step.step_size),
      static_cast<T>(step.bias_correction2_sqrt),
  };
}

// One Adam step of p[lo, hi), m1 and m2 the moments: the scalar loop every ISA's
// version gives the bits of.
template <typename T>
void adam_range(T* __restrict p, const T* __restrict g, T* __restrict m1, T* __restrict m2,
                std::int64_t lo, std::int64_t hi, AdamScalars<T> a) {
  for (std::int64_t i = lo; i < hi; ++i) {
    const T p0 = p[i] * a.decay_factor;
    const T gi = g[i] + a.wd * p[i];
    m1[i] = a.beta1 * m1[i] + a.one_minus_beta1 * gi;
    m2[i] = a.beta2 * m2[i] + a.one_minus_beta2 * gi * gi;
    p[i] = p0 - a.step_size * m1[i] / (std::sqrt(m2[i]) / a.bc2_sqrt + a.eps);
  }
}

#if TL_CPU_X86
// adam_range in vectors of eight, the last few elements by the scalar loop: its
// operations in its order, one rounding each.
TL_NO_CONTRACTION __attribute__((target("avx2"))) void adam_range_avx2(float* p, const float* g,
                                                                       float* m1, float* m2,
                                                                       std::int64_t lo,
                                                                       std::int64_t hi,
                                                                       AdamScalars<float> a) {
  const __m256 decay_factor = _mm256_set1_ps(a.decay_factor), wd = _mm256_set1_ps(a.wd);
  const __m256 beta1 = _mm256_set1_ps(a.beta1), beta2 = _mm256_set1_ps(a.beta2);
  const __m256 one_minus_beta1 = _mm256_set1_ps(a.one_minus_beta1);
  const __m256 one_minus_beta2 = _mm256_set1_ps(a.one_minus_beta2);
  const __m256 step_size = _mm256_set1_ps(a.step_size), bc2_sqrt = _mm256_set1_ps(a.bc2_sqrt);
  const __m256 eps = _mm256_set1_ps(a.eps);
  std::int64_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    const __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 p0 = _mm256_mul_ps(pi, decay_factor);
    const __m256 gi = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_mul_ps(wd, pi));
    const __m256 m1i = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(m1 + i)),
                                     _mm256_mul_ps(one_minus_beta1, gi));
    const __m256 m2i = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(m2 + i)),
                                     _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, gi), gi));
    const __m256 denominator = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(m2i), bc2_sqrt), eps);
    _mm256_storeu_ps(m1 + i, m1i);
    _mm256_storeu_ps(m2 + i, m2i);
    _mm256_storeu_ps(p + i,
                     _mm256_sub_ps(p0, _mm256_div_ps(_mm256_mul_ps(step_size, m1i), denominator)));
  }
  adam_range(p, g, m1, m2, i, hi, a);
}

// adam_range_avx2 in vectors of sixteen.
TL_NO_CONTRACTION __attribute__((target("avx512f"))) void adam_range_avx512(
    float* p, const float* g, float* m1, float* m2, std::int64_t lo, std::int64_t hi,
    AdamScalars<float> a) {
  const __m512 decay_factor = _mm512_set1_ps(a.decay_factor), wd = _mm512_set1_ps(a.wd);
  const __m512 beta1 = _mm512_set1_ps(a.beta1), beta2 = _mm512_set1_ps(a.beta2);
  const __m512 one_minus_beta1 = _mm512_set1_ps(a.one_minus_beta1);
  const __m512 one_minus_beta2 = _mm512_set1_ps(a.one_minus_beta2);
  const __m512 step_size = _mm512_set1_ps(a.step_size), bc2_sqrt = _mm512_set1_ps(a.bc2_sqrt);
  const __m512 eps = _mm512_set1_ps(a.eps);
  std::int64_t i = lo;
  for (; i + 16 <= hi; i += 16) {
    const __m512 pi = _mm512_loadu_ps(p + i);
    const __m512 p0 = _mm512_mul_ps(pi, decay_factor);
    const __m512 gi = _mm512_add_ps(_mm512_loadu_ps(g + i), _mm512_mul_ps(wd, pi));
    const __m512 m1i = _mm512_add_ps(_mm512_mul_ps(beta1, _mm512_loadu_ps(m1 + i)),
                                     _mm512_mul_ps(one_minus_beta1, gi));
    const __m512 m2i = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_loadu_ps(m2 + i)),
                                     _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, gi), gi));
    // All lanes of a masked square root: GCC 12 warns of its own _mm512_sqrt_ps.
    const __m512 root = _mm512_mask_sqrt_ps(m2i, 0xFFFF, m2i);
    const __m512 denominator = _mm512_add_ps(_mm512_div_ps(root, bc2_sqrt), eps);
    _mm512_storeu_ps(m1 + i, m1i);
    _mm512_storeu_ps(m2 + i, m2i);
    _mm512_storeu_ps(p + i,
                     _mm512_sub_ps(p0, _mm512_div_ps(_mm512_mul_ps(step_size, m1i), denominator)));
  }
  adam_range(p, g, m1, m2, i, hi, a);
}
#endif

}  // namespace

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                const SgdParams& params) {
  with_dtype(param.dtype(), [&]<typename T>() {
    T* __restrict p = param.data<T>();       // [n]
    const T* __restrict g = grad.data<T>();  // [n]
    const auto lr = static_cast<T>(params.lr);
    const auto mu = static_cast<T>(params.momentum);
    const auto wd = static_cast<T>(params.weight_decay);
    const std::int64_t n = param.numel();
    T* __restrict v = velocity.defined() ? velocity.data<T>() : nullptr;  // [n]
    parallel_rows(n, 1, [=](std::int64_t lo, std::int64_t hi) {
      if (v == nullptr) {
        for (std::int64_t i = lo; i < hi; ++i) p[i] -= lr * (g[i] + wd * p[i]);
      } else if (params.nesterov) {
        for (std::int64_t i = lo; i < hi; ++i) {
          const T d = g[i] + wd * p[i];
          v[i] = mu * v[i] + d;
          p[i] -= lr * (d + mu * v[i]);
        }
      } else {
        for (std::int64_t i = lo; i < hi; ++i) {
          v[i] = mu * v[i] + (g[i] + wd * p[i]);
          p[i] -= lr * v[i];
        }
      }
    });
  });
}

void rmsprop_update(const Tensor& param, const Tensor& grad, const Tensor& mean_square,
                    const Tensor& moment, const Tensor& mean_grad, const RmspropParams& params) {
  with_dtype(param.dtype(), [&]<typename T>() {
    T* __restrict p = param.data<T>();         // [n]
    const T* __restrict g = grad.data<T>();    // [n]
    T* __restrict ms = mean_square.data<T>();  // [n]
    T* __restrict mom = moment.data<T>();      // [n]
    const auto lr = static_cast<T>(params.lr);
    const auto rho = static_cast<T>(params.decay);
    const auto one_minus_rho = static_cast<T>(1.0 - params.decay);  // in double, as TF and PyTorch
    const auto mu = static_cast<T>(params.momentum);
    const auto eps = static_cast<T>(params.epsilon);
    const std::int64_t n = param.numel();
    T* __restrict mg = mean_grad.defined() ? mean_grad.data<T>() : nullptr;  // [n]
    parallel_rows(n, 1, [=](std::int64_t lo, std::int64_t hi) {
      if (mg != nullptr) {
        for (std::int64_t i = lo; i < hi; ++i) {
          ms[i] = rho * ms[i] + one_minus_rho * g[i] * g[i];
          mg[i] = rho * mg[i] + one_minus_rho * g[i];
          mom[i] = mu * mom[i] + lr * g[i] / std::sqrt(ms[i] - mg[i] * mg[i] + eps);
          p[i] -= mom[i];
        }
      } else {
        for (std::int64_t i = lo; i < hi; ++i) {
          ms[i] = rho * ms[i] + one_minus_rho * g[i] * g[i];
          mom[i] = mu * mom[i] + lr * g[i] / std::sqrt(ms[i] + eps);
          p[i] -= mom[i];
        }
      }
    });
  });
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 const AdamStep& step, const Tensor& rounded) {
  with_dtype(param.dtype(), [&]<typename T>() {
    T* __restrict p = param.data<T>();       // [n]
    const T* __restrict g = grad.data<T>();  // [n]
    T* __restrict m1 = m.data<T>();          // [n] first moment
    T* __restrict m2 = v.data<T>();          // [n] second moment
    const AdamScalars<T> a = adam_scalars<T>(step);
    // The update of [lo, hi) on this ISA's loop, the ISA read once a call.
    const bool wide = avx512_selected(), vector = avx2_selected();
    auto update = [=](std::int64_t lo, std::int64_t hi) {
#if TL_CPU_X86
      if constexpr (std::is_same_v<T, float>) {
        if (wide) return adam_range_avx512(p, g, m1, m2, lo, hi, a);
        if (vector) return adam_range_avx2(p, g, m1, m2, lo, hi, a);
      }
#endif
      (void)wide;
      (void)vector;
      adam_range(p, g, m1, m2, lo, hi, a);
    };
    if constexpr (std::is_same_v<T, float>) {
      if (rounded.defined()) {
        // The rounded copy block by block, each rounded while the update's stores
        // are still in L1 (kConvertBlock values: 4 KiB), where a pass of its own
        // read the whole buffer again (bench/results/trainer_fusions_zen5_*.md).
        auto fused = [&]<typename Half>(Half* __restrict r) {  // [n]
          parallel_rows(param.numel(), 1, [=](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t b = lo; b < hi; b += kConvertBlock) {
              const std::int64_t end = std::min(hi, b + kConvertBlock);
              update(b, end);
              round_to_16bit(r + b, p + b, end - b);
            }
          });
        };
        if (rounded.dtype() == DType::BFloat16) {
          fused(rounded.data<bfloat16>());
        } else {
          fused(rounded.data<float16>());
        }
        return;
      }
    }
    parallel_rows(param.numel(), 1, update);
  });
}

}  // namespace towerlab::cpu
