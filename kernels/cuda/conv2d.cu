// CUDA conv2d in float32 (contracts and dimension letters in kernels/conv2d.h). The
// tensor cores run the same three problems (kernels/cuda/conv2d_problems.cuh) in
// kernels/cuda/conv2d_tc.cu.
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
// A "problem" struct (kernels/cuda/conv2d_problems.cuh) describes each pass: how
// to gather A and B (zero in the padding and, for backward-data with stride > 1,
// where no output pixel lands) and how to write the result (assign y plus bias;
// add to grad_x; add to grad_weight). Backward-weight's reduction is long and its output small:
// when its tiles leave SMs idle it is split over contiguous ranges of (image, pixel) pairs, as many
// as fill the resident block slots in one wave (plan_weight_split), into partials that split_reduce
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
#include "kernels/cuda/conv2d_problems.cuh"
#include "kernels/cuda/conv2d_winograd.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/split_reduce.cuh"

namespace towerlab::cuda {

namespace {

using conv2d_gemm::BackwardDataProblem;
using conv2d_gemm::BackwardWeightProblem;
using conv2d_gemm::ceil_div;
using conv2d_gemm::Dims;
using conv2d_gemm::ForwardProblem;
using conv2d_gemm::implicit_gemm_kernel;
using conv2d_gemm::make_dims;
using conv2d_gemm::pipelined_gemm_kernel;
using conv2d_gemm::pipelined_pixel_kernel;
using conv2d_gemm::split_weight_gemm;
using conv2d_gemm::Tile;

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
    split_weight_gemm(
        problem, tiles, T::BK, std::max(1, T::kMinBlocks), sms, stream,
        [&](const BackwardWeightProblem<float>& split_problem, int splits, int k_per_split) {
          launch_weight<T>(split_problem, splits, k_per_split, s);
        });
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

}  // namespace

void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dShape& shape, const Stream& stream) {
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