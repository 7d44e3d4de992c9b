// CPU max pooling a plane at a time, with the argmax (kernels/cpu/pool2d.h): the
// training forward's max_pool_plane, the backward's max_pool_plane_gradient, and
// max_pool_affine_plane, which pools a batch norm's activation as it computes it
// (kernels/cpu/batchnorm.cpp). The float32 2x2 stride-2 unpadded window
// (FashionNet's) has a second form: the same choice, made for four outputs at once
// in vector lanes over a pair of input rows, instead of walking a generic window per
// output (about three times faster), with AVX2 and AVX-512 forms of it chosen at run
// time (kernels/cpu/x86.h) that give the same bits. Any other window walks
// window_argmax (kernels/cpu/pool2d_window.h), as the whole-tensor ops do.
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/pool2d.h"
#include "kernels/cpu/pool2d_window.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

// The 2x2 stride-2 window without padding: every window lies inside the plane.
bool is_2x2_stride_2(const Pool2dParams& p) {
  return p.kernel_h == 2 && p.kernel_w == 2 && p.stride_h == 2 && p.stride_w == 2 && p.pad_h == 0 &&
         p.pad_w == 0;
}

// Four 2x2 windows side by side, one per lane: the outputs wo .. wo + 3 of the row
// pair that starts at r0 (its bottom row at r1). v[k] holds each window's k-th
// value in window order: top-left, top-right, bottom-left, bottom-right.
struct Windows2x2 {
  Vec4 v[4];
};
Windows2x2 load_2x2(const float* r0, const float* r1, std::int64_t wo) {
  const Vec4 t0 = load4(r0 + 2 * wo), t1 = load4(r0 + 2 * wo + 4);
  const Vec4 b0 = load4(r1 + 2 * wo), b1 = load4(r1 + 2 * wo + 4);
  return {{__builtin_shufflevector(t0, t1, 0, 2, 4, 6), __builtin_shufflevector(t0, t1, 1, 3, 5, 7),
           __builtin_shufflevector(b0, b1, 0, 2, 4, 6),
           __builtin_shufflevector(b0, b1, 1, 3, 5, 7)}};
}

// window_argmax's choice in each lane, made with lane masks instead of a loop per
// window: the first maximum in window order, else the first NaN. Returns its
// value and tags[k] for the chosen k (the caller's label for "the k-th value").
struct Choice2x2 {
  Vec4 value, tag;
};
Choice2x2 choose_2x2(const Windows2x2& w, const std::array<Vec4, 4>& tags) {
  // "v > best" is false for NaN on either side, as in window_argmax.
  Vec4 best = w.v[0], tag = tags[0];
  for (int k = 1; k < 4; ++k) {
    const Mask4 greater = w.v[k] > best;
    best = select(greater, w.v[k], best);
    tag = select(greater, tags[k], tag);
  }
  // A NaN is rare: one test for the four windows, and its rule only when one holds
  // (this halves the pooling's time; SSE2 selects cost three operations each).
  const Mask4 any_nan =
      (w.v[0] != w.v[0]) | (w.v[1] != w.v[1]) | (w.v[2] != w.v[2]) | (w.v[3] != w.v[3]);
  if (!any_lane(any_nan)) return {best, tag};
  // The first NaN wins: chosen from the back, so that the earliest one stands.
  Vec4 nan_value = splat(0.0f), nan_tag = splat(0.0f);
  for (int k = 3; k >= 0; --k) {
    const Mask4 nan = w.v[k] != w.v[k];
    nan_value = select(nan, w.v[k], nan_value);
    nan_tag = select(nan, tags[k], nan_tag);
  }
  return {select(any_nan, nan_value, best), select(any_nan, nan_tag, tag)};
}

// window_argmax over the 2x2 windows of one output row, four outputs at a time.
// `top` is the position of the row pair's first value in the plane; out and where
// [Wo] get the outputs' values and positions. A row of fewer than four outputs
// goes through window_argmax itself.
void max_pool_2x2_row(const float* plane, std::int64_t top, std::int64_t W, std::int64_t Wo,
                      float* out, float* where) {
  const float* r0 = plane + top;  // [W] the window's top row
  const float* r1 = r0 + W;       // [W] its bottom row
  // Each value's offset from its window's top-left; each lane's first column.
  const std::array<Vec4, 4> offsets = {splat(0.0f), splat(1.0f), splat(float(W)),
                                       splat(float(W + 1))};
  const Vec4 lanes = {0.0f, 2.0f, 4.0f, 6.0f};
  if (Wo >= 4) {
    for_each_group(Wo, 4, [&](std::int64_t wo) {
      const Choice2x2 c = choose_2x2(load_2x2(r0, r1, wo), offsets);
      // Positions are exact in float32: planes hold at most 2^24 values.
      store4(out + wo, c.value);
      store4(where + wo, splat(float(top + 2 * wo)) + lanes + c.tag);
    });
    return;
  }
  const std::int64_t h = top / W;
  for (std::int64_t wo = 0; wo < Wo; ++wo) {
    const std::int64_t i = window_argmax(plane, W, Window{h, h + 2, 2 * wo, 2 * wo + 2});
    out[wo] = plane[i];
    where[wo] = static_cast<float>(i);
  }
}

// The gradient of one output row's 2x2 windows (Wo >= 4): rows top/W and the next
// of grad_x, columns [0, 2*Wo), get each window's grad_y at its position in
// `where` and zeros elsewhere (a window at -1 gives nothing). The values are
// 0 + grad_y, as max_pool2d_backward_from_argmax adds them into a zeroed plane (a -0
// lands as +0).
void max_pool_2x2_row_gradient(const float* where, const float* grad_y, std::int64_t top,
                               std::int64_t W, std::int64_t Wo, float* grad_x) {
  float* g0 = grad_x + top;  // [W] the top row
  float* g1 = g0 + W;        // [W] the bottom row
  // Each value's offset from its window's top-left; each lane's first column.
  const std::array<Vec4, 4> offsets = {splat(0.0f), splat(1.0f), splat(float(W)),
                                       splat(float(W + 1))};
  const Vec4 lanes = {0.0f, 2.0f, 4.0f, 6.0f};
  for_each_group(Wo, 4, [&](std::int64_t wo) {
    const Vec4 corner = splat(float(top + 2 * wo)) + lanes;  // exact: planes < 2^24
    const Vec4 at = load4(where + wo);
    const Vec4 g = splat(0.0f) + load4(grad_y + wo);
    Vec4 d[4];
    for (int k = 0; k < 4; ++k) d[k] = keep(at == corner + offsets[k], g);
    store4(g0 + 2 * wo, __builtin_shufflevector(d[0], d[1], 0, 4, 1, 5));
    store4(g0 + 2 * wo + 4, __builtin_shufflevector(d[0], d[1], 2, 6, 3, 7));
    store4(g1 + 2 * wo, __builtin_shufflevector(d[2], d[3], 0, 4, 1, 5));
    store4(g1 + 2 * wo + 4, __builtin_shufflevector(d[2], d[3], 2, 6, 3, 7));
  });
}

#if TL_CPU_X86

// AVX-512: the 2x2 forward rows above with sixteen windows a vector. A row's last group is
// masked (lanes past Wo write nothing, and read only where the plane goes on), so
// any Wo runs without overlap or scalar tail: FashionNet's rows of 14 and 7 outputs
// are one group each. The choices are the Vec4 code's, lane for lane: the same bits.

// The values 2*wo .. 2*wo + 2*count - 1 of a row as its even and odd columns:
// value (top-left or bottom-left, top-right or bottom-right) of each window. With
// `whole`, the 32 values at row are read with plain loads (the lanes past 2*count
// hold whatever follows, for the caller to ignore); else only the row's values, with
// masked loads, which cost more (FashionNet's bn1 forward was faster with plain
// loads wherever the plane allows; docs/kernels.md, "Measured choices").
struct EvenOdd {
  __m512 even, odd;
};
__attribute__((target("avx512f"))) inline EvenOdd load_even_odd(const float* row,
                                                                std::int64_t count, bool whole) {
  const __m512 lo =
      whole ? _mm512_loadu_ps(row) : _mm512_maskz_loadu_ps(first_lanes(2 * count), row);
  const __m512 hi = whole ? _mm512_loadu_ps(row + 16)
                          : _mm512_maskz_loadu_ps(first_lanes(2 * count - 16), row + 16);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  return {_mm512_permutex2var_ps(lo, even, hi), _mm512_permutex2var_ps(lo, odd, hi)};
}

// max_pool_2x2_row for any Wo, in a plane of `size` values (what may be read).
__attribute__((target("avx512f"))) void max_pool_2x2_row_avx512(const float* plane,
                                                                std::int64_t top, std::int64_t W,
                                                                std::int64_t Wo, float* out,
                                                                float* where, std::int64_t size) {
  const float* r0 = plane + top;
  const float* r1 = r0 + W;
  const __m512 offsets[4] = {_mm512_set1_ps(0.0f), _mm512_set1_ps(1.0f), _mm512_set1_ps(float(W)),
                             _mm512_set1_ps(float(W + 1))};
  const __m512 lanes = _mm512_setr_ps(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  for (std::int64_t wo = 0; wo < Wo; wo += 16) {
    const std::int64_t count = std::min<std::int64_t>(16, Wo - wo);
    const bool whole = top + W + 2 * wo + 32 <= size;  // the bottom row's read ends last
    const EvenOdd t = load_even_odd(r0 + 2 * wo, count, whole),
                  b = load_even_odd(r1 + 2 * wo, count, whole);
    const __m512 v[4] = {t.even, t.odd, b.even, b.odd};
    __m512 best = v[0], tag = offsets[0];
    for (int k = 1; k < 4; ++k) {
      const __mmask16 greater = _mm512_cmp_ps_mask(v[k], best, _CMP_GT_OQ);  // false for NaN
      best = _mm512_mask_blend_ps(greater, best, v[k]);
      tag = _mm512_mask_blend_ps(greater, tag, offsets[k]);
    }
    const __mmask16 keep = first_lanes(count);
    __mmask16 any_nan = 0;
    for (int k = 0; k < 4; ++k) any_nan |= _mm512_cmp_ps_mask(v[k], v[k], _CMP_UNORD_Q);
    if ((any_nan & keep) != 0) {  // the first NaN in window order wins: chosen from the back
      for (int k = 3; k >= 0; --k) {
        const __mmask16 nan = _mm512_cmp_ps_mask(v[k], v[k], _CMP_UNORD_Q);
        best = _mm512_mask_blend_ps(nan, best, v[k]);
        tag = _mm512_mask_blend_ps(nan, tag, offsets[k]);
      }
    }
    _mm512_mask_storeu_ps(out + wo, keep, best);
    const __m512 corner = _mm512_add_ps(_mm512_set1_ps(float(top + 2 * wo)), lanes);
    _mm512_mask_storeu_ps(where + wo, keep, _mm512_add_ps(corner, tag));
  }
}

// The gradient of one output row's 2x2 windows (Wo >= 8) as
// max_pool_2x2_row_gradient computes it, eight windows a vector: groups of eight
// (the last one overlapping the one before it, with the same values) whose two
// values per row interleave into sixteen columns. Unmasked full stores: an AVX-512
// version with masked stores measured slower (FashionNet's batch norm backward
// reads the plane right after, and a masked store does not forward to those
// loads; docs/kernels.md, "Measured choices").
__attribute__((target("avx2"))) void max_pool_2x2_row_gradient_avx2(const float* where,
                                                                    const float* grad_y,
                                                                    std::int64_t top,
                                                                    std::int64_t W, std::int64_t Wo,
                                                                    float* grad_x) {
  float* rows[2] = {grad_x + top, grad_x + top + W};
  const __m256 offsets[4] = {_mm256_set1_ps(0.0f), _mm256_set1_ps(1.0f), _mm256_set1_ps(float(W)),
                             _mm256_set1_ps(float(W + 1))};
  const __m256 lanes = _mm256_setr_ps(0, 2, 4, 6, 8, 10, 12, 14);
  // for_each_group's groups of eight, spelled out: a lambda would not be compiled
  // for AVX2.
  std::int64_t wo = 0;
  for (std::int64_t next = 0; next < Wo; next = wo + 8) {
    wo = std::min(next, Wo - 8);
    const __m256 corner = _mm256_add_ps(_mm256_set1_ps(float(top + 2 * wo)), lanes);  // exact
    const __m256 at = _mm256_loadu_ps(where + wo);
    // 0 + grad_y, as the Vec4 code writes it (a -0 lands as +0).
    const __m256 g = _mm256_add_ps(_mm256_setzero_ps(), _mm256_loadu_ps(grad_y + wo));
    __m256 d[4];
    for (int k = 0; k < 4; ++k) {
      d[k] = _mm256_and_ps(_mm256_cmp_ps(at, _mm256_add_ps(corner, offsets[k]), _CMP_EQ_OQ), g);
    }
    for (int r = 0; r < 2; ++r) {
      // unpack interleaves within 128-bit halves: windows 0,1,4,5 and 2,3,6,7.
      const __m256 lo = _mm256_unpacklo_ps(d[2 * r], d[2 * r + 1]);
      const __m256 hi = _mm256_unpackhi_ps(d[2 * r], d[2 * r + 1]);
      float* out = rows[r] + 2 * wo;
      _mm256_storeu_ps(out, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
  }
}

// The input of the plain pool: the plane's values as they are.
struct AsRead {
  __attribute__((target("avx2"))) __m256 operator()(__m256 v) const { return v; }
};

// The input of a batch norm's fused pool: clamp(batchnorm_affine(x)), the ReLU's
// clamp when relu, the operations of the batch norm's AVX2 activation (no FMA on
// this target), so the bits of the plane it would have written.
struct Affine8 {
  __m256 center, scale, shift;
  bool relu;
  __attribute__((target("avx2"))) __m256 operator()(__m256 v) const {
    v = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v, center), scale), shift);
    if (!relu) return v;
    const __m256 zero = _mm256_setzero_ps();
    return _mm256_blendv_ps(v, zero, _mm256_cmp_ps(v, zero, _CMP_LT_OQ));  // a NaN stays
  }
};

// AVX2: the same with eight windows a vector, a row's last group read and written
// only inside the plane and the row (masked loads where the plane ends; the first
// lanes stored 4, 2 and 1 at a time, AMD's masked store being slow): FashionNet's
// rows of 14 windows are two groups, its rows of 7 one. The choices are the Vec4
// code's, lane for lane: the same bits. `input` maps each value read (AsRead, or a
// batch norm's Affine8: the pool of the activation without writing it).
template <typename Input>
__attribute__((target("avx2"))) void max_pool_2x2_row_avx2(const float* plane, std::int64_t top,
                                                           std::int64_t W, std::int64_t Wo,
                                                           float* out, float* where,
                                                           std::int64_t size, const Input& input) {
  const float* r0 = plane + top;
  const float* r1 = r0 + W;
  const __m256 offsets[4] = {_mm256_set1_ps(0.0f), _mm256_set1_ps(1.0f), _mm256_set1_ps(float(W)),
                             _mm256_set1_ps(float(W + 1))};
  const __m256 lanes = _mm256_setr_ps(0, 2, 4, 6, 8, 10, 12, 14);
  for (std::int64_t wo = 0; wo < Wo; wo += 8) {
    const std::int64_t count = std::min<std::int64_t>(8, Wo - wo);
    const bool whole = top + W + 2 * wo + 16 <= size;  // the bottom row's read ends last
    __m256 v[4];  // top-left, top-right, bottom-left, bottom-right of each window
    for (int r = 0; r < 2; ++r) {
      const float* row = (r == 0 ? r0 : r1) + 2 * wo;
      const __m256 lo =
          input(whole ? _mm256_loadu_ps(row) : _mm256_maskload_ps(row, first_lanes8(2 * count)));
      const __m256 hi = input(whole ? _mm256_loadu_ps(row + 8)
                                    : _mm256_maskload_ps(row + 8, first_lanes8(2 * count - 8)));
      v[2 * r] = even_lanes(lo, hi);
      v[2 * r + 1] = odd_lanes(lo, hi);
    }
    __m256 best = v[0], tag = offsets[0];
    for (int k = 1; k < 4; ++k) {
      const __m256 greater = _mm256_cmp_ps(v[k], best, _CMP_GT_OQ);  // false for NaN
      best = _mm256_blendv_ps(best, v[k], greater);
      tag = _mm256_blendv_ps(tag, offsets[k], greater);
    }
    __m256 any_nan = _mm256_cmp_ps(v[0], v[0], _CMP_UNORD_Q);
    for (int k = 1; k < 4; ++k)
      any_nan = _mm256_or_ps(any_nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
    if ((_mm256_movemask_ps(any_nan) & ((1 << count) - 1)) != 0) {
      for (int k = 3; k >= 0; --k) {  // the first NaN in window order wins: chosen from the back
        const __m256 nan = _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q);
        best = _mm256_blendv_ps(best, v[k], nan);
        tag = _mm256_blendv_ps(tag, offsets[k], nan);
      }
    }
    const __m256 at = _mm256_add_ps(_mm256_add_ps(_mm256_set1_ps(float(top + 2 * wo)), lanes), tag);
    if (count == 8) {
      _mm256_storeu_ps(out + wo, best);
      _mm256_storeu_ps(where + wo, at);
    } else {
      store_first_lanes(out + wo, best, count);
      store_first_lanes(where + wo, at, count);
    }
  }
}

#endif  // TL_CPU_X86

}  // namespace

template <typename T>
void max_pool_plane(const T* x, T* y, T* where, const PoolPlane& z, const Pool2dParams& p) {
  if constexpr (std::is_same_v<T, float>) {
    if (is_2x2_stride_2(p)) {
      // The selected ISA's rows (kernels/cpu/x86.h), else the Vec4 code's.
      const bool avx512 = avx512_selected(), avx2 = avx2_selected();
      for (std::int64_t ho = 0; ho < z.Ho; ++ho) {
#if TL_CPU_X86
        if (avx512) {
          max_pool_2x2_row_avx512(x, 2 * ho * z.W, z.W, z.Wo, y + ho * z.Wo, where + ho * z.Wo,
                                  z.H * z.W);
          continue;
        }
        if (avx2) {
          max_pool_2x2_row_avx2(x, 2 * ho * z.W, z.W, z.Wo, y + ho * z.Wo, where + ho * z.Wo,
                                z.H * z.W, AsRead{});
          continue;
        }
#endif
        max_pool_2x2_row(x, 2 * ho * z.W, z.W, z.Wo, y + ho * z.Wo, where + ho * z.Wo);
      }
      return;
    }
  }
  for_each_window(z, p, [&](std::int64_t o, const Window& win) {
    const std::int64_t i = window_argmax(x, z.W, win);
    y[o] = x[i];
    where[o] = static_cast<T>(i);
  });
}

#if TL_CPU_X86
namespace {

__attribute__((target("avx2"))) void max_pool_affine_plane_avx2(const float* x, float* y,
                                                                float* where, const PoolPlane& z,
                                                                const PoolInputAffine& a) {
  const Affine8 input{_mm256_set1_ps(a.center), _mm256_set1_ps(a.scale), _mm256_set1_ps(a.shift),
                      a.relu};
  for (std::int64_t ho = 0; ho < z.Ho; ++ho) {
    max_pool_2x2_row_avx2(x, 2 * ho * z.W, z.W, z.Wo, y + ho * z.Wo, where + ho * z.Wo, z.H * z.W,
                          input);
  }
}

}  // namespace
#endif

bool max_pool_affine_plane(const float* x, float* y, float* where, const PoolPlane& z,
                           const Pool2dParams& p, const PoolInputAffine& a) {
#if TL_CPU_X86
  if (!is_2x2_stride_2(p) || avx512_selected() || !avx2_selected()) return false;
  max_pool_affine_plane_avx2(x, y, where, z, a);
  return true;
#else
  (void)x, (void)y, (void)where, (void)z, (void)p, (void)a;
  return false;
#endif
}

template <typename T>
void max_pool_plane_gradient(const T* where, const T* grad_y, T* grad_x, const PoolPlane& z,
                             const Pool2dParams& p) {
  if constexpr (std::is_same_v<T, float>) {
    if (is_2x2_stride_2(p) && z.Wo >= 4) {
      const bool avx2 = z.Wo >= 8 && avx2_selected();
      for (std::int64_t ho = 0; ho < z.Ho; ++ho) {
#if TL_CPU_X86
        if (avx2) {
          max_pool_2x2_row_gradient_avx2(where + ho * z.Wo, grad_y + ho * z.Wo, 2 * ho * z.W, z.W,
                                         z.Wo, grad_x);
          continue;
        }
#endif
        max_pool_2x2_row_gradient(where + ho * z.Wo, grad_y + ho * z.Wo, 2 * ho * z.W, z.W, z.Wo,
                                  grad_x);
      }
      // What no window covers: the last column of an odd W, the last row of an odd H.
      // (A loop of empty fills for an even W cost as much as a row of windows.)
      for (std::int64_t h = 0; 2 * z.Wo < z.W && h < 2 * z.Ho; ++h) {
        std::fill(grad_x + h * z.W + 2 * z.Wo, grad_x + (h + 1) * z.W, 0.0f);
      }
      std::fill(grad_x + 2 * z.Ho * z.W, grad_x + z.H * z.W, 0.0f);
      return;
    }
  }
  std::fill(grad_x, grad_x + z.H * z.W, T(0));
  for (std::int64_t o = 0; o < z.Ho * z.Wo; ++o) {
    if (where[o] >= T(0)) grad_x[static_cast<std::int64_t>(where[o])] += grad_y[o];
  }
}

template void max_pool_plane<float>(const float*, float*, float*, const PoolPlane&,
                                    const Pool2dParams&);
template void max_pool_plane<double>(const double*, double*, double*, const PoolPlane&,
                                     const Pool2dParams&);
template void max_pool_plane_gradient<float>(const float*, const float*, float*, const PoolPlane&,
                                             const Pool2dParams&);
template void max_pool_plane_gradient<double>(const double*, const double*, double*,
                                              const PoolPlane&, const Pool2dParams&);

}  // namespace towerlab::cpu
