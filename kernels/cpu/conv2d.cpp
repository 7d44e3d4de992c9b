// CPU conv2d, tested against the plain reference kernels/reference/conv2d.h as
// kernels/cuda/conv2d.cu is (contracts and dimension letters in kernels/conv2d.h).
//
// Each image is lowered to a matrix product ("im2col"): the patch matrix
//   col[(c,r,s), (p,q)] = x[n, c, h(p,r), w(q,s)]            [C*R*S, P*Q]
// turns the convolution into
//   forward          y[n]        = weight · col                [K,P*Q] = [K,CRS]·[CRS,P*Q]
//   backward-weight  grad_weight += grad_y[n] · colᵀ           [K,CRS] = [K,P*Q]·[P*Q,CRS]
//                    (per group of images, in whichever layout suits the GEMM)
//   backward-data    grad_col     = weightᵀ · grad_y[n]         [CRS,P*Q], then col2im adds
//                    each patch element back onto the input pixel it came from.
// A 1x1 kernel with stride 1 and no padding needs no lowering: col is x[n] itself.
// The weight (forward) and its transpose (backward-data), the same A for every image,
// are packed into the GEMM's panels once a call (PackedA, gemm_packed_a: gemm's bits),
// not once an image.
// On AVX2 and AVX-512, the weight gradient of 3x3 layers with stride 1 or 2 skips col altogether
// (kernels/cpu/conv2d_implicit.h), with the same sums in the same order; on AVX2 the forward
// of those layers, where Winograd does not take it, too.
//
// Where Winograd F(2x2,3x3) is chosen (kernels/cpu/winograd.h: 3x3, stride 1, at
// least 16 channels in and out under Auto), it takes all three passes, the weight
// gradient per group of images into the same partials.
//
// One input channel with a 3x3 kernel, unit stride and dilation (a first layer on
// gray images, FashionNet's conv1) skips the lowering where the GEMM has its AVX2
// kernel: its forward and weight gradient run the direct convolution of
// kernels/cpu/conv2d_direct.h.
//
// A 16-bit layer's forward (bfloat16 or float16 y beside float32 operands, the
// dispatch having widened x and the weight) writes y straight from the float32
// sums, each rounded once as it is stored: by Winograd's output transform, by the
// direct kernels' stores, and on the im2col path from each image's float32 block
// just after its GEMM. The backward's outputs are float32.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "engine/settings.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/conv2d_direct.h"
#include "kernels/cpu/conv2d_implicit.h"
#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/winograd.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

bool needs_lowering(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  return !(s.R == 1 && s.S == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 &&
           p.pad_w == 0);
}

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
    for (std::int64_t op = first_row; op < last_row; ++op) row[op * Q + q] = T(0);
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

// col[(c,r,s), (p,q)] = x[c, h(p,r), w(q,s)], zero where (h, w) falls in the padding.
template <typename T>
void im2col(T* col, const T* x, const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  // x: [C,H,W], col: [C*R*S, P*Q]; (r, kq) is the kernel tap, (op, oq) the output pixel.
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t r = 0; r < s.R; ++r) {
      for (std::int64_t kq = 0; kq < s.S; ++kq) {
        T* row = col + ((c * s.R + r) * s.S + kq) * s.P * s.Q;
        const auto [first, last] = valid_columns(s, kq);
        if (flat_runs(s)) {
          const auto [first_row, last_row, shift] = flat_run(s, r, kq);
          if (first_row == last_row || first == last) {
            std::fill(row, row + s.P * s.Q, T(0));
            continue;
          }
          std::fill(row, row + first_row * s.Q, T(0));
          std::fill(row + last_row * s.Q, row + s.P * s.Q, T(0));
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
            std::fill(out, out + s.Q, T(0));
            continue;
          }
          const T* in = x + (c * s.H + h) * s.W + w_first;
          std::fill(out, out + first, T(0));
          if (p.stride_w == 1) {  // a contiguous run: a copy the compiler vectorizes
            std::copy(in, in + (last - first), out + first);
          } else {
            for (std::int64_t oq = first; oq < last; ++oq) out[oq] = in[(oq - first) * p.stride_w];
          }
          std::fill(out + last, out + s.Q, T(0));
        }
      }
    }
  }
}

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
#endif

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

#if TL_CPU_X86
// out[k*rows + i .. +7] += in[(i .. i+7)*cols + k] for one 8 x 8 block (AVX2).
__attribute__((target("avx2,fma"))) void add_transposed_block(float* out, const float* in,
                                                              std::int64_t rows,
                                                              std::int64_t cols) {
  __m256 r[8];
  for (int a = 0; a < 8; ++a) r[a] = _mm256_loadu_ps(in + a * cols);
  transpose8x8(r);
  for (int b = 0; b < 8; ++b) {
    _mm256_storeu_ps(out + b * rows, _mm256_add_ps(_mm256_loadu_ps(out + b * rows), r[b]));
  }
}
#endif

// out [cols, rows] += inᵀ, in [rows, cols]: a weight gradient's partial in the
// layout [C*R*S, K] added to grad_weight [K, C*R*S], element by element (the same
// adds in any blocking), eight by eight through a register transpose where the
// GEMM has AVX2: the strided loop was the whole cost of the partials' reduction.
template <typename T>
void add_transposed(T* out, const T* in, std::int64_t rows, std::int64_t cols) {
  std::int64_t i0 = 0, k0 = 0;
#if TL_CPU_X86
  if constexpr (std::is_same_v<T, float>) {
    if (avx2_selected()) {
      for (; i0 + 8 <= rows; i0 += 8) {
        for (k0 = 0; k0 + 8 <= cols; k0 += 8) {
          add_transposed_block(out + k0 * rows + i0, in + i0 * cols + k0, rows, cols);
        }
        for (std::int64_t k = k0; k < cols; ++k) {  // the last columns
          for (std::int64_t i = i0; i < i0 + 8; ++i) out[k * rows + i] += in[i * cols + k];
        }
      }
    }
  }
#endif
  for (std::int64_t k = 0; k < cols; ++k) {  // the last rows (all of them without AVX2)
    for (std::int64_t i = i0; i < rows; ++i) out[k * rows + i] += in[i * cols + k];
  }
}

// How many contiguous chunks of images to spread over the caller's threads. With
// at least as many images as threads, each thread lowers and multiplies its own
// images (its GEMMs then run inline on that thread: small per-image products
// parallelize badly); with fewer, one chunk walks the images and each GEMM spreads
// over the threads itself. Only loops whose images write disjoint outputs use it:
// their results do not depend on the chunks.
std::int64_t image_chunks(std::int64_t images) {
  const int threads = thread_share();
  return images >= threads ? threads : 1;
}

// The weight gradient sums over images, so its grouping fixes the order of that
// sum: images are summed in kWeightGroups fixed groups (fewer for a smaller batch),
// each into its own partial, and the partials in group order. The groups depend on
// the batch alone, never on the threads, so the result is the same bits for any
// thread count or tower share.
constexpr std::int64_t kWeightGroups = 16;

// The threads to run `chunks` chunks on: the caller's share (at most one a chunk)
// when `parallel`, else one.
int chunk_workers(std::int64_t chunks, bool parallel) {
  return parallel ? static_cast<int>(std::min<std::int64_t>(chunks, thread_share())) : 1;
}

// Runs body(worker, chunk, first_image, end_image) for each of `chunks` even chunks
// of the images, split into `workers` runs of chunks that may run at once: worker w
// runs its run of chunks on one thread, so the caller can allocate a workspace for
// each worker before the loop (the count it passes here, not a thread count read
// again, which may have grown meanwhile when towers lend each other cores).
template <typename Body>
void for_worker_chunks(std::int64_t images, std::int64_t chunks, int workers, const Body& body) {
  auto run = [&](std::int64_t first_worker, std::int64_t end_worker) {
    for (std::int64_t w = first_worker; w < end_worker; ++w) {
      for (std::int64_t chunk = w * chunks / workers; chunk < (w + 1) * chunks / workers; ++chunk) {
        body(static_cast<int>(w), chunk, chunk * images / chunks, (chunk + 1) * images / chunks);
      }
    }
  };
  if (workers == 1) {
    run(0, 1);
  } else {
    parallel_for(0, workers, run);
  }
}

// Runs body(chunk, first_image, end_image) for each of `chunks` even chunks of the
// images, in parallel when `parallel`.
template <typename Body>
void for_image_chunks(std::int64_t images, std::int64_t chunks, bool parallel, const Body& body) {
  for_worker_chunks(images, chunks, chunk_workers(chunks, parallel),
                    [&](int, std::int64_t chunk, std::int64_t first, std::int64_t last) {
                      body(chunk, first, last);
                    });
}

// y = bias + weight · col, image by image (im2col's product; col is x itself when
// nothing needs lowering), T the operands' type (float, or double for the gradient
// checks), Out y's: T, or a 16-bit layer's bfloat16 or float16 beside float
// operands, where each image's float32 sums are rounded from their block (in cache,
// the GEMM just wrote it) before the next image's.
template <typename T, typename Out>
void forward_by_gemm(Out* out, const T* in, const T* w, const T* b, const Conv2dShape& s) {
  constexpr bool rounded = !std::is_same_v<T, Out>;
  const std::int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
  const bool lower = needs_lowering(s);
  // The weight, the GEMM's A for every image, packed once for them all (float32; the
  // float64 gradient checks' gemm is plain loops, with nothing to pack).
  // Where it applies, the implicit forward (kernels/cpu/conv2d_implicit.h) skips col,
  // each thread on its own images (with fewer images than threads the GEMM, which
  // spreads over them, keeps them).
  bool implicit = false;
  if constexpr (std::is_same_v<T, float>) {
    implicit = implicit_forward_applies(s) && image_chunks(s.N) == thread_share();
  }
  std::optional<PackedA> packed_w;
  HostScratch<float> panels(implicit ? implicit_forward_panels(s) : 0);
  if constexpr (std::is_same_v<T, float>) {
    if (implicit) {
      implicit_forward_pack(w, panels.get(), s);
    } else {
      packed_w.emplace(w, crs, s.K, crs);
    }
  }
  auto per_chunk = [&](std::int64_t, std::int64_t first, std::int64_t last) {
    HostScratch<T> col(lower && !implicit ? crs * pq : 0);  // [C*R*S, P*Q]
    HostScratch<float> implicit_scratch(implicit ? implicit_forward_scratch(s) : 0);
    HostScratch<T> sums(rounded ? s.K * pq : 0);  // [K, P*Q], a 16-bit y's
    for (std::int64_t n = first; n < last; ++n) {
      const T* patches = in + n * chw;
      if constexpr (std::is_same_v<T, float>) {
        if (implicit) {
          if constexpr (rounded) {
            implicit_forward(patches, panels.get(), b, sums.get(), implicit_scratch.get(), s);
            round_to_16bit(out + n * s.K * pq, sums.get(), s.K * pq);
          } else {
            implicit_forward(patches, panels.get(), b, out + n * s.K * pq, implicit_scratch.get(),
                             s);
          }
          continue;
        }
      }
      if (lower) {
        im2col(col.get(), patches, s);
        patches = col.get();
      }
      T* y_n;  // [K, P*Q]
      if constexpr (rounded) {
        y_n = sums.get();
      } else {
        y_n = out + n * s.K * pq;
      }
      if (b != nullptr) {
        for (std::int64_t k = 0; k < s.K; ++k) std::fill(y_n + k * pq, y_n + (k + 1) * pq, b[k]);
      }
      const T beta = b != nullptr ? T(1) : T(0);
      if constexpr (std::is_same_v<T, float>) {
        gemm_packed_a(*packed_w, false, pq, patches, pq, beta, y_n, pq);
      } else {
        gemm<T>(false, false, s.K, pq, crs, T(1), w, crs, patches, pq, beta, y_n, pq);
      }
      if constexpr (rounded) round_to_16bit(out + n * s.K * pq, y_n, s.K * pq);
    }
  };
  for_image_chunks(s.N, image_chunks(s.N), true, per_chunk);
}

// The float32 forward into y of type Out: float, or a 16-bit layer's bfloat16 or
// float16, which Winograd's output transform, the direct kernels' stores and the
// GEMM path round once from the float32 sums (the bits of the float32 y cast).
template <typename Out>
void forward_float32(Out* out, const float* in, const float* w, const float* b,
                     const Conv2dShape& s) {
#if TL_CPU_X86
  if constexpr (std::is_same_v<Out, float16>) {
    // The eight-lane stores round float16 with F16C (kernels/cpu/convert16.h):
    // without it the sums go to float32 and then through the cast's own code.
    if (avx2_selected() && !avx512_selected() && !f16c_present()) {
      HostScratch<float> sums(s.N * s.K * s.P * s.Q);  // [N,K,P,Q]
      forward_float32(sums.get(), in, w, b, s);
      round_to_16bit(out, sums.get(), s.N * s.K * s.P * s.Q);
      return;
    }
  }
#endif
  if (winograd_chosen(s)) {
    winograd_forward(out, in, w, b, s);
    return;
  }
  if (direct_single_channel(s, DType::Float32)) {
    const std::int64_t pq = s.P * s.Q, chw = s.C * s.H * s.W;
    for_image_chunks(
        s.N, image_chunks(s.N), true, [&](std::int64_t, std::int64_t first, std::int64_t last) {
          direct_forward(out + first * s.K * pq, in + first * chw, w, b, last - first, s);
        });
    return;
  }
  forward_by_gemm(out, in, w, b, s);
}

}  // namespace

void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dShape& s) {
  if (x.dtype() == DType::Float64) {
    forward_by_gemm(y.data<double>(), x.data<double>(), weight.data<double>(),
                    bias.defined() ? bias.data<double>() : nullptr, s);
    return;
  }
  const float* in = x.data<float>();                               // [N,C,H,W]
  const float* w = weight.data<float>();                           // [K, C*R*S]
  const float* b = bias.defined() ? bias.data<float>() : nullptr;  // [K]
  switch (y.dtype()) {                                             // [N,K,P,Q]
    case DType::BFloat16:
      forward_float32(y.data<bfloat16>(), in, w, b, s);
      return;
    case DType::Float16:
      forward_float32(y.data<float16>(), in, w, b, s);
      return;
    default:
      forward_float32(y.data<float>(), in, w, b, s);
  }
}

void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dShape& s, GradWrite grad_x_write) {
  // An assigned grad_x is never read: each image's is written whole by Winograd's
  // output transform, by the GEMM (beta 0) or by col2im onto zeros, as accumulating
  // onto a zeroed grad_x would.
  const bool assign = grad_x.defined() && grad_x_write == GradWrite::Assign;
  // Winograd takes the input gradient where chosen, and the weight gradient below.
  const bool winograd = grad_y.dtype() == DType::Float32 && winograd_chosen(s);
  if (winograd && grad_x.defined()) {
    winograd_backward_data(grad_x.data<float>(), grad_y.data<float>(), weight.data<float>(), s,
                           !assign);
  }
  with_dtype(grad_y.dtype(), [&]<typename T>() {
    const T* gy = grad_y.data<T>();  // [N,K,P,Q]
    const T* in = x.data<T>();       // [N,C,H,W]
    const T* w = weight.data<T>();   // [K, C*R*S]
    const std::int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;

    if (grad_bias.defined()) {
      T* gb = grad_bias.data<T>();  // [K]
      for (std::int64_t k = 0; k < s.K; ++k) {
        double total = 0;  // float32 sums of 10^5 terms would lose digits
        for (std::int64_t n = 0; n < s.N; ++n) {
          const T* plane = gy + (n * s.K + k) * pq;  // [P*Q]
          for (std::int64_t i = 0; i < pq; ++i) total += plane[i];
        }
        gb[k] += static_cast<T>(total);
      }
    }
    // The weight gradient sums over images, so its groups (kWeightGroups, each
    // summing into its own partial, added to grad_weight in group order) fix the
    // order of that sum. Each image's input gradient is its own product,
    // whatever the groups, so the same groups serve it. With fewer groups than
    // threads, the groups run one after another and each GEMM spreads over the
    // threads instead. Every path writes the partial transposed, [C*R*S, K]: with few
    // taps (C*R*S = 9 in a first layer) the GEMM runs far better with them as rows
    // than as a 9-wide column panel, and add_transposed adds it to grad_weight
    // through register transposes.
    const std::int64_t chunks = std::min(s.N, kWeightGroups);
    const bool direct = grad_weight.defined() && direct_single_channel(s, grad_y.dtype());
    const bool weight_by_winograd = grad_weight.defined() && !direct && winograd;
    const bool weight_by_gemm = grad_weight.defined() && !direct && !winograd;
    const bool data_by_gemm = grad_x.defined() && !winograd;
    // The weight gradient of 3x3 layers of stride 1 or 2 where Winograd is not chosen, on
    // AVX2 and AVX-512: the implicit GEMM (kernels/cpu/conv2d_implicit.h), the
    // GEMM's bits without im2col.
    const bool implicit =
        weight_by_gemm && std::is_same_v<T, float> && implicit_weight_grad_applies(s);
    HostScratch<T> partials(grad_weight.defined() ? chunks * crs * s.K : 0);  // [chunks, CRS, K]
    if constexpr (std::is_same_v<T, float>) {
      if (direct) {
        for_image_chunks(s.N, chunks, chunks >= thread_share(),
                         [&](std::int64_t chunk, std::int64_t first, std::int64_t last) {
                           direct_weight_grad(partials.get() + chunk * crs * s.K, in + first * chw,
                                              gy + first * s.K * pq, last - first, s);
                         });
      }
      if (weight_by_winograd) {
        // Each thread's workspace comes from here, the caller, before the loop: the
        // same allocations every step whichever threads run the groups, which the
        // caching allocator then serves from its blocks (allocated by the threads
        // themselves, two at once or one after the other as they happened to run,
        // a steady step could need a new segment).
        const int workers = chunk_workers(chunks, chunks >= thread_share());
        const std::int64_t each = winograd_weight_grad_scratch(s);
        HostScratch<float> workspaces(workers * each);
        for_worker_chunks(
            s.N, chunks, workers,
            [&](int worker, std::int64_t chunk, std::int64_t first, std::int64_t last) {
              winograd_weight_grad(partials.get() + chunk * crs * s.K, in + first * chw,
                                   gy + first * s.K * pq, last - first, s,
                                   workspaces.get() + worker * each);
            });
      }
    }
    if (weight_by_gemm || data_by_gemm) {
      // Both gradients in one pass over each group's images, col reused.
      const bool lower = needs_lowering(s);
      // grad_col = weightᵀ · grad_y[n]: weightᵀ [C*R*S, K], the GEMM's A for every
      // image, packed once for them all (float32, as in the forward).
      std::optional<PackedA> packed_wt;
      if constexpr (std::is_same_v<T, float>) {
        if (data_by_gemm) packed_wt.emplace(w, crs, crs, s.K, true);
      }
      auto data_gemm = [&](const T* gy_n, T beta, T* out) {  // out [C*R*S, P*Q]
        if constexpr (std::is_same_v<T, float>) {
          gemm_packed_a(*packed_wt, false, pq, gy_n, pq, beta, out, pq);
        } else {
          gemm<T>(true, false, crs, pq, s.K, T(1), w, crs, gy_n, pq, beta, out, pq);
        }
      };
      auto per_group = [&](std::int64_t chunk, std::int64_t first, std::int64_t last) {
        // [C*R*S, P*Q], patches or their gradient
        HostScratch<T> col(lower && (data_by_gemm || !implicit) ? crs * pq : 0);
        HostScratch<float> implicit_scratch(implicit ? implicit_weight_grad_scratch(s) : 0);
        T* sum = weight_by_gemm ? partials.get() + chunk * crs * s.K : nullptr;
        for (std::int64_t n = first; n < last; ++n) {
          const T* gy_n = gy + n * s.K * pq;  // [K, P*Q]
          // The input gradient first: its GEMM reads grad_y[n] row by row, which
          // the prefetcher follows, and leaves it in L2 for the weight gradient's
          // packer, which reads it K rows at a time.
          if (data_by_gemm) {
            T* gx_n = grad_x.data<T>() + n * chw;
            if (!lower) {  // grad_x[n] is the patch matrix's gradient itself: accumulate in place
              data_gemm(gy_n, assign ? T(0) : T(1), gx_n);
            } else {
              data_gemm(gy_n, T(0), col.get());
              col2im_add(gx_n, col.get(), s, assign);
            }
          }
          if (weight_by_gemm) {
            const T* patches = in + n * chw;
            if constexpr (std::is_same_v<T, float>) {
              if (implicit) {
                implicit_weight_grad(patches, gy_n, sum, n == first, implicit_scratch.get(), s);
                continue;
              }
            }
            if (lower) {
              im2col(col.get(), patches, s);
              patches = col.get();
            }
            gemm<T>(false, true, crs, s.K, pq, T(1), patches, pq, gy_n, pq,
                    n == first ? T(0) : T(1), sum, s.K);
          }
        }
      };
      for_image_chunks(s.N, chunks, chunks >= thread_share(), per_group);
    }
    if (grad_weight.defined()) {
      T* gw = grad_weight.data<T>();  // [K, C*R*S]
      for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
        add_transposed(gw, partials.get() + chunk * crs * s.K, crs, s.K);  // [C*R*S, K]
      }
    }
  });
}

}  // namespace towerlab::cpu
