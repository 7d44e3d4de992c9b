// The implicit-GEMM weight gradient of 3x3 convolutions (kernels/cpu/conv2d_implicit.h).
// Output pixel (h, w) reads the padded plane from (h*stride_h, w*stride_w) on: the
// kernels below walk it with those steps, the step across a template parameter (a
// run-time one slowed the stride-1 kernel: one register too many).
#include "kernels/cpu/conv2d_implicit.h"

#include <algorithm>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

constexpr std::int64_t kTaps = 9;      // 3 x 3
constexpr std::int64_t kFilters = 32;  // a panel's filters: the AVX-512 tile's two vectors

struct Padded {
  std::int64_t rows, cols;
};
Padded padded(const Conv2dShape& s) {
  return {s.H + 2 * s.params.pad_h, s.W + 2 * s.params.pad_w};
}

#if TL_CPU_X86

// Floats past the padded planes that pad_planes may write (zeros).
constexpr std::int64_t kPadSlack = 16;

// planes [C, rows, cols] <- x [C,H,W] with its zero border, a vector at a time:
// copy(out, in, count) moves one vector of `width` floats, its lanes past count
// loaded as zeros under a mask and stored whole, zeros over the border and over
// what the next row writes after it (AMD's masked store is slow; a row of 14 floats
// was a library call to copy). Sixteen floats a vector on AVX-512, eight on AVX2.
template <typename Copy>
[[gnu::always_inline]] inline void pad_planes(float* planes, const float* x, const Conv2dShape& s,
                                              std::int64_t width, const Copy& copy) {
  const Padded z = padded(s);
  std::fill(planes, planes + s.C * z.rows * z.cols + kPadSlack, 0.0f);
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t h = 0; h < s.H; ++h) {
      const float* row = x + (c * s.H + h) * s.W;
      float* out = planes + (c * z.rows + h + s.params.pad_h) * z.cols + s.params.pad_w;
      for (std::int64_t w = 0; w < s.W; w += width) copy(out + w, row + w, s.W - w);
    }
  }
}

__attribute__((target("avx512f"))) void pad_planes_avx512(float* planes, const float* x,
                                                          const Conv2dShape& s) {
  pad_planes(
      planes, x, s, 16,
      [](float* out, const float* in, std::int64_t count) __attribute__((target("avx512f"))) {
        _mm512_storeu_ps(out, _mm512_maskz_loadu_ps(first_lanes(count), in));
      });
}

__attribute__((target("avx2,fma"))) void pad_planes_avx2(float* planes, const float* x,
                                                         const Conv2dShape& s) {
  pad_planes(
      planes, x, s, 8,
      [](float* out, const float* in, std::int64_t count) __attribute__((target("avx2"))) {
        _mm256_storeu_ps(out, _mm256_maskload_ps(in, first_lanes8(count)));
      });
}

// sum[t, 0..31] (t = r*3 + s, rows `ld` apart) = (assign) or += Σ over the pixels
// [p0, p1) of plane[h*stride_h + r, w*kStrideW + s] · panel[p, 0..31] (`row_step` =
// stride_h * cols), each output's products in pixel order, as micro_kernel_avx512
// sums a block (then stores alpha * acc, or alpha * acc + beta * C with alpha = beta =
// 1: the same roundings).
template <int kStrideW>
__attribute__((target("avx512f"))) void taps_by_filters_avx512(
    const float* plane, std::int64_t cols, std::int64_t row_step, std::int64_t Q,
    const float* panel, std::int64_t p0, std::int64_t p1, float* sum, std::int64_t ld,
    bool assign) {
  __m512 acc[kTaps][2];
  for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
  std::int64_t h = p0 / Q, w = p0 % Q;
  for (std::int64_t p = p0; p < p1; ++p) {
    const __m512 b0 = _mm512_loadu_ps(panel + p * kFilters);
    const __m512 b1 = _mm512_loadu_ps(panel + p * kFilters + 16);
    // The taps' rows: top, top + cols, top + 2*cols.
    const float* top = plane + h * row_step + w * kStrideW;
#pragma GCC unroll 3
    for (int r = 0; r < 3; ++r) {
#pragma GCC unroll 3
      for (int t = 0; t < 3; ++t) {
        const __m512 a = _mm512_set1_ps(top[r * cols + t]);
        acc[r * 3 + t][0] = _mm512_fmadd_ps(a, b0, acc[r * 3 + t][0]);
        acc[r * 3 + t][1] = _mm512_fmadd_ps(a, b1, acc[r * 3 + t][1]);
      }
    }
    if (++w == Q) {
      w = 0;
      ++h;
    }
  }
  const __m512 one = _mm512_set1_ps(1.0f);
  for (std::int64_t t = 0; t < kTaps; ++t) {
    for (int v = 0; v < 2; ++v) {
      float* out = sum + t * ld + 16 * v;
      const __m512 c =
          assign ? _mm512_mul_ps(one, acc[t][v])
                 : _mm512_fmadd_ps(one, acc[t][v], _mm512_mul_ps(one, _mm512_loadu_ps(out)));
      _mm512_storeu_ps(out, c);
    }
  }
}

// The AVX2 tile: kRows consecutive rows of the partial (rows (c, r, s) = c*9 + r*3 + s,
// which may cross channels) by 16 filters of the panel's 32 (`panel` and `sum` point
// at them), 2 * kRows sums in registers. At kRows = 6 each pixel costs 6 broadcasts
// and 2 loads for 12 multiply-adds, as micro_kernel_avx2's 6 x 16 tile: nine taps of
// one channel by 8 filters (one broadcast per multiply-add) ran at two thirds of its
// speed. Row i's patch element at pixel (h, w) lies offset[i] floats past
// planes[0, h*stride_h, w*kStrideW] (`row_step` = stride_h * cols): every channel's
// padded plane is the same size.
template <int kRows, int kStrideW>
__attribute__((target("avx2,fma"))) void rows_by_filters_avx2(const float* planes,
                                                              const std::int64_t* offset,
                                                              std::int64_t row_step, std::int64_t Q,
                                                              const float* panel, std::int64_t p0,
                                                              std::int64_t p1, float* sum,
                                                              std::int64_t ld, bool assign) {
  __m256 acc[kRows][2];
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  // `top` walks plane 0 (a pixel index divided into (h, w) cost more than the FMAs).
  const float* top = planes + (p0 / Q) * row_step + (p0 % Q) * kStrideW;
  for (std::int64_t p = p0, w = p0 % Q; p < p1; ++p, top += kStrideW) {
    const __m256 b0 = _mm256_loadu_ps(panel + p * kFilters);
    const __m256 b1 = _mm256_loadu_ps(panel + p * kFilters + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      const __m256 a = _mm256_broadcast_ss(top + offset[i]);
      acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
    }
    if (++w == Q) {
      w = 0;
      top += row_step - kStrideW * Q;
    }
  }
  const __m256 one = _mm256_set1_ps(1.0f);
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) {
      float* out = sum + i * ld + 8 * v;
      const __m256 c =
          assign ? _mm256_mul_ps(one, acc[i][v])
                 : _mm256_fmadd_ps(one, acc[i][v], _mm256_mul_ps(one, _mm256_loadu_ps(out)));
      _mm256_storeu_ps(out, c);
    }
  }
}

// The forward's tile: six pixels (their patch elements `pixel[i]` floats past a tap's
// place in plane 0) by 16 filters (`panel`: [C*9][32], 16 of them here), the sums over
// the rows [q0, q1) of col, row q's tap `tap[q]` floats into the planes: the GEMM
// micro-kernel's 6 x 16 tile with the roles of A and B turned. sums [6][16] <- acc.
__attribute__((target("avx2,fma"))) void pixels_by_filters_avx2(
    const float* planes, const std::int64_t* tap, const std::int64_t (&pixel)[6],
    const float* panel, std::int64_t q0, std::int64_t q1, float (&sums)[6][16]) {
  __m256 acc[6][2];
#pragma GCC unroll 6
  for (int i = 0; i < 6; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  const std::int64_t p0 = pixel[0], p1 = pixel[1], p2 = pixel[2], p3 = pixel[3], p4 = pixel[4],
                     p5 = pixel[5];
  for (std::int64_t q = q0; q < q1; ++q) {
    const __m256 b0 = _mm256_loadu_ps(panel + q * kFilters);
    const __m256 b1 = _mm256_loadu_ps(panel + q * kFilters + 8);
    const float* top = planes + tap[q];
    // One broadcast live at a time (12 sums, 2 of B, 1 of A: 15 registers of 16).
    const std::int64_t at[6] = {p0, p1, p2, p3, p4, p5};
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) {
      const __m256 a = _mm256_broadcast_ss(top + at[i]);
      acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < 6; ++i) {
    _mm256_storeu_ps(sums[i], acc[i][0]);
    _mm256_storeu_ps(sums[i] + 8, acc[i][1]);
  }
}

#endif  // TL_CPU_X86

}  // namespace

bool implicit_forward_applies(const Conv2dShape& s) {
  return implicit_weight_grad_applies(s) && !avx512_selected();
}

std::int64_t implicit_forward_panels(const Conv2dShape& s) {
  return s.K * s.C * kTaps;
}

void implicit_forward_pack(const float* weight, float* panels, const Conv2dShape& s) {
#if TL_CPU_X86
  const std::int64_t crs = s.C * kTaps;
  for (std::int64_t kb = 0; kb < s.K / kFilters; ++kb) {
    pack_32_rows_avx2(weight + kb * kFilters * crs, crs, crs, panels + kb * crs * kFilters);
  }
#else
  (void)weight, (void)panels, (void)s;
#endif
}

// Where implicit_forward's scratch holds the taps' offsets (C*9 of 8 bytes), past
// the planes, at an even float.
std::int64_t taps_at(const Conv2dShape& s) {
  const Padded z = padded(s);
  return (s.C * z.rows * z.cols + kPadSlack + 1) / 2 * 2;
}

std::int64_t implicit_forward_scratch(const Conv2dShape& s) {
  return taps_at(s) + 2 * s.C * kTaps;
}

void implicit_forward(const float* x, const float* panels, const float* bias, float* y,
                      float* scratch, const Conv2dShape& s) {
#if TL_CPU_X86
  const Padded z = padded(s);
  const std::int64_t pixels = s.P * s.Q, crs = s.C * kTaps;
  float* planes = scratch;                                           // [C, rows, cols]
  auto* tap = reinterpret_cast<std::int64_t*>(planes + taps_at(s));  // [C*9]
  static_assert(sizeof(std::int64_t) == 2 * sizeof(float));
  pad_planes_avx2(planes, x, s);
  for (std::int64_t q = 0; q < crs; ++q) {  // row (c, r, s) of col: tap (r, s) of plane c
    const std::int64_t c = q / kTaps, t = q % kTaps;
    tap[q] = c * z.rows * z.cols + (t / 3) * z.cols + t % 3;
  }
  const std::int64_t row_step = s.params.stride_h * z.cols, step = s.params.stride_w;
  alignas(32) float sums[6][16];
  for (std::int64_t kb = 0; kb < s.K / kFilters; ++kb) {
    for (std::int64_t v = 0; v < kFilters; v += 16) {
      const float* panel = panels + kb * crs * kFilters + v;
      const std::int64_t k0 = kb * kFilters + v;
      for (std::int64_t p0 = 0; p0 < pixels; p0 += 6) {
        const int count = static_cast<int>(std::min<std::int64_t>(6, pixels - p0));
        std::int64_t pixel[6];  // past the last pixel: the last one again, not stored
        for (int i = 0; i < 6; ++i) {
          const std::int64_t p = p0 + std::min(i, count - 1);
          pixel[i] = p / s.Q * row_step + p % s.Q * step;
        }
        for (std::int64_t q0 = 0; q0 < crs; q0 += kGemmKc) {
          pixels_by_filters_avx2(planes, tap, pixel, panel, q0, std::min(crs, q0 + kGemmKc), sums);
          // The GEMM's write of a block: 1 · acc + beta · C, its first block's beta 1
          // onto the bias (or 0 without one), the later blocks' 1 onto the sum so far.
          for (int j = 0; j < 16; ++j) {
            float* out = y + (k0 + j) * pixels + p0;
            if (q0 != 0) {
              for (int i = 0; i < count; ++i) out[i] = sums[i][j] + out[i];
            } else if (bias != nullptr) {
              for (int i = 0; i < count; ++i) out[i] = sums[i][j] + bias[k0 + j];
            } else {
              for (int i = 0; i < count; ++i) out[i] = sums[i][j];
            }
          }
        }
      }
    }
  }
#else
  (void)x, (void)panels, (void)bias, (void)y, (void)scratch, (void)s;
#endif
}

bool implicit_weight_grad_applies(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  return TL_CPU_X86 && avx2_selected() && s.R == 3 && s.S == 3 && p.stride_h >= 1 &&
         p.stride_h <= 2 && p.stride_w >= 1 && p.stride_w <= 2 && p.dilation_h == 1 &&
         p.dilation_w == 1 && p.pad_h >= 0 && p.pad_h <= 1 && p.pad_w >= 0 && p.pad_w <= 1 &&
         s.K % kFilters == 0 && s.P > 0 && s.Q > 0;
}

std::int64_t implicit_weight_grad_scratch(const Conv2dShape& s) {
  const Padded z = padded(s);
  return s.C * z.rows * z.cols + kPadSlack + s.K * s.P * s.Q;
}

void implicit_weight_grad(const float* x, const float* grad_y, float* partial, bool first,
                          float* scratch, const Conv2dShape& s) {
#if TL_CPU_X86
  const Padded z = padded(s);
  const std::int64_t pixels = s.P * s.Q;
  float* planes = scratch;                                      // [C, rows, cols]
  float* panels = scratch + s.C * z.rows * z.cols + kPadSlack;  // [K/32, P*Q, 32]
  const std::int64_t plane_size = z.rows * z.cols;
  const std::int64_t row_step = s.params.stride_h * z.cols;  // output row to output row
  const bool avx512 = avx512_selected();  // else AVX2 (implicit_weight_grad_applies)
  if (avx512) {
    pad_planes_avx512(planes, x, s);
  } else {
    pad_planes_avx2(planes, x, s);
  }
  for (std::int64_t kb = 0; kb < s.K / kFilters; ++kb) {
    pack_32_rows_avx2(grad_y + kb * kFilters * pixels, pixels, pixels,
                      panels + kb * pixels * kFilters);
  }
  // The panel of 32 filters stays in L1 while every channel's plane passes by.
  for (std::int64_t kb = 0; kb < s.K / kFilters; ++kb) {
    const float* panel = panels + kb * pixels * kFilters;
    float* sums = partial + kb * kFilters;  // [C*9, 32] of [C*9, K]
    if (avx512) {
      for (std::int64_t c = 0; c < s.C; ++c) {
        for (std::int64_t p0 = 0; p0 < pixels; p0 += kGemmKc) {
          const auto taps =
              s.params.stride_w == 1 ? taps_by_filters_avx512<1> : taps_by_filters_avx512<2>;
          taps(planes + c * plane_size, z.cols, row_step, s.Q, panel, p0,
               std::min(pixels, p0 + kGemmKc), sums + c * kTaps * s.K, s.K, first && p0 == 0);
        }
      }
      continue;
    }
    // On AVX2, tiles of six rows (C*9 is a multiple of three: a last tile of three
    // where C is odd) by 16 filters.
    for (std::int64_t row = 0; row < s.C * kTaps; row += 6) {
      const bool full = row + 6 <= s.C * kTaps;
      std::int64_t offset[6];
      for (std::int64_t i = 0; i < (full ? 6 : 3); ++i) {
        const std::int64_t c = (row + i) / kTaps, tap = (row + i) % kTaps;
        offset[i] = c * plane_size + (tap / 3) * z.cols + tap % 3;
      }
      for (std::int64_t v = 0; v < kFilters; v += 16) {
        for (std::int64_t p0 = 0; p0 < pixels; p0 += kGemmKc) {
          const std::int64_t p1 = std::min(pixels, p0 + kGemmKc);
          float* out = sums + row * s.K + v;
          const bool assign = first && p0 == 0;
          const bool unit = s.params.stride_w == 1;
          const auto rows = full ? (unit ? rows_by_filters_avx2<6, 1> : rows_by_filters_avx2<6, 2>)
                                 : (unit ? rows_by_filters_avx2<3, 1> : rows_by_filters_avx2<3, 2>);
          rows(planes, offset, row_step, s.Q, panel + v, p0, p1, out, s.K, assign);
        }
      }
    }
  }
#else
  (void)x, (void)grad_y, (void)partial, (void)first, (void)scratch, (void)s;
#endif
}

}  // namespace towerlab::cpu
