// CUDA conv2d (contracts and dimension letters in kernels/conv2d.h): float32, and
// bfloat16 or float16 operands with float32 sums on the tensor cores (the three
// problems below over 16-bit values, on tc_gemm_kernel: kernels/cuda/conv2d_tc.cuh).
//
// All three passes are implicit GEMMs: tiled matrix-product kernels whose
// operands are gathered straight from the NCHW tensors, so no im2col matrix is
// ever written to memory. The exception: 3x3 stride-1 layers wide enough take
// Winograd F(4x4,3x3), each pass where winograd_chosen says so
// (kernels/cuda/conv2d_winograd.h), dispatched in the entry points.
//   pass             rows (m)        columns (n)    reduction (kk)   A[m,kk]        B[kk,n]
//   forward          N*P*Q (n,p,q)   K              C*R*S (c,r,s)    x patch        weight
//   backward-data    N*H*W (n,h,w)   C              K*R*S (k,r,s)    grad_y patch   weight
//   backward-weight  K               C*R*S          N*P*Q            grad_y         x patch
// A "problem" struct describes each pass: how to gather A and B (zero in the
// padding and, for backward-data with stride > 1, where no output pixel lands)
// and how to write the result (assign y plus bias; add to grad_x; add to
// grad_weight). Backward-weight's reduction is long and its output small: when
// its tiles leave SMs idle it is split over contiguous ranges of (image, pixel)
// pairs, as many as fill the resident block slots in one wave
// (plan_weight_split), into partials that split_reduce
// (kernels/cuda/split_reduce.cuh) adds in a fixed tree and accumulates into
// grad_weight (deterministic, unlike atomics); its operands are copied by
// cp.async, each thread decoding one (image, pixel) pair per step for all of
// its copies (pipelined_pixel_kernel). The
// grad_bias sums per (channel, group of images) and reduces the groups the same
// way. Forward and backward-data reduce channel-inner (tap-major) when the
// reduced channels are a multiple of the tile's step, so that each row's pixel
// is located once per step rather than once per element, and copy their
// operands global -> shared by cp.async in a three-stage ring
// (pipelined_gemm_kernel, kernels/cuda/conv2d_implicit_gemm.cuh).
// One input channel (FashionNet's conv1) has direct, memory-bound kernels for
// backward-data and backward-weight instead of GEMM tiles that would be mostly
// padding.
//
// Each layer's speed on a GPU, pass by pass beside cuDNN's best algorithm:
// bench/results/gpu_h100.md.
#include <algorithm>
#include <array>
#include <atomic>

#include "engine/allocator.h"
#include "kernels/cuda/conv2d.h"
#include "kernels/cuda/conv2d_implicit_gemm.cuh"
#include "kernels/cuda/conv2d_tc.cuh"
#include "kernels/cuda/conv2d_winograd.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/split_reduce.cuh"

namespace towerlab::cuda {

namespace {

using conv2d_gemm::implicit_gemm_kernel;
using conv2d_gemm::pipelined_gemm_kernel;
using conv2d_gemm::pipelined_pixel_kernel;
using conv2d_gemm::tc_gemm_kernel;
using conv2d_gemm::TcTile;
using conv2d_gemm::Tile;

// Integer division by a divisor fixed for the whole launch, as a multiply-high
// and a shift (CUTLASS's FastDivmod): the gathers divide every index by C*R*S,
// S, P*Q, Q..., and a hardware-less 32-bit division costs ~20 instructions.
// Exact for 0 <= n < 2^31.
struct FastDivmod {
  int divisor = 1;
  unsigned multiplier = 0, shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(int d) : divisor(d) {
    if (d != 1) {
      int log2 = 31 - __builtin_clz(static_cast<unsigned>(d));
      log2 += (d & (d - 1)) != 0;  // ceil(log2(d))
      const unsigned p = 31 + static_cast<unsigned>(log2);
      multiplier = static_cast<unsigned>(((1ull << p) + static_cast<unsigned>(d) - 1) /
                                         static_cast<unsigned>(d));
      shift = p - 32;
    }
  }
  __device__ int div(int n) const {
    return divisor == 1 ? n
                        : static_cast<int>(__umulhi(static_cast<unsigned>(n), multiplier) >> shift);
  }
  __device__ void divmod(int n, int& quotient, int& remainder) const {
    quotient = div(n);
    remainder = n - quotient * divisor;
  }
};

// The problem's sizes as 32-bit ints (the launcher checked that every tensor has
// fewer than 2^31 elements) and the divisors the gathers need.
struct Dims {
  int N, C, H, W, K, R, S, P, Q;
  int stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  int HW, PQ, RS, CRS;
  FastDivmod by_RS, by_S, by_PQ, by_Q, by_HW, by_W, by_stride_h, by_stride_w, by_C, by_K;
};

Dims make_dims(const Conv2dShape& s) {
  Dims d{};
  d.N = static_cast<int>(s.N), d.C = static_cast<int>(s.C), d.H = static_cast<int>(s.H);
  d.W = static_cast<int>(s.W), d.K = static_cast<int>(s.K), d.R = static_cast<int>(s.R);
  d.S = static_cast<int>(s.S), d.P = static_cast<int>(s.P), d.Q = static_cast<int>(s.Q);
  d.stride_h = static_cast<int>(s.params.stride_h),
  d.stride_w = static_cast<int>(s.params.stride_w);
  d.pad_h = static_cast<int>(s.params.pad_h), d.pad_w = static_cast<int>(s.params.pad_w);
  d.dilation_h = static_cast<int>(s.params.dilation_h);
  d.dilation_w = static_cast<int>(s.params.dilation_w);
  d.HW = d.H * d.W, d.PQ = d.P * d.Q, d.RS = d.R * d.S, d.CRS = d.C * d.RS;
  d.by_RS = FastDivmod(d.RS), d.by_S = FastDivmod(d.S), d.by_PQ = FastDivmod(d.PQ);
  d.by_Q = FastDivmod(d.Q), d.by_HW = FastDivmod(d.HW), d.by_W = FastDivmod(d.W);
  d.by_stride_h = FastDivmod(d.stride_h), d.by_stride_w = FastDivmod(d.stride_w);
  d.by_C = FastDivmod(d.C), d.by_K = FastDivmod(d.K);
  return d;
}

// ---- the three passes as GEMM problems -------------------------------------
// Each gives: M, Ncols, Kred (the GEMM's sizes); Row row(m) and a(row, kk) for A;
// Col col(n) and b(kk, col) for B; Out out(m) and store(out, n, value, split).
// row/col/out are computed once per thread, a/b once per loaded element. Where
// vector_rows is set, rows m..m+3 (m a multiple of 4) are neighbours in memory
// with m 16-byte aligned, and store4 writes them at once: a warp then stores
// whole sectors instead of every fourth float of 16 of them. V is the operands'
// type: float, or std::uint16_t, the bits of bfloat16 or float16 values, which
// tc_gemm_kernel multiplies on the tensor cores (zero is 0 in both); results are
// float32 either way.

template <class V>
struct ForwardProblem {
  Dims d;
  const V* x;       // [N,C,H,W]
  const V* weight;  // [K, C*R*S]
  const float* bias;    // [K] or nullptr
  float* y;             // [N,K,P,Q]
  int M, Ncols, Kred;

  struct Row {
    int image_offset, h0, w0;
  };
  __device__ Row row(int m) const {
    int n, pq, p, q;
    d.by_PQ.divmod(m, n, pq);
    d.by_Q.divmod(pq, p, q);
    return {n * d.C * d.HW, p * d.stride_h - d.pad_h, q * d.stride_w - d.pad_w};
  }
  __device__ V a(const Row& row, int crs) const {
    int c, rs, r, s;
    d.by_RS.divmod(crs, c, rs);
    d.by_S.divmod(rs, r, s);
    const int h = row.h0 + r * d.dilation_h, w = row.w0 + s * d.dilation_w;
    if (static_cast<unsigned>(h) >= static_cast<unsigned>(d.H) ||
        static_cast<unsigned>(w) >= static_cast<unsigned>(d.W)) {
      return V{};
    }
    return __ldg(x + row.image_offset + c * d.HW + h * d.W + w);
  }
  struct Col {
    int offset;
  };
  __device__ Col col(int k) const { return {k * d.CRS}; }
  __device__ V b(int crs, const Col& col) const { return __ldg(weight + col.offset + crs); }

  // The channel-inner order (see pipelined_gemm_kernel): kk = rs*C + c, one tap per step.
  struct Step {
    int rs, c0, dh, dw;  // the step's tap, its first channel, the tap's pixel offset
  };
  __device__ Step step(int k0) const {
    int rs, c0, r, s;
    d.by_C.divmod(k0, rs, c0);
    d.by_S.divmod(rs, r, s);
    return {rs, c0, r * d.dilation_h, s * d.dilation_w};
  }
  // x index of (n, c0, h, w) that the step's tap reads for this row, or -1 in the padding.
  __device__ int a_base(const Row& row, const Step& st) const {
    const int h = row.h0 + st.dh, w = row.w0 + st.dw;
    if (static_cast<unsigned>(h) >= static_cast<unsigned>(d.H) ||
        static_cast<unsigned>(w) >= static_cast<unsigned>(d.W)) {
      return -1;
    }
    return row.image_offset + st.c0 * d.HW + h * d.W + w;
  }
  __device__ const V* a_src(int base, int dc) const { return x + base + dc * d.HW; }
  __device__ const V* b_src(const Step& st, int dc, const Col& col) const {
    return weight + col.offset + (st.c0 + dc) * d.RS + st.rs;
  }
  struct Out {
    int offset;
  };  // y index of (n, k = 0, p, q)
  __device__ Out out(int m) const {
    int n, pq;
    d.by_PQ.divmod(m, n, pq);
    return {n * d.K * d.PQ + pq};
  }
  __device__ void store(const Out& o, int k, float value, int) const {
    y[o.offset + k * d.PQ] = value + (bias != nullptr ? __ldg(bias + k) : 0.0f);
  }
  // Rows m..m+3 at once (when vector_rows: they are neighbours in one plane, 16-byte aligned).
  bool vector_rows;
  __device__ void store4(const Out& o, int k, float4 v, int) const {
    const float b = bias != nullptr ? __ldg(bias + k) : 0.0f;
    v.x += b, v.y += b, v.z += b, v.w += b;
    *reinterpret_cast<float4*>(y + o.offset + k * d.PQ) = v;
  }
};

template <class V>
struct BackwardDataProblem {
  Dims d;
  const V* grad_y;  // [N,K,P,Q]
  const V* weight;  // [K,C,R,S]
  float* grad_x;        // [N,C,H,W]
  int M, Ncols, Kred;

  struct Row {
    int image_offset, h, w;
  };  // h, w: padded input coordinates
  __device__ Row row(int m) const {
    int n, hw, h, w;
    d.by_HW.divmod(m, n, hw);
    d.by_W.divmod(hw, h, w);
    return {n * d.K * d.PQ, h + d.pad_h, w + d.pad_w};
  }
  // grad_y[n,k,p,q] for the output pixel whose tap (r,s) lands on this row's
  // input pixel, or 0 when none does (off the output, or between strides).
  __device__ V a(const Row& row, int krs) const {
    int k, rs, r, s;
    d.by_RS.divmod(krs, k, rs);
    d.by_S.divmod(rs, r, s);
    const int th = row.h - r * d.dilation_h, tw = row.w - s * d.dilation_w;
    if (th < 0 || tw < 0) return V{};
    int p, q, rem_h, rem_w;
    d.by_stride_h.divmod(th, p, rem_h);
    d.by_stride_w.divmod(tw, q, rem_w);
    if ((rem_h | rem_w) != 0 || p >= d.P || q >= d.Q) return V{};
    return __ldg(grad_y + row.image_offset + k * d.PQ + p * d.Q + q);
  }
  struct Col {
    int offset;
  };
  __device__ Col col(int c) const { return {c * d.RS}; }
  __device__ V b(int krs, const Col& col) const {
    int k, rs;
    d.by_RS.divmod(krs, k, rs);
    return __ldg(weight + k * d.CRS + col.offset + rs);
  }

  // The channel-inner order (see pipelined_gemm_kernel): kk = rs*K + k, one tap per step.
  struct Step {
    int rs, k0, dh, dw;  // the step's tap, its first channel, the tap's pixel offset
  };
  __device__ Step step(int kk0) const {
    int rs, k0, r, s;
    d.by_K.divmod(kk0, rs, k0);
    d.by_S.divmod(rs, r, s);
    return {rs, k0, r * d.dilation_h, s * d.dilation_w};
  }
  // grad_y index of (n, k0, p, q) whose tap lands on this row's pixel, or -1.
  __device__ int a_base(const Row& row, const Step& st) const {
    const int th = row.h - st.dh, tw = row.w - st.dw;
    if (th < 0 || tw < 0) return -1;
    int p, q, rem_h, rem_w;
    d.by_stride_h.divmod(th, p, rem_h);
    d.by_stride_w.divmod(tw, q, rem_w);
    if ((rem_h | rem_w) != 0 || p >= d.P || q >= d.Q) return -1;
    return row.image_offset + st.k0 * d.PQ + p * d.Q + q;
  }
  __device__ const V* a_src(int base, int dk) const { return grad_y + base + dk * d.PQ; }
  __device__ const V* b_src(const Step& st, int dk, const Col& col) const {
    return weight + (st.k0 + dk) * d.CRS + col.offset + st.rs;
  }
  struct Out {
    int offset;
  };  // grad_x index of (n, c = 0, h, w)
  __device__ Out out(int m) const {
    int n, hw;
    d.by_HW.divmod(m, n, hw);
    return {n * d.C * d.HW + hw};
  }
  __device__ void store(const Out& o, int c, float value, int) const {
    grad_x[o.offset + c * d.HW] += value;
  }
  bool vector_rows;
  __device__ void store4(const Out& o, int c, float4 v, int) const {
    float4* p = reinterpret_cast<float4*>(grad_x + o.offset + c * d.HW);
    const float4 old = *p;
    *p = make_float4(old.x + v.x, old.y + v.y, old.z + v.z, old.w + v.w);
  }
};

template <class V>
struct BackwardWeightProblem {
  Dims d;
  const V* grad_y;  // [N,K,P,Q]
  const V* x;       // [N,C,H,W]
  float* grad_weight;   // [K, C*R*S]
  float* partial;       // [splits, K, C*R*S] when the reduction is split, else nullptr
  int M, Ncols, Kred;

  // pipelined_pixel_kernel's interface: a row (output channel k), a column (tap
  // (c, r, s)) and one (image, pixel) pair npq per thread and step, decoded once
  // for all of the thread's copies; each address is then one add and a bounds check.
  struct Row {
    int offset;  // grad_y index of (0, k, 0, 0)
  };
  __device__ Row row(int k) const { return {k * d.PQ}; }
  // The tap's offset (h0, w0) from an output pixel's corner (p*stride_h,
  // q*stride_w) and its x index relative to that corner, c*H*W + h0*W + w0.
  struct Col {
    int offset, h0, w0;
  };
  __device__ Col col(int crs) const {
    int c, rs, r, s;
    d.by_RS.divmod(crs, c, rs);
    d.by_S.divmod(rs, r, s);
    const int h0 = r * d.dilation_h - d.pad_h, w0 = s * d.dilation_w - d.pad_w;
    return {c * d.HW + h0 * d.W + w0, h0, w0};
  }
  // The pair's corner (h, w) = (p*stride_h, q*stride_w), the grad_y index of
  // (n, 0, p, q) and the x index of (n, 0, h, w).
  struct Pixel {
    int grad_y_offset, x_offset, h, w;
    bool valid;  // inside the block's split
  };
  __device__ Pixel pixel(int npq, int k_end) const {
    const bool valid = npq < k_end;
    int n, pq, p, q;
    d.by_PQ.divmod(valid ? npq : 0, n, pq);
    d.by_Q.divmod(pq, p, q);
    const int h = p * d.stride_h, w = q * d.stride_w;
    return {n * d.K * d.PQ + pq, n * d.C * d.HW + h * d.W + w, h, w, valid};
  }
  // Where A[k, npq] and B[npq, crs] are: false (src the operand's first element)
  // where the value is 0, past the split or in the padding.
  __device__ bool a_src(const Row& row, const Pixel& px, const V*& src) const {
    src = px.valid ? grad_y + px.grad_y_offset + row.offset : grad_y;
    return px.valid;
  }
  __device__ bool b_src(const Pixel& px, const Col& col, const V*& src) const {
    const int h = px.h + col.h0, w = px.w + col.w0;
    const bool inside = px.valid && static_cast<unsigned>(h) < static_cast<unsigned>(d.H) &&
                        static_cast<unsigned>(w) < static_cast<unsigned>(d.W);
    src = inside ? x + px.x_offset + col.offset : x;
    return inside;
  }
  // One element at a time (tc_gemm_kernel's interface): A[k, npq] and B[npq, crs].
  __device__ V a(const Row& row, int npq) const {
    const V* src;
    return a_src(row, pixel(npq, Kred), src) ? __ldg(src) : V{};
  }
  __device__ V b(int npq, const Col& col) const {
    const V* src;
    return b_src(pixel(npq, Kred), col, src) ? __ldg(src) : V{};
  }
  struct Out {
    int offset;
  };
  __device__ Out out(int k) const { return {k * d.CRS}; }
  __device__ void store(const Out& o, int crs, float value, int split) const {
    if (partial != nullptr) {
      partial[std::int64_t{split} * d.K * d.CRS + o.offset + crs] = value;
    } else {
      grad_weight[o.offset + crs] += value;
    }
  }
  // Rows are output channels, CRS apart: no vector stores.
  static constexpr bool vector_rows = false;
  static_assert(!vector_rows);  // referenced where no kernel stores rows (the tensor cores')
  __device__ void store4(const Out&, int, float4, int) const {}
};

// ---- grad_bias ---------------------------------------------------------------

// partial[g, k] = sum of grad_y[n,k,:,:] over the images n of group g.
__global__ void bias_partial_kernel(float* partial, const float* grad_y, int N, int K, int PQ,
                                    int images_per_group) {
  const int k = static_cast<int>(blockIdx.x), group = static_cast<int>(blockIdx.y);
  const int n_end = min(N, (group + 1) * images_per_group);
  float total = 0.0f;
  for (int n = group * images_per_group; n < n_end; ++n) {
    const float* plane = grad_y + (static_cast<std::int64_t>(n) * K + k) * PQ;  // [P*Q]
    for (int i = static_cast<int>(threadIdx.x); i < PQ; i += kBlockSize) total += __ldg(plane + i);
  }
  total = block_sum<kBlockSize>(total);
  if (threadIdx.x == 0) partial[group * K + k] = total;
}

// ---- one input channel (FashionNet's conv1) ---------------------------------
// With C = 1 the GEMMs degenerate: backward-data has one output column and
// backward-weight a [K x R*S] result (32 x 9) reduced over every (image, pixel).
// Both are memory-bound (grad_y, N*K*P*Q floats, is read once and dominates),
// so they get direct kernels that stream grad_y with coalesced loads instead of
// tiles that would be mostly padding. Only for R*S <= kMaxTaps (per-thread tap
// arrays in registers); any stride, padding and dilation.

constexpr int kMaxTaps = 9;

// Where tap t = (r, s) of the kernel sits relative to an output pixel's corner:
// h = p*stride_h + tap_h[t], w = q*stride_w + tap_w[t].
struct Taps {
  int h[kMaxTaps], w[kMaxTaps];
};

Taps make_taps(const Dims& d) {
  Taps t{};
  for (int r = 0; r < d.R; ++r) {
    for (int s = 0; s < d.S; ++s) {
      t.h[r * d.S + s] = r * d.dilation_h - d.pad_h;
      t.w[r * d.S + s] = s * d.dilation_w - d.pad_w;
    }
  }
  return t;
}

// backward-weight, C = 1, first stage: block (group, channel block) sums
// grad_y[n,k,p,q] * x[n,0,h,w] over the group's contiguous range of flattened
// (n, p, q) pixels, into partial[k*RS + t][group]. Each warp owns
// kWeightChannelsPerWarp channels; its lanes walk the range 32 pixels at a time
// (consecutive pq: coalesced grad_y loads), gather the pixel's R*S x taps once
// (small image, L1-resident) and use them for every channel they own. The lane
// sums are reduced by warp_sum's fixed butterfly: the same bits every run.
// Registers: kWeightChannelsPerWarp * kMaxTaps accumulators + the taps.
constexpr int kWeightChannelsPerWarp = 4;
constexpr int kWeightWarps = kBlockSize / kWarpSize;
constexpr int kWeightChannelsPerBlock = kWeightWarps * kWeightChannelsPerWarp;

__global__ void __launch_bounds__(kBlockSize)
    one_channel_weight_partial_kernel(const Dims d, const Taps taps, const float* grad_y,
                                      const float* x, float* partial, int pixels_per_group) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int group = static_cast<int>(blockIdx.x), groups = static_cast<int>(gridDim.x);
  const int k0 = (static_cast<int>(blockIdx.y) * kWeightWarps + warp) * kWeightChannelsPerWarp;
  const int begin = group * pixels_per_group;
  const int end = min(d.N * d.PQ, begin + pixels_per_group);
  float acc[kWeightChannelsPerWarp][kMaxTaps] = {};
#pragma unroll 2
  for (int npq = begin + lane; npq < end; npq += kWarpSize) {
    int n, pq, p, q;
    d.by_PQ.divmod(npq, n, pq);
    d.by_Q.divmod(pq, p, q);
    const float* image = x + n * d.HW;
    const int h0 = p * d.stride_h, w0 = q * d.stride_w;
    float xt[kMaxTaps];
#pragma unroll
    for (int t = 0; t < kMaxTaps; ++t) {
      const int h = h0 + taps.h[t], w = w0 + taps.w[t];
      const bool inside = t < d.RS && static_cast<unsigned>(h) < static_cast<unsigned>(d.H) &&
                          static_cast<unsigned>(w) < static_cast<unsigned>(d.W);
      xt[t] = inside ? __ldg(image + h * d.W + w) : 0.0f;
    }
    const float* g = grad_y + (n * d.K + k0) * d.PQ + pq;
#pragma unroll
    for (int c = 0; c < kWeightChannelsPerWarp; ++c) {
      const float gv = k0 + c < d.K ? __ldg(g + c * d.PQ) : 0.0f;
#pragma unroll
      for (int t = 0; t < kMaxTaps; ++t) acc[c][t] = fmaf(gv, xt[t], acc[c][t]);
    }
  }
#pragma unroll
  for (int c = 0; c < kWeightChannelsPerWarp; ++c) {
#pragma unroll
    for (int t = 0; t < kMaxTaps; ++t) {
      const float sum = warp_sum(acc[c][t]);
      if (lane == 0 && k0 + c < d.K && t < d.RS) {
        partial[static_cast<std::int64_t>((k0 + c) * d.RS + t) * groups + group] = sum;
      }
    }
  }
}

// Second stage: out[i] += sum over the groups of partial[i][group], one warp per
// element; each lane adds its strided share in order, then warp_sum's butterfly.
__global__ void __launch_bounds__(kBlockSize)
    sum_groups_kernel(float* out, const float* partial, int count, int groups) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int i =
      static_cast<int>(blockIdx.x) * kWeightWarps + static_cast<int>(threadIdx.x) / kWarpSize;
  if (i >= count) return;  // whole warps leave together
  const float* row = partial + static_cast<std::int64_t>(i) * groups;
  float total = 0.0f;
  for (int g = lane; g < groups; g += kWarpSize) total += row[g];
  total = warp_sum(total);
  if (lane == 0) out[i] += total;
}

// backward-data, C = 1: grad_x[n,0,h,w] += sum over k and taps of
// grad_y[n,k,p,q] * weight[k,0,r,s]. Each thread owns kDataPixels pixels a block
// apart (every load a warp issues is coalesced), finds once which grad_y pixel
// each tap reads (-1: none, off the output or between strides), then walks the
// channels in order: per channel R*S weight loads (uniform: one broadcast each)
// serve kDataPixels * R*S loads of grad_y, which neighbouring taps and lanes
// share through L1.
constexpr int kDataPixels = 2;

__global__ void __launch_bounds__(kBlockSize)
    one_channel_data_kernel(const Dims d, const Taps taps, const float* grad_y, const float* weight,
                            float* grad_x) {
  const int base =
      static_cast<int>(blockIdx.x) * kBlockSize * kDataPixels + static_cast<int>(threadIdx.x);
  const int pixels = d.N * d.HW;
  int plane[kDataPixels];         // grad_y offset of (n, k = 0)
  int at[kDataPixels][kMaxTaps];  // p*Q + q that tap t reads, or -1 (also past the end)
#pragma unroll
  for (int i = 0; i < kDataPixels; ++i) {
    const int m = base + i * kBlockSize;
    int n = 0, hw = 0, h = 0, w = 0;
    if (m < pixels) {
      d.by_HW.divmod(m, n, hw);
      d.by_W.divmod(hw, h, w);
    }
    plane[i] = n * d.K * d.PQ;
#pragma unroll
    for (int t = 0; t < kMaxTaps; ++t) {
      // h = p*stride_h + taps.h[t]  =>  p = (h - taps.h[t]) / stride_h when exact.
      const int th = h - taps.h[t], tw = w - taps.w[t];
      int p, q, rem_h, rem_w;
      d.by_stride_h.divmod(max(th, 0), p, rem_h);
      d.by_stride_w.divmod(max(tw, 0), q, rem_w);
      const bool hit = m < pixels && t < d.RS && th >= 0 && tw >= 0 && (rem_h | rem_w) == 0 &&
                       p < d.P && q < d.Q;
      at[i][t] = hit ? p * d.Q + q : -1;
    }
  }
  float acc[kDataPixels] = {};
  for (int k = 0; k < d.K; ++k) {
    float wk[kMaxTaps];
#pragma unroll
    for (int t = 0; t < kMaxTaps; ++t) wk[t] = t < d.RS ? __ldg(weight + k * d.RS + t) : 0.0f;
#pragma unroll
    for (int i = 0; i < kDataPixels; ++i) {
      const float* g = grad_y + plane[i] + k * d.PQ;
#pragma unroll
      for (int t = 0; t < kMaxTaps; ++t) {
        if (at[i][t] >= 0) acc[i] = fmaf(__ldg(g + at[i][t]), wk[t], acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kDataPixels; ++i) {
    const int m = base + i * kBlockSize;
    if (m < pixels) grad_x[m] += acc[i];
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------------

namespace {

// Output planes of `plane` floats starting at `out` keep every fourth row 16-byte aligned.
bool vector_rows_ok(const float* out, int plane) {
  return plane % 4 == 0 && reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
}

int ceil_div(std::int64_t a, std::int64_t b) {
  return static_cast<int>((a + b - 1) / b);
}

// One block per BM x BN tile of the problem's GEMM.
template <class Problem, class T>
dim3 tile_grid(const Problem& problem) {
  const dim3 grid(ceil_div(problem.M, T::BM), ceil_div(problem.Ncols, T::BN));
  TL_CHECK(grid.y <= 65535, NotSupported,
           "conv2d: " << problem.Ncols << " GEMM columns need " << grid.y
                      << " column tiles; the CUDA kernels handle at most 65535");
  return grid;
}

template <class Problem, class T>
void launch_gemm(const Problem& problem, cudaStream_t stream) {
  implicit_gemm_kernel<Problem, T>
      <<<tile_grid<Problem, T>(problem), T::kThreads, 0, stream>>>(problem);
  TL_CUDA_CHECK_LAUNCH();
}

// Steps in flight in pipelined_gemm_kernel's ring: 3, as cuDNN's FP32 implicit
// GEMMs on this layer; a fourth would cost shared memory that more blocks use better.
constexpr int kStages = 3;

template <class Problem, class T>
void launch_pipelined(const Problem& problem, cudaStream_t stream) {
  pipelined_gemm_kernel<Problem, T, kStages>
      <<<tile_grid<Problem, T>(problem), T::kThreads, 0, stream>>>(problem);
  TL_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_weight(const BackwardWeightProblem<float>& problem, int splits, int k_per_split,
                   cudaStream_t stream) {
  const dim3 grid(ceil_div(problem.M, T::BM), ceil_div(problem.Ncols, T::BN), splits);
  TL_CHECK(grid.y <= 65535 && grid.z <= 65535, NotSupported,
           "conv2d: " << problem.Ncols << " GEMM columns need " << grid.y
                      << " column tiles; the CUDA kernels handle at most 65535");
  pipelined_pixel_kernel<BackwardWeightProblem<float>, T, kStages>
      <<<grid, T::kThreads, 0, stream>>>(problem, k_per_split);
  TL_CUDA_CHECK_LAUNCH();
}

// Forward and backward-data: many rows (pixels), few columns (channels). Tiles
// are tried from the largest (most reuse of each loaded value) down, no wider than
// the channels need; the first that gives every SM two blocks is taken, else the
// smallest (small batches and images: more blocks in flight beat reuse). The
// reduction runs channel-inner when the reduced channels (`channels`: C forward,
// K backward-data) are a multiple of the step BK.
template <class Problem>
void launch_pixel_rows(const Problem& problem, int channels, int sms, cudaStream_t stream) {
  auto enough = [&]<class T>() {
    return std::int64_t{ceil_div(problem.M, T::BM)} * ceil_div(problem.Ncols, T::BN) >= 2 * sms;
  };
  // Channel-inner goes to pipelined_gemm_kernel, with PIPELINED_BLOCKS its
  // MIN_BLOCKS (without implicit_gemm_kernel's staging registers it fits more
  // blocks per SM than the natural order does).
  auto launch = [&]<class T, int PIPELINED_BLOCKS = T::kMinBlocks>() {
    if (channels % T::BK == 0) {
      using Pipelined = Tile<T::BM, T::BN, T::BK, T::TM, T::TN, PIPELINED_BLOCKS>;
      launch_pipelined<Problem, Pipelined>(problem, stream);
    } else {
      launch_gemm<Problem, T>(problem, stream);
    }
  };
  using T128x8 = Tile<128, 8, 8, 4, 4>;
  using T128x128 = Tile<128, 128, 8, 8, 8, 2>;
  using T128x64 = Tile<128, 64, 8, 8, 4>;
  using T64x64 = Tile<64, 64, 8, 4, 4>;
  // 128x32: 8x4 per thread, 128 threads. With 4x4 (256 threads) a warp's 32
  // distinct A float4 reads per step cost four shared-memory wavefronts for 16
  // FMAs per thread, past what the SM's one wavefront per clock feeds; 8x4 reads
  // the same four for 32. ptxas: 125 registers in the natural order (forward),
  // 4 blocks per SM; pipelined, 96 uncapped and 80 capped at 6 blocks per SM, no
  // spills, 15.4 KB shared (6 blocks fit the 100 KB carveout): 792 slots, so
  // FashionNet's conv2 at batch 512 (784 blocks of grad_x rows) runs in one wave
  // rather than 528 and a tail of 256.
  using T128x32 = Tile<128, 32, 8, 8, 4>;
  using T64x32 = Tile<64, 32, 8, 4, 4>;
  if (problem.Ncols <= 8) {
    launch.template operator()<T128x8>();
  } else if (problem.Ncols > 64 && enough.template operator()<T128x128>()) {
    launch.template operator()<T128x128>();
  } else if (problem.Ncols > 32 && enough.template operator()<T128x64>()) {
    launch.template operator()<T128x64>();
  } else if (problem.Ncols > 32 && enough.template operator()<T64x64>()) {
    launch.template operator()<T64x64>();
  } else if (problem.Ncols <= 32 && enough.template operator()<T128x32>()) {
    launch.template operator()<T128x32, 6>();
  } else {
    launch.template operator()<T64x32>();
  }
}

// The C = 1 kernels above, for layers whose kernel has at most kMaxTaps taps.
bool one_channel(const Dims& d) {
  return d.C == 1 && d.RS <= kMaxTaps;
}

void one_channel_backward_data(const Dims& d, float* grad_x, const float* grad_y,
                               const float* weight, const Stream& stream) {
  const int blocks = ceil_div(std::int64_t{d.N} * d.HW, kBlockSize * kDataPixels);
  one_channel_data_kernel<<<blocks, kBlockSize, 0, native(stream)>>>(d, make_taps(d), grad_y,
                                                                     weight, grad_x);
  TL_CUDA_CHECK_LAUNCH();
}

// The pixels are cut into contiguous groups, in order, so that groups x channel
// blocks is about four blocks per SM (the kernel is memory-bound: enough loads
// in flight) and every lane walks at least four pixels; the group partials are
// summed per weight element in group order.
void one_channel_backward_weight(const Dims& d, float* grad_weight, const float* grad_y,
                                 const float* x, int sms, const Stream& stream) {
  const int channel_blocks = ceil_div(d.K, kWeightChannelsPerBlock);
  const std::int64_t pixels = std::int64_t{d.N} * d.PQ;
  const std::int64_t wanted = std::max(1, ceil_div(4 * std::int64_t{sms}, channel_blocks));
  const std::int64_t by_length = std::max<std::int64_t>(1, pixels / (4 * kWarpSize));
  const int per_group =
      ceil_div(ceil_div(pixels, std::min(wanted, by_length)), kWarpSize) * kWarpSize;
  const int groups = ceil_div(pixels, per_group);
  const int count = d.K * d.RS;
  Scratch partial(stream, static_cast<std::size_t>(count) * groups * sizeof(float));
  cudaStream_t s = native(stream);
  one_channel_weight_partial_kernel<<<dim3(groups, channel_blocks), kBlockSize, 0, s>>>(
      d, make_taps(d), grad_y, x, partial.as<float>(), per_group);
  TL_CUDA_CHECK_LAUNCH();
  sum_groups_kernel<<<ceil_div(count, kWeightWarps), kBlockSize, 0, s>>>(
      grad_weight, partial.as<float>(), count, groups);
  TL_CUDA_CHECK_LAUNCH();
}

// How backward-weight's reduction over the N*P*Q (image, pixel) pairs is cut:
// `splits` contiguous ranges of `k_per_split` pairs (a multiple of the step BK;
// the last range may be shorter), in order.
struct WeightSplitPlan {
  int splits;
  int k_per_split;
};

// The blocks of one launch all run about as long (same tile, same reduction
// length), so the time goes as the blocks on the busiest SM: ceil(blocks / sms)
// of them, each doing 1/blocks of the work. Among the split counts whose blocks
// are all resident at once (at most `resident` per SM, from the kernel's
// __launch_bounds__ and its ptxas registers) the plan takes the one with the
// least work on the busiest SM, the most blocks on a tie (more warps to hide the
// gathers). Rounding the count up past the resident slots (tiles x splits just
// over 2 x 132) would leave a second wave of a few blocks that doubles the time.
// At most kMaxWeightSplits (reduce_weight_splits), each split at least 8 steps
// long.
constexpr int kMaxWeightSplits = 2 * kMaxSplits;

WeightSplitPlan plan_weight_split(std::int64_t length, std::int64_t tiles, int bk, int sms,
                                  int resident) {
  const std::int64_t slots = std::int64_t{sms} * resident;
  if (tiles >= slots || length == 0) return {1, static_cast<int>(length)};
  const std::int64_t most = std::clamp<std::int64_t>(
      std::min<std::int64_t>(slots / tiles, length / (8 * bk)), 1, kMaxWeightSplits);
  std::int64_t best = 1;
  double best_time = 2.0;  // busiest SM's share of the work; 1 is a whole launch on one SM
  for (std::int64_t splits = 1; splits <= most; ++splits) {
    const std::int64_t blocks = tiles * splits;
    const double time = static_cast<double>((blocks + sms - 1) / sms) / static_cast<double>(blocks);
    if (time <= best_time * 1.0001) best = splits, best_time = time;
  }
  const std::int64_t per_split = (length + best - 1) / best;
  const int k_per_split = static_cast<int>((per_split + bk - 1) / bk * bk);
  return {ceil_div(length, k_per_split), k_per_split};  // rounding may leave fewer
}

// grad_weight[i] += the fixed-order sum of partial[s, i] over the plan's splits.
// Up to kMaxSplits: split_reduce's tree. Past it (up to twice as many) two
// stages, still one fixed tree: the splits are paired s with s + half (half =
// ceil(splits / 2), the odd count's missing partner a zeroed slot that the
// caller allocated), each pair added into `pairs` [half, count], then the halves
// through split_reduce.
void reduce_weight_splits(float* grad_weight, float* partial, std::int64_t count, int splits,
                          const Stream& stream) {
  if (splits <= kMaxSplits) {
    split_reduce(partial, count, splits, AccumulateInto{grad_weight}, stream);
    return;
  }
  const int half = (splits + 1) / 2;
  if (splits % 2 != 0) {
    TL_CUDA_CHECK(
        cudaMemsetAsync(partial + splits * count, 0, count * sizeof(float), native(stream)));
  }
  Scratch pairs(stream, static_cast<std::size_t>(half * count) * sizeof(float));
  split_reduce(partial, half * count, 2, StoreInto{pairs.as<float>()}, stream);
  split_reduce(pairs.as<float>(), count, half, AccumulateInto{grad_weight}, stream);
}

// Backward-weight's GEMM over plan_weight_split's splits: launch(problem, splits,
// k_per_split), with problem.partial set where the reduction is split, and then
// the partials added into grad_weight by reduce_weight_splits. The float32 and the
// tensor-core kernels both run through it.
template <class Problem, class Launch>
void split_weight_gemm(Problem problem, std::int64_t tiles, int bk, int resident, int sms,
                       const Stream& stream, Launch launch) {
  const WeightSplitPlan plan = plan_weight_split(problem.Kred, tiles, bk, sms, resident);
  if (plan.splits == 1) {
    launch(problem, 1, problem.Kred);
    return;
  }
  const std::int64_t count = std::int64_t{problem.M} * problem.Ncols;
  const std::int64_t slots = plan.splits + plan.splits % 2;  // an odd count's zeroed slot
  Scratch partial(stream, static_cast<std::size_t>(slots * count) * sizeof(float));
  problem.partial = partial.as<float>();
  launch(problem, plan.splits, plan.k_per_split);
  reduce_weight_splits(problem.grad_weight, partial.as<float>(), count, plan.splits, stream);
}

void backward_weight(const Dims& d, float* grad_weight, const float* grad_y, const float* x,
                     int sms, const Stream& stream) {
  cudaStream_t s = native(stream);
  BackwardWeightProblem<float> problem{};
  problem.d = d;
  problem.grad_y = grad_y;
  problem.x = x;
  problem.grad_weight = grad_weight;
  problem.partial = nullptr;  // set below when the reduction is split
  problem.M = d.K, problem.Ncols = d.CRS, problem.Kred = d.N * d.PQ;
  auto run = [&]<class T>() {
    const std::int64_t tiles = std::int64_t{ceil_div(d.K, T::BM)} * ceil_div(d.CRS, T::BN);
    split_weight_gemm(problem, tiles, T::BK, std::max(1, T::kMinBlocks), sms, stream,
                      [&](const BackwardWeightProblem<float>& split_problem, int splits,
                          int k_per_split) { launch_weight<T>(split_problem, splits, k_per_split, s); });
  };
  // Residency (the Tile's MIN_BLOCKS, ptxas for sm_90, pipelined_pixel_kernel):
  // 32x32x16 64 threads, 121 registers: 8 per SM, planned as 4; 64x64x16 256
  // threads capped at 80 registers (79), no spills, 25.5 KB shared: 3 per SM;
  // 128x128x8 256 threads capped at 128 registers, no spills: 2 per SM.
  if (d.K <= 32) {
    run.template operator()<Tile<32, 32, 16, 4, 4, 4>>();
  } else if (d.K <= 64) {
    run.template operator()<Tile<64, 64, 16, 4, 4, 3>>();
  } else {
    // BK 8 rather than 16: half the gathered columns per thread (their offsets
    // live in registers), so that 128 registers hold the rest and two blocks
    // share an SM.
    run.template operator()<Tile<128, 128, 8, 8, 8, 2>>();
  }
}

void backward_bias(const Dims& d, float* grad_bias, const float* grad_y, int sms,
                   const Stream& stream) {
  // Enough (k, image group) blocks to keep every SM reading; one group per image
  // at most, and no more groups than the reduction's tree holds.
  const int groups = std::clamp(ceil_div(4 * sms, d.K), 1, std::min(d.N, kMaxSplits));
  const int images_per_group = ceil_div(d.N, groups);
  const int used_groups = ceil_div(d.N, images_per_group);
  Scratch partial(stream, static_cast<std::size_t>(d.K) * used_groups * sizeof(float));
  bias_partial_kernel<<<dim3(d.K, used_groups), kBlockSize, 0, native(stream)>>>(
      partial.as<float>(), grad_y, d.N, d.K, d.PQ, images_per_group);
  TL_CUDA_CHECK_LAUNCH();
  split_reduce(partial.as<float>(), d.K, used_groups, AccumulateInto{grad_bias}, stream);
}

// ---- 16-bit operands on tensor cores ---------------------------------------------
// The three problems above over bfloat16 or float16 bits, on tc_gemm_kernel
// (kernels/cuda/conv2d_tc.cuh): every shape, stride, padding and dilation, the
// C = 1 layers included (no direct kernels, no Winograd).

using Bits = std::uint16_t;

// 128x32 (4 warps of 32x32) where the GEMM's columns are at most 32 (ResNet-20's
// 16- and 32-channel layers, FashionNet's conv1), else 64x64 (4 warps of 32x32).
// MIN_BLOCKS 4: 128 registers a thread at most, 20 or 16 KiB of shared memory a block.
using TcNarrow = TcTile<4, 1, 2, 4, 4>;
using TcSquare = TcTile<2, 2, 2, 4, 4>;

const Bits* bits(const Tensor& t) {
  return static_cast<const Bits*>(t.raw_data());
}

template <class Problem, class T>
void launch_tc(const Problem& problem, bool bf16, int splits, int k_per_split,
               cudaStream_t stream) {
  const dim3 grid(ceil_div(problem.M, T::BM), ceil_div(problem.Ncols, T::BN), splits);
  TL_CHECK(grid.y <= 65535 && grid.z <= 65535, NotSupported,
           "conv2d: " << problem.Ncols << " GEMM columns need " << grid.y
                      << " column tiles; the CUDA kernels handle at most 65535");
  const auto kernel =
      bf16 ? tc_gemm_kernel<Problem, T, true> : tc_gemm_kernel<Problem, T, false>;
  kernel<<<grid, T::kThreads, 0, stream>>>(problem, k_per_split);
  TL_CUDA_CHECK_LAUNCH();
}

// Forward and backward-data: rows are pixels, columns channels; one split.
template <class Problem>
void launch_tc_pixel_rows(const Problem& problem, bool bf16, cudaStream_t stream) {
  if (problem.Ncols <= TcNarrow::BN) {
    launch_tc<Problem, TcNarrow>(problem, bf16, 1, problem.Kred, stream);
  } else {
    launch_tc<Problem, TcSquare>(problem, bf16, 1, problem.Kred, stream);
  }
}

void forward_16bit(const Dims& d, float* y, const Bits* x, const Bits* weight, const float* bias,
                   bool bf16, cudaStream_t stream) {
  ForwardProblem<Bits> problem{};
  problem.d = d;
  problem.x = x;
  problem.weight = weight;
  problem.bias = bias;
  problem.y = y;
  problem.M = d.N * d.PQ, problem.Ncols = d.K, problem.Kred = d.CRS;
  launch_tc_pixel_rows(problem, bf16, stream);
}

void backward_data_16bit(const Dims& d, float* grad_x, const Bits* grad_y, const Bits* weight,
                         bool bf16, cudaStream_t stream) {
  BackwardDataProblem<Bits> problem{};
  problem.d = d;
  problem.grad_y = grad_y;
  problem.weight = weight;
  problem.grad_x = grad_x;
  problem.M = d.N * d.HW, problem.Ncols = d.C, problem.Kred = d.K * d.RS;
  launch_tc_pixel_rows(problem, bf16, stream);
}

// Rows are output channels (K), columns taps (C*R*S), the reduction every (image,
// pixel): split as the float32 kernel's is.
void backward_weight_16bit(const Dims& d, float* grad_weight, const Bits* grad_y, const Bits* x,
                           bool bf16, int sms, const Stream& stream) {
  BackwardWeightProblem<Bits> problem{};
  problem.d = d;
  problem.grad_y = grad_y;
  problem.x = x;
  problem.grad_weight = grad_weight;
  problem.partial = nullptr;
  problem.M = d.K, problem.Ncols = d.CRS, problem.Kred = d.N * d.PQ;
  using T = TcSquare;
  const std::int64_t tiles = std::int64_t{ceil_div(d.K, T::BM)} * ceil_div(d.CRS, T::BN);
  split_weight_gemm(problem, tiles, tc::kStepK, T::kMinBlocks, sms, stream,
                    [&](const BackwardWeightProblem<Bits>& split_problem, int splits,
                        int k_per_split) {
                      launch_tc<BackwardWeightProblem<Bits>, T>(split_problem, bf16, splits,
                                                                k_per_split, native(stream));
                    });
}

}  // namespace

void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dShape& shape, const Stream& stream) {
  if (is_16bit(x.dtype())) {
    CudaDeviceGuard guard(stream.device().index);
    forward_16bit(make_dims(shape), y.data<float>(), bits(x), bits(weight),
                  bias.defined() ? bias.data<float>() : nullptr, x.dtype() == DType::BFloat16,
                  native(stream));
    return;
  }
  if (winograd_chosen(shape, WinogradPass::Forward)) {
    winograd_forward(y.data<float>(), x.data<float>(), weight.data<float>(),
                     bias.defined() ? bias.data<float>() : nullptr, shape, stream);
    return;
  }
  CudaDeviceGuard guard(stream.device().index);
  const Dims d = make_dims(shape);
  ForwardProblem<float> problem{};
  problem.d = d;
  problem.x = x.data<float>();
  problem.weight = weight.data<float>();
  problem.bias = bias.defined() ? bias.data<float>() : nullptr;
  problem.y = y.data<float>();
  problem.M = d.N * d.PQ, problem.Ncols = d.K, problem.Kred = d.CRS;
  problem.vector_rows = vector_rows_ok(problem.y, d.PQ);
  launch_pixel_rows(problem, d.C, sm_count(stream.device().index), native(stream));
}

void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dShape& shape, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const Dims d = make_dims(shape);
  const int sms = sm_count(stream.device().index);
  if (is_16bit(grad_y.dtype())) {
    TL_CHECK(!grad_bias.defined(), InvalidArgument,
             "conv2d: the 16-bit backward takes no grad_bias (kernels/conv2d.cpp sums it)");
    const bool bf16 = grad_y.dtype() == DType::BFloat16;
    if (grad_x.defined()) {
      backward_data_16bit(d, grad_x.data<float>(), bits(grad_y), bits(weight), bf16,
                          native(stream));
    }
    if (grad_weight.defined()) {
      backward_weight_16bit(d, grad_weight.data<float>(), bits(grad_y), bits(x), bf16, sms,
                            stream);
    }
    return;
  }
  if (grad_x.defined()) {
    if (winograd_chosen(shape, WinogradPass::BackwardData)) {
      winograd_backward_data(grad_x.data<float>(), grad_y.data<float>(), weight.data<float>(),
                             shape, stream);
    } else if (one_channel(d)) {
      one_channel_backward_data(d, grad_x.data<float>(), grad_y.data<float>(), weight.data<float>(),
                                stream);
    } else {
      BackwardDataProblem<float> problem{};
      problem.d = d;
      problem.grad_y = grad_y.data<float>();
      problem.weight = weight.data<float>();
      problem.grad_x = grad_x.data<float>();
      problem.M = d.N * d.HW, problem.Ncols = d.C, problem.Kred = d.K * d.RS;
      problem.vector_rows = vector_rows_ok(problem.grad_x, d.HW);
      launch_pixel_rows(problem, d.K, sms, native(stream));
    }
  }
  if (grad_weight.defined()) {
    if (winograd_chosen(shape, WinogradPass::BackwardWeight)) {
      winograd_backward_weight(grad_weight.data<float>(), grad_y.data<float>(), x.data<float>(),
                               shape, stream);
    } else if (one_channel(d)) {
      one_channel_backward_weight(d, grad_weight.data<float>(), grad_y.data<float>(),
                                  x.data<float>(), sms, stream);
    } else {
      backward_weight(d, grad_weight.data<float>(), grad_y.data<float>(), x.data<float>(), sms,
                      stream);
    }
  }
  if (grad_bias.defined()) {
    backward_bias(d, grad_bias.data<float>(), grad_y.data<float>(), sms, stream);
  }
}

}  // namespace towerlab::cuda
