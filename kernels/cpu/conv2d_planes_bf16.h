// conv2d on bfloat16 operands straight from zero-padded planes, on vdpbf16ps
// (internal: kernels/cpu/conv2d_bf16.cpp's bfloat16 path calls it where the layer's stride
// is 1; contracts in kernels/conv2d.h, the pairs vdpbf16ps multiplies in
// kernels/cpu/gemm_bf16.h).
//
// The lowering (im2col + the bfloat16 GEMM) copies every patch into col
// [C*R*S, P*Q], nine times the image for a 3x3 kernel, and the GEMM then packs col
// into its panels: two passes over that matrix for 2 K multiply-adds of each of its
// values. Where K is small (ResNet-20's first stage: 16) those copies cost as much
// as the products. At stride 1 there is nothing to copy: in a plane padded by
// (pad_h, pad_w) and laid out with rows Wp = W + 2 pad_w apart, output (p, q) reads
// tap (r, s) at
//   (p + r dilation_h) Wp + q + s dilation_w  =  o + off(r, s),    o = p Wp + q,
// so every tap of a run of consecutive o is the same run of the plane shifted by
// off(r, s). Outputs are computed on that padded grid, o = 0 .. (P-1) Wp + Q - 1;
// the Wp - Q positions at the end of each row (q >= Q) are computed and thrown
// away, the price of never copying a patch.
//
// Stride 2 (the forward and the weight gradient): the padded plane is split into
// phases, phase (a, b) of a stride (sh, sw) holding the padded pixels
// (i sh + a, j sw + b) at i Wq + j, rows Wq = ceil(Wp / sw) apart. Output (p, q)
// reads tap (r, s), the padded pixel (p sh + r dilation_h, q sw + s dilation_w), in
// phase (r dilation_h mod sh, s dilation_w mod sw) at
//   o + (r dilation_h div sh) Wq + s dilation_w div sw,    o = p Wq + q:
// again one run of a plane shifted, so the same tiles run on the phases, the grid's
// rows Wq apart. (At stride 1 there is one phase, the padded plane.)
//
// Forward (bf16_planes_forward): the planes hold channel pairs, one 32-bit word per
// pixel with channel 2c' in its low half and 2c' + 1 in its high half (an odd C's
// last high half zero), so one unaligned load is sixteen consecutive o, each lane the
// pair vdpbf16ps multiplies by the weight's pair (w[k, 2c', r, s], w[k, 2c'+1, r, s])
// broadcast. A tile is 8 filters by 48 o (24 accumulators), stored straight into y:
// the real outputs in grid order are y's in order, so each vector's real lanes,
// compressed to the front of the register, are one run of y. The input gradient of a
// stride-1 layer is this forward on grad_y (conv2d_bf16.cpp's transposed_shape).
//
// Weight gradient (bf16_planes_weight_grad): the same padded grid, pairs along o
// instead. grad_y is copied onto the grid (zeros at q >= Q, so the thrown-away
// positions add nothing) and x into plain padded planes, one a channel (split into
// its phases at a stride of 2); then
//   grad_weight[k, (c, r, s)] = Σ_o grad_y_grid[k, o] · plane_c[o + off(r, s)],
// two consecutive o a word of each operand, sixteen words a vector, the lanes
// summed once at the end of a group of images.
//
// Bits: each sum is float32 additions of exact products in a fixed order that
// depends on the shape alone (not on the threads, nor on which images share a
// call): the forward sums channel pair by channel pair, tap by tap in (c', r, s)
// order; the weight gradient sums each lane over the group's images in order, then
// the sixteen lanes. Other bits than the lowering's, held to the same bound
// (kernels/conv2d.h: exact products summed in float32).
#pragma once

#include <cstdint>

#include "engine/half.h"
#include "kernels/cpu/conv2d.h"

namespace towerlab::cpu {

// The padded grid both passes compute on (above): `sh` x `sw` phases (the strides;
// one at stride 1), each `hp` rows `wp` apart (at stride 1 the padded plane's), the
// positions o < `outputs` computed, and `farthest`, the offset of the last tap within
// its phase, which a phase must hold past the last position a pass reads.
struct PlanesGrid {
  std::int64_t sh, sw, wp, hp, outputs, farthest;
};

inline PlanesGrid planes_grid(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  const std::int64_t sh = p.stride_h, sw = p.stride_w;
  const std::int64_t wp = (s.W + 2 * p.pad_w + sw - 1) / sw, hp = (s.H + 2 * p.pad_h + sh - 1) / sh;
  return {sh,
          sw,
          wp,
          hp,
          (s.P - 1) * wp + s.Q,
          (s.R - 1) * p.dilation_h / sh * wp + (s.S - 1) * p.dilation_w / sw};
}

// The phase tap (r, c) reads, phases numbered a sw + b.
inline std::int64_t planes_tap_phase(const Conv2dShape& s, const PlanesGrid& g, std::int64_t r,
                                     std::int64_t c) {
  return r * s.params.dilation_h % g.sh * g.sw + c * s.params.dilation_w % g.sw;
}

// off(r, c): where tap (r, c) reads in its phase, from the output's own position on
// the grid.
inline std::int64_t planes_tap_offset(const Conv2dShape& s, const PlanesGrid& g, std::int64_t r,
                                      std::int64_t c) {
  return r * s.params.dilation_h / g.sh * g.wp + c * s.params.dilation_w / g.sw;
}

// Whether the planes path runs for this bfloat16 problem: a stride of 1 or 2 down
// and across (at 2 the forward and the weight gradient: the input gradient of a
// stride-2 layer is no forward convolution), one group, this
// CPU runs vdpbf16ps, the conv2d algorithm Auto (Im2col forces the lowering), a layer
// that needs lowering (a 1x1 one without padding multiplies x as it is), and enough
// of the padded grid real output for the thrown-away positions not to cost more than
// the lowering's copies (the rule is in conv2d_planes_bf16.cpp, with what it was
// measured on).
bool bf16_planes_apply(const Conv2dShape& s);

// The forward's weight, packed once a call: [ceil(K/8), ceil(C/2), R, S, 8] words.
std::int64_t bf16_planes_packed_words(const Conv2dShape& s);
void bf16_planes_pack(const bfloat16* weight, std::uint32_t* packed, const Conv2dShape& s);

// y [N, K, P*Q] = bias (may be null) + the convolution of x [N, C, H, W] by the
// weight bf16_planes_pack packed, or with `accumulate` (bias null) y += it, for
// the images [first, last) (pointers to image 0): float32 sums, or a bfloat16 y
// rounded once from them. One thread; the caller spreads images over its threads.
void bf16_planes_forward(float* y, const bfloat16* x, const std::uint32_t* packed,
                         const float* bias, bool accumulate, std::int64_t first, std::int64_t last,
                         const Conv2dShape& s);
void bf16_planes_forward(bfloat16* y, const bfloat16* x, const std::uint32_t* packed,
                         const float* bias, std::int64_t first, std::int64_t last,
                         const Conv2dShape& s);

// Whether the weight gradient of this problem runs from the planes: where the forward
// does (bf16_planes_apply), and K <= 32. The lowering's weight-gradient product has K
// columns in tiles of 32, part empty below 32; from 32 up the two run level
// (bench/results/conv2d_bf16_planes_*.md).
bool bf16_planes_weight_grad_applies(const Conv2dShape& s);

// The passes below run only where bf16_planes_apply holds (this CPU runs vdpbf16ps).
//
// partial [K, C*R*S] = Σ over images [first, last) of the weight gradient of
// x [N, C, H, W] against grad_y [N, K, P*Q] (pointers to image 0): ASSIGNED. One
// thread; the caller runs groups of images side by side and adds their partials
// in group order.
void bf16_planes_weight_grad(float* partial, const bfloat16* x, const bfloat16* grad_y,
                             std::int64_t first, std::int64_t last, const Conv2dShape& s);

}  // namespace towerlab::cpu
