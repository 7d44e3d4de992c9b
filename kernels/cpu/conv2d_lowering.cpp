// im2col and col2im on the CPU (kernels/cpu/conv2d_lowering.h): the lowering that
// turns each image's convolution into kernels/cpu/conv2d.cpp's matrix products, and
// its adjoint, which adds the patch matrix's gradient back onto the input.
//
// Both walk col row by row, one kernel tap (c, r, s) a row: a contiguous copy or add
// per output row, or one run per tap where the strides are 1 and Q == W (flat runs,
// below). On AVX2 and AVX-512, col2im of float32 planes takes vector paths (flat
// runs over small planes, a gather for ResNet's 3x3 stride-2 layers, and the other
// layers with stride 2 across), each adding every pixel's taps in the plain loop's
// order: the same bits. im2col of bfloat16 flat runs takes an AVX-512 path, a
// masked load a vector: only data moves, the same values.
#include "kernels/cpu/conv2d_lowering.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

bool needs_lowering(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  return !(s.R == 1 && s.S == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 &&
           p.pad_w == 0);
}

namespace {

// The output columns [first, last) whose input column w(q, kq) = q*stride_w -
// pad_w + kq*dilation_w lies inside [0, W) for kernel column kq; the rest read
// padding. Working out the range once keeps the copy loops free of branches.
struct ColumnRange {
  std::int64_t first, last;
};
ColumnRange valid_columns(const Conv2dShape& s, std::int64_t kq) {
  const Conv2dParams& p = s.params;
  const std::int64_t offset = kq * p.dilation_w - p.pad_w;  // w(q, kq) = q*stride_w + offset
  auto ceil_div = [](std::int64_t a, std::int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; };
  const std::int64_t first = std::min(s.Q, ceil_div(-offset, p.stride_w));
  const std::int64_t last = std::max(first, std::min(s.Q, ceil_div(s.W - offset, p.stride_w)));
  return {first, last};
}

// With unit strides and Q == W, the output pixel (p, q) of kernel tap (r, kq) reads
// x at the flat index (p*W + q) + (r*dilation_h - pad_h)*W + (kq*dilation_w - pad_w):
// one shift for all of its rows, so im2col and col2im move one contiguous run per tap
// (rows [first_row, last_row) inside the input), not one short run per output row,
// and then fix the edge columns that the run wraps onto a neighbouring row.
struct FlatRun {
  std::int64_t first_row, last_row, shift;
};
bool flat_runs(const Conv2dShape& s) {
  return s.params.stride_h == 1 && s.params.stride_w == 1 && s.Q == s.W;
}
FlatRun flat_run(const Conv2dShape& s, std::int64_t r, std::int64_t kq) {
  const std::int64_t row_offset = r * s.params.dilation_h - s.params.pad_h;
  const std::int64_t first = std::clamp<std::int64_t>(-row_offset, 0, s.P);
  const std::int64_t last = std::max(first, std::min(s.P, s.H - row_offset));
  return {first, last, row_offset * s.W + kq * s.params.dilation_w - s.params.pad_w};
}

// row[op, q] = 0 for the rows [first_row, last_row) and the columns outside
// [first, last): a pixel or two per row, stored down the columns (row by row, the
// compiler would make each row's pixel a library call).
template <typename T>
void zero_edge_columns(T* row, std::int64_t first_row, std::int64_t last_row, std::int64_t first,
                       std::int64_t last, std::int64_t Q) {
  auto zero_column = [&](std::int64_t q) {
    for (std::int64_t op = first_row; op < last_row; ++op) row[op * Q + q] = T{};
  };
  for (std::int64_t q = 0; q < first; ++q) zero_column(q);
  for (std::int64_t q = last; q < Q; ++q) zero_column(q);
}

#if TL_CPU_X86
// col2im with stride 2 across (stride_w == 2, where col2im_gather_avx2 below does not
// take the layer: another kernel size, padding or dilation): output
// column oq of kernel column kq lands on input column 2*oq + offset, offset =
// kq*dilation_w - pad_w, so eight outputs go to the even lanes of sixteen consecutive
// columns. The pixel-by-pixel loop below, a load, an add and a store a pixel, took
// about as long as the GEMM of these layers' input gradient. (im2col's strided copy
// in vectors measured no faster: its stores bound it.)

// col2im_stride2_avx2's copy of a plane: up to this many pixels, with room for the
// windows that run past its last row.
constexpr std::int64_t kStride2Plane = 4096;
constexpr std::int64_t kStride2Slack = 16;

// The plane [H,W] of one channel += its taps' rows of col (`rows`: [R*S, P*Q]) when
// stride_w is 2, onto zeros when `assign`: tap by tap, row by row, eight outputs a
// vector, each added to the even lanes of the sixteen columns they land on by a
// blend that leaves the other lanes' bits as they were. Each pixel adds its taps in
// the order of the loop in col2im_add: the same bits. The windows run past the row
// (into the plane's next row, or past its end), so the sums go to a copy of the plane
// (at most kStride2Plane pixels), written back whole at the end.
__attribute__((target("avx2"))) void col2im_stride2_avx2(float* plane, const float* rows,
                                                         const Conv2dShape& s, bool assign) {
  const Conv2dParams& p = s.params;
  alignas(32) float copy[kStride2Plane + kStride2Slack];
  const std::int64_t pixels = s.H * s.W;
  if (assign) {
    std::fill(copy, copy + pixels, 0.0f);
  } else {
    std::copy(plane, plane + pixels, copy);
  }
  std::fill(copy + pixels, copy + pixels + kStride2Slack, 0.0f);  // read and kept, never used
  // Lane 2i of the window takes output i of the group (i < 4: the first eight
  // columns, else the second): the lanes of the group's first `count` outputs.
  const __m256i half = _mm256_setr_epi32(0, 8, 1, 8, 2, 8, 3, 8);  // 8: an odd lane, never
  const __m256i second = _mm256_add_epi32(half, _mm256_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0));
  const __m256 zero = _mm256_setzero_ps();
  for (std::int64_t r = 0; r < s.R; ++r) {
    for (std::int64_t kq = 0; kq < s.S; ++kq) {
      const float* row = rows + (r * s.S + kq) * s.P * s.Q;  // [P,Q]
      const auto [first, last] = valid_columns(s, kq);
      const std::int64_t offset = kq * p.dilation_w - p.pad_w;
      for (std::int64_t op = 0; op < s.P; ++op) {
        const std::int64_t h = op * p.stride_h - p.pad_h + r * p.dilation_h;
        if (h < 0 || h >= s.H) continue;
        const float* in = row + op * s.Q;
        for (std::int64_t oq = first; oq < last; oq += 8) {
          const std::int64_t count = std::min<std::int64_t>(8, last - oq);
          const __m256 v = count == 8 ? _mm256_loadu_ps(in + oq)
                                      : _mm256_maskload_ps(in + oq, first_lanes8(count));
          const __m256 lo = _mm256_unpacklo_ps(v, zero);  // v0 0 v1 0 | v4 0 v5 0
          const __m256 hi = _mm256_unpackhi_ps(v, zero);  // v2 0 v3 0 | v6 0 v7 0
          const __m256 spread[2] = {_mm256_permute2f128_ps(lo, hi, 0x20),
                                    _mm256_permute2f128_ps(lo, hi, 0x31)};
          const __m256i n = _mm256_set1_epi32(static_cast<int>(count));
          const __m256 take[2] = {_mm256_castsi256_ps(_mm256_cmpgt_epi32(n, half)),
                                  _mm256_castsi256_ps(_mm256_cmpgt_epi32(n, second))};
          float* out = copy + h * s.W + 2 * oq + offset;  // in [0, pixels)
          for (int i = 0; i < 2; ++i) {
            const __m256 old = _mm256_loadu_ps(out + 8 * i);
            _mm256_storeu_ps(out + 8 * i,
                             _mm256_blendv_ps(old, _mm256_add_ps(old, spread[i]), take[i]));
          }
        }
      }
    }
  }
  std::copy(copy, copy + pixels, plane);
}

// col2im of a 3x3 kernel with stride 2, padding 1 and no dilation both ways
// (ResNet's downsampling layers) by gathering: each input pixel (h, w) takes its 1,
// 2 or 4 taps straight from col's rows, sixteen pixels (a group of eight even and
// eight odd columns) at a time, and the plane is written once. Row h gets kernel row
// r from output row op = (h + 1 - r) / 2 where that is whole and inside [0, P): r = 1
// for an even h, r = 0 then r = 2 for an odd one. Likewise an even column w = 2j
// takes kernel column 1 at output column j, an odd one w = 2j + 1 takes column 0 at
// j + 1, then column 2 at j. Each pixel so adds its taps in col2im_add's (r, kq)
// order, onto +0 (assign) or the plane's value: the bits of the tap-by-tap loop and
// of col2im_stride2_avx2, without its copy of the plane, whose tap-by-tap stores,
// one column apart, each next tap's loads found unforwarded. A lane without a tap
// adds -0, which leaves every value's bits as they were (+0 included).
__attribute__((target("avx2"))) inline __m256 tap_lanes(const float* row, std::int64_t j0,
                                                        std::int64_t valid) {
  if (valid >= 8) return _mm256_loadu_ps(row + j0);
  const __m256i m = first_lanes8(valid);
  return _mm256_blendv_ps(_mm256_set1_ps(-0.0f), _mm256_maskload_ps(row + j0, m),
                          _mm256_castsi256_ps(m));
}

bool col2im_gathers(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  return s.R == 3 && s.S == 3 && p.stride_h == 2 && p.stride_w == 2 && p.pad_h == 1 &&
         p.pad_w == 1 && p.dilation_h == 1 && p.dilation_w == 1;
}

// The plane [H,W] of one channel += its taps' rows of col (`rows`: [9, P*Q]), onto
// zeros when `assign`, for col2im_gathers(s).
__attribute__((target("avx2"))) void col2im_gather_avx2(float* plane, const float* rows,
                                                        const Conv2dShape& s, bool assign) {
  const std::int64_t pq = s.P * s.Q;
  for (std::int64_t h = 0; h < s.H; ++h) {
    // The kernel rows r that reach row h, in order, and their output rows.
    std::int64_t taps = 0, r_of[2], op_of[2];
    for (std::int64_t r = 0; r < 3; ++r) {
      const std::int64_t twice = h + 1 - r;  // 2 * op
      if (twice < 0 || twice % 2 != 0 || twice / 2 >= s.P) continue;
      r_of[taps] = r;
      op_of[taps++] = twice / 2;
    }
    float* out = plane + h * s.W;  // [W]
    for (std::int64_t j0 = 0; 2 * j0 < s.W; j0 += 8) {
      const std::int64_t pixels = std::min<std::int64_t>(16, s.W - 2 * j0);
      // Lanes j - j0 with a tap: even columns and kernel column 2 need j < Q (and
      // w < W), kernel column 0 needs j + 1 < Q.
      const std::int64_t even_valid = std::min((pixels + 1) / 2, s.Q - j0);
      const std::int64_t odd2_valid = std::min(pixels / 2, s.Q - j0);
      const std::int64_t odd0_valid = std::min(pixels / 2, s.Q - j0 - 1);
      __m256 even, odd;
      if (assign) {
        even = odd = _mm256_setzero_ps();
      } else if (pixels == 16) {
        even = even_lanes(_mm256_loadu_ps(out + 2 * j0), _mm256_loadu_ps(out + 2 * j0 + 8));
        odd = odd_lanes(_mm256_loadu_ps(out + 2 * j0), _mm256_loadu_ps(out + 2 * j0 + 8));
      } else {  // a row's last group: its pixels, and zeros for the lanes past W
        const __m256 a = _mm256_maskload_ps(out + 2 * j0, first_lanes8(pixels));
        const __m256 b = _mm256_maskload_ps(out + 2 * j0 + 8, first_lanes8(pixels - 8));
        even = even_lanes(a, b);
        odd = odd_lanes(a, b);
      }
      for (std::int64_t t = 0; t < taps; ++t) {
        const float* tap = rows + r_of[t] * 3 * pq + op_of[t] * s.Q;  // kernel column 0's row
        even = _mm256_add_ps(even, tap_lanes(tap + pq, j0, even_valid));
        odd = _mm256_add_ps(odd, tap_lanes(tap + 1, j0, odd0_valid));
        odd = _mm256_add_ps(odd, tap_lanes(tap + 2 * pq, j0, odd2_valid));
      }
      const __m256 lo = _mm256_unpacklo_ps(even, odd);  // e0 o0 e1 o1 | e4 o4 e5 o5
      const __m256 hi = _mm256_unpackhi_ps(even, odd);  // e2 o2 e3 o3 | e6 o6 e7 o7
      const __m256 first = _mm256_permute2f128_ps(lo, hi, 0x20);
      const __m256 second = _mm256_permute2f128_ps(lo, hi, 0x31);
      if (pixels == 16) {
        _mm256_storeu_ps(out + 2 * j0, first);
        _mm256_storeu_ps(out + 2 * j0 + 8, second);
      } else if (pixels > 8) {
        _mm256_storeu_ps(out + 2 * j0, first);
        store_first_lanes(out + 2 * j0 + 8, second, pixels - 8);
      } else if (pixels == 8) {
        _mm256_storeu_ps(out + 2 * j0, first);
      } else {
        store_first_lanes(out + 2 * j0, first, pixels);
      }
    }
  }
}
#endif

#if TL_CPU_X86
// One kernel tap's share of a channel's col2im with flat runs: it adds
// row[i - shift] to the plane's pixel i for i in [lo, hi).
struct TapRun {
  const float* row;
  std::int64_t lo, hi, shift;
};
// The lanes l of eight with i0 + l < bound.
__attribute__((target("avx2"))) inline __m256i lanes_below(std::int64_t bound, std::int64_t i0) {
  const std::int64_t n = std::clamp<std::int64_t>(bound - i0, 0, 8);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// acc + the lanes of src[i0 ..] that lie in the tap's run [lo, hi); the other lanes
// stay as they were and are not read (their addresses may lie outside the row).
__attribute__((target("avx2"))) inline __m256 add_partial(__m256 acc, const float* src,
                                                          const TapRun& tap, std::int64_t i0) {
  const __m256i m = _mm256_andnot_si256(lanes_below(tap.lo, i0), lanes_below(tap.hi, i0));
  const __m256 v = _mm256_maskload_ps(src + i0, m);
  return _mm256_blendv_ps(acc, _mm256_add_ps(acc, v), _mm256_castsi256_ps(m));
}

// The plane [pixels] += the taps' runs, in tap order: for each tap, eight pixels
// at a time into a copy of the plane held in blocks of eight (the same aligned
// blocks for every tap, so each block's load finds its last store), the run's
// partial first and last blocks by a masked load and a blend, which leaves the
// lanes outside the run as they were. The tap-by-tap loop on the plane itself
// stores each run and reloads it one pixel over for the next tap, a load that no
// store forwards, which stalled col2im. Each pixel adds its taps in the same
// order as that loop: the same bits.
__attribute__((target("avx2"))) void col2im_plane_avx2(float* plane, std::int64_t pixels,
                                                       const TapRun* taps, int count, bool assign) {
  constexpr std::int64_t kMaxBlocks = 64;  // planes of up to 512 pixels
  __m256 acc[kMaxBlocks];
  const std::int64_t blocks = (pixels + 7) / 8;
  for (std::int64_t b = 0; b < blocks; ++b) {
    if (assign) {  // the plane is not read: the sums start from +0, as on a zeroed plane
      acc[b] = _mm256_setzero_ps();
    } else {
      acc[b] = 8 * b + 8 <= pixels ? _mm256_loadu_ps(plane + 8 * b)
                                   : _mm256_maskload_ps(plane + 8 * b, lanes_below(pixels, 8 * b));
    }
  }
  for (int t = 0; t < count; ++t) {
    const TapRun& tap = taps[t];
    const float* src = tap.row - tap.shift;  // src[i] is the run's value at pixel i
    const std::int64_t first_whole = (tap.lo + 7) / 8, end_whole = tap.hi / 8;
    const std::int64_t first = tap.lo / 8, last = end_whole;  // the partial blocks
    if (first_whole > end_whole) {                            // the run lies inside one block
      acc[first] = add_partial(acc[first], src, tap, 8 * first);
      continue;
    }
    if (tap.lo % 8 != 0) acc[first] = add_partial(acc[first], src, tap, 8 * first);
    for (std::int64_t b = first_whole; b < end_whole; ++b) {
      acc[b] = _mm256_add_ps(acc[b], _mm256_loadu_ps(src + 8 * b));
    }
    if (tap.hi % 8 != 0) acc[last] = add_partial(acc[last], src, tap, 8 * last);
  }
  for (std::int64_t b = 0; b < blocks; ++b) {
    if (8 * b + 8 <= pixels) {
      _mm256_storeu_ps(plane + 8 * b, acc[b]);
    } else {  // AMD's masked store is microcoded: only for the last, partial block
      _mm256_maskstore_ps(plane + 8 * b, lanes_below(pixels, 8 * b), acc[b]);
    }
  }
}

// im2col of a bfloat16 image with flat runs on AVX-512 (the bfloat16 GEMM path's
// lowering, whose CPUs all have it): each row of col is its tap's run of x, 32
// values a vector, loaded under a mask that zeroes the lanes falling in the padding
// (output rows outside [first_row, last_row), columns outside [first, last)). One
// masked load and one store per 32 values, where the generic loop filled the rows
// in the padding, copied the run and then zeroed the edge columns value by value,
// down the columns, the most costly part at small planes
// (bench/results/conv2d_bf16_transposed_zen5_*.md). Lanes under a zero mask are
// not read, so a vector may reach before or past the plane. The masks depend on the
// tap and the vector alone, so they are worked out once for all channels.
bool im2col_flat_bf16_runs(const Conv2dShape& s) {
  static const bool has_bw = __builtin_cpu_supports("avx512bw");
  return flat_runs(s) && avx512_selected() && has_bw;
}

__attribute__((target("avx512f,avx512bw"))) void im2col_flat_bf16_avx512(bfloat16* col,
                                                                         const bfloat16* x,
                                                                         const Conv2dShape& s,
                                                                         std::int64_t ld) {
  const std::int64_t pq = s.P * s.Q, taps = s.R * s.S, vectors = (pq + 31) / 32;
  // The masks of the last shape this thread lowered (a layer's images come one after
  // another), worked out again when the shape changes.
  thread_local std::vector<__mmask32> masks;  // [taps][vectors]
  thread_local std::vector<std::int64_t> shifts;
  thread_local std::array<std::int64_t, 10> masks_of{};
  const Conv2dParams& p = s.params;
  const std::array<std::int64_t, 10> shape{s.H, s.W,     s.P,     s.Q,          s.R,
                                           s.S, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w};
  if (shape != masks_of) {  // a first call's shape differs from the zeros
    masks.assign(static_cast<std::size_t>(taps * vectors), 0);
    shifts.resize(static_cast<std::size_t>(taps));
    for (std::int64_t r = 0; r < s.R; ++r) {
      for (std::int64_t kq = 0; kq < s.S; ++kq) {
        const std::int64_t tap = r * s.S + kq;
        const auto [first, last] = valid_columns(s, kq);
        const auto [first_row, last_row, shift] = flat_run(s, r, kq);
        shifts[tap] = shift;
        for (std::int64_t op = first_row; op < last_row; ++op) {
          for (std::int64_t j = op * s.Q + first; j < op * s.Q + last; ++j) {
            masks[tap * vectors + j / 32] |= __mmask32(1) << (j % 32);
          }
        }
      }
    }
    masks_of = shape;
  }
  const __mmask32 tail = pq % 32 == 0 ? ~__mmask32(0) : (__mmask32(1) << (pq % 32)) - 1;
  const auto plane_start = reinterpret_cast<std::uintptr_t>(x);
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t tap = 0; tap < taps; ++tap) {
      // x + shift as an address: the masks keep every lane read inside the plane.
      const std::uintptr_t run =
          plane_start + static_cast<std::uintptr_t>((c * s.H * s.W + shifts[tap]) * 2);
      bfloat16* row = col + (c * taps + tap) * ld;
      const __mmask32* mask = masks.data() + tap * vectors;
      for (std::int64_t v = 0; v < vectors; ++v) {
        const __m512i values = _mm512_maskz_loadu_epi16(
            mask[v], reinterpret_cast<const void*>(run + static_cast<std::uintptr_t>(64 * v)));
        if (v + 1 < vectors) {
          _mm512_storeu_si512(row + 32 * v, values);
        } else {
          _mm512_mask_storeu_epi16(row + 32 * v, tail, values);
        }
      }
    }
  }
}
#endif

}  // namespace

// col[(c,r,s), (p,q)] = x[c, h(p,r), w(q,s)], zero where (h, w) falls in the padding.
template <typename T>
void im2col(T* col, const T* x, const Conv2dShape& s, std::int64_t ld) {
  const Conv2dParams& p = s.params;
#if TL_CPU_X86
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (im2col_flat_bf16_runs(s)) {
      im2col_flat_bf16_avx512(col, x, s, ld);
      return;
    }
  }
#endif
  // x: [C,H,W], col: [C*R*S, P*Q]; (r, kq) is the kernel tap, (op, oq) the output pixel.
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t r = 0; r < s.R; ++r) {
      for (std::int64_t kq = 0; kq < s.S; ++kq) {
        T* row = col + ((c * s.R + r) * s.S + kq) * ld;
        const auto [first, last] = valid_columns(s, kq);
        if (flat_runs(s)) {
          const auto [first_row, last_row, shift] = flat_run(s, r, kq);
          if (first_row == last_row || first == last) {
            std::fill(row, row + s.P * s.Q, T{});
            continue;
          }
          std::fill(row, row + first_row * s.Q, T{});
          std::fill(row + last_row * s.Q, row + s.P * s.Q, T{});
          const std::int64_t begin = first_row * s.Q + first, end = (last_row - 1) * s.Q + last;
          const T* in = x + c * s.H * s.W + begin + shift;
          std::copy(in, in + (end - begin), row + begin);
          zero_edge_columns(row, first_row, last_row, first, last, s.Q);
          continue;
        }
        const std::int64_t w_first = first * p.stride_w - p.pad_w + kq * p.dilation_w;
        for (std::int64_t op = 0; op < s.P; ++op) {
          const std::int64_t h = op * p.stride_h - p.pad_h + r * p.dilation_h;
          T* out = row + op * s.Q;
          if (h < 0 || h >= s.H) {
            std::fill(out, out + s.Q, T{});
            continue;
          }
          const T* in = x + (c * s.H + h) * s.W + w_first;
          std::fill(out, out + first, T{});
          if (p.stride_w == 1) {  // a contiguous run: a copy the compiler vectorizes
            std::copy(in, in + (last - first), out + first);
          } else {
            for (std::int64_t oq = first; oq < last; ++oq) out[oq] = in[(oq - first) * p.stride_w];
          }
          std::fill(out + last, out + s.Q, T{});
        }
      }
    }
  }
}

// The adjoint of im2col: x[c, h(p,r), w(q,s)] += col[(c,r,s), (p,q)] for every
// patch element that is not padding, onto x as it is or (assign) onto zeros. With
// flat runs, col's padding columns are zeroed first, so that the run adds exact
// zeros where it wraps (col is scratch, consumed here).
template <typename T>
void col2im_add(T* x, T* col, const Conv2dShape& s, bool assign) {
  const Conv2dParams& p = s.params;
  // x: [C,H,W], col: [C*R*S, P*Q]
#if TL_CPU_X86
  if constexpr (std::is_same_v<T, float>) {
    if (flat_runs(s) && s.R * s.S <= 16 && s.H * s.W <= 512 && avx2_selected()) {
      TapRun taps[16];
      for (std::int64_t c = 0; c < s.C; ++c) {
        int count = 0;
        for (std::int64_t r = 0; r < s.R; ++r) {
          for (std::int64_t kq = 0; kq < s.S; ++kq) {
            float* row = col + ((c * s.R + r) * s.S + kq) * s.P * s.Q;
            const auto [first, last] = valid_columns(s, kq);
            const auto [first_row, last_row, shift] = flat_run(s, r, kq);
            if (first_row == last_row || first == last) continue;
            zero_edge_columns(row, first_row, last_row, first, last, s.Q);
            const std::int64_t begin = first_row * s.Q + first, end = (last_row - 1) * s.Q + last;
            taps[count++] = {row, begin + shift, end + shift, shift};
          }
        }
        col2im_plane_avx2(x + c * s.H * s.W, s.H * s.W, taps, count, assign);
      }
      return;
    }
    if (col2im_gathers(s) && avx2_selected()) {
      for (std::int64_t c = 0; c < s.C; ++c) {
        col2im_gather_avx2(x + c * s.H * s.W, col + c * 9 * s.P * s.Q, s, assign);
      }
      return;
    }
    // Only where the taps add at least as many values as the plane's copy moves (not
    // a 1x1 kernel, whose taps reach a quarter of the pixels).
    if (p.stride_w == 2 && s.H * s.W <= kStride2Plane && s.R * s.S * s.P * s.Q >= s.H * s.W &&
        avx2_selected()) {
      for (std::int64_t c = 0; c < s.C; ++c) {
        col2im_stride2_avx2(x + c * s.H * s.W, col + c * s.R * s.S * s.P * s.Q, s, assign);
      }
      return;
    }
  }
#endif
  if (assign) std::fill(x, x + s.C * s.H * s.W, T(0));
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t r = 0; r < s.R; ++r) {
      for (std::int64_t kq = 0; kq < s.S; ++kq) {
        T* row = col + ((c * s.R + r) * s.S + kq) * s.P * s.Q;
        const auto [first, last] = valid_columns(s, kq);
        if (flat_runs(s)) {
          const auto [first_row, last_row, shift] = flat_run(s, r, kq);
          if (first_row == last_row || first == last) continue;
          zero_edge_columns(row, first_row, last_row, first, last, s.Q);
          const std::int64_t begin = first_row * s.Q + first, end = (last_row - 1) * s.Q + last;
          T* out = x + c * s.H * s.W + begin + shift;
          const T* in = row + begin;
          for (std::int64_t i = 0; i < end - begin; ++i) out[i] += in[i];
          continue;
        }
        const std::int64_t w_first = first * p.stride_w - p.pad_w + kq * p.dilation_w;
        for (std::int64_t op = 0; op < s.P; ++op) {
          const std::int64_t h = op * p.stride_h - p.pad_h + r * p.dilation_h;
          if (h < 0 || h >= s.H) continue;
          T* out = x + (c * s.H + h) * s.W + w_first;
          const T* in = row + op * s.Q;
          if (p.stride_w == 1) {  // contiguous: the compiler vectorizes the adds
            for (std::int64_t oq = first; oq < last; ++oq) out[oq - first] += in[oq];
          } else {
            for (std::int64_t oq = first; oq < last; ++oq) out[(oq - first) * p.stride_w] += in[oq];
          }
        }
      }
    }
  }
}

template void im2col<float>(float*, const float*, const Conv2dShape&, std::int64_t);
template void im2col<double>(double*, const double*, const Conv2dShape&, std::int64_t);
template void im2col<bfloat16>(bfloat16*, const bfloat16*, const Conv2dShape&, std::int64_t);
template void col2im_add<float>(float*, float*, const Conv2dShape&, bool);
template void col2im_add<double>(double*, double*, const Conv2dShape&, bool);

}  // namespace towerlab::cpu
