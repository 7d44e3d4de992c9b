// conv2d's three passes as GEMM problems, and the split of the weight gradient's
// reduction: what the float32 kernels (kernels/cuda/conv2d.cu) and the tensor-core
// ones (kernels/cuda/conv2d_tc.cu) share. Contracts and dimension letters in
// kernels/conv2d.h; the table of the three GEMMs in conv2d.cu's opening comment.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/allocator.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/split_reduce.cuh"

namespace towerlab::cuda::conv2d_gemm {

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

inline Dims make_dims(const Conv2dShape& s) {
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

// Integer division rounding up, for grids and splits (both operands positive).
inline int ceil_div(std::int64_t a, std::int64_t b) {
  return static_cast<int>((a + b - 1) / b);
}

// ---- the three passes as GEMM problems -------------------------------------
// Each gives: M, Ncols, Kred (the GEMM's sizes); Row row(m) and a(row, kk) for A;
// Col col(n) and b(kk, col) for B; Out out(m) and store(out, n, value, split).
// row/col/out are computed once per thread, a/b once per loaded element. Where
// vector_rows is set, rows m..m+3 (m a multiple of 4) are neighbours in memory
// with m 16-byte aligned, and store4 writes them at once: a warp then stores
// whole sectors instead of every fourth float of 16 of them. V is the operands'
// type: float (which the float32 kernels multiply as it is, and tc_gemm_kernel
// rounded to TF32), or std::uint16_t, the bits of bfloat16 or float16 values, which
// tc_gemm_kernel multiplies on the tensor cores (zero is 0 in all); results are
// float32 either way.

template <class V>
struct ForwardProblem {
  Dims d;
  const V* x;         // [N,C,H,W]
  const V* weight;    // [K, C*R*S]
  const float* bias;  // [K] or nullptr
  float* y;           // [N,K,P,Q]
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
  float* grad_x;    // [N,C,H,W]
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
  const V* grad_y;     // [N,K,P,Q]
  const V* x;          // [N,C,H,W]
  float* grad_weight;  // [K, C*R*S]
  float* partial;      // [splits, K, C*R*S] when the reduction is split, else nullptr
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

// ---- backward-weight's split of its reduction --------------------------------

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

inline WeightSplitPlan plan_weight_split(std::int64_t length, std::int64_t tiles, int bk, int sms,
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
inline void reduce_weight_splits(float* grad_weight, float* partial, std::int64_t count, int splits,
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

}  // namespace towerlab::cuda::conv2d_gemm
