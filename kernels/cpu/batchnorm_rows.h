// What both halves of the CPU batch norm share (internal: kernels/cpu/batchnorm.cpp,
// the statistics and the forwards, whose header tells the design, and
// kernels/cpu/batchnorm_backward.cpp, the backwards): a thread's float32 copies of
// 16-bit rows (MathRows), the affine transform and its ReLU, the activation of a
// plane in its ISA forms, the fused max pool's scratch plane, and the prefetch of the
// plane two ahead. Not installed, not included by towerlab.h.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/batchnorm.h"
#include "kernels/cpu/convert16.h"
#include "kernels/cpu/lane_sums.h"
#include "kernels/cpu/pool2d.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/x86.h"
#include "kernels/reference/math_type.h"

namespace towerlab::cpu::batchnorm_rows {

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
  prefetch_bytes(plane + 2 * S, S * std::int64_t{sizeof(T)});
}

}  // namespace towerlab::cpu::batchnorm_rows
