// CUDA batch normalization (contracts in kernels/batchnorm.h): x, y, grad_y and
// grad_x float32, bfloat16 or float16, the per-channel tensors float32.
//
// Per-channel reductions are two-level (kernels/cuda/per_channel.cuh): a grid of
// (C, splits) blocks writes float partial sums, then one thread per channel adds
// a channel's partials in double. The elementwise pass after a reduction (the
// training forward's normalize, the backward's grad_x) runs on the reduction's own
// (C, splits) grid with each block walking its range backwards, so that it starts
// on what the reduction read last, still in L2, and each block computes its one
// channel's coefficients itself (no C-thread kernel between the two: the training
// forward is three launches, the backward three). Planes of less than a warp of
// units ([N,C] of a dense layer) and the inference forward use a flat resident
// grid whose blocks keep all C coefficients in shared memory.
// Every data-sized kernel is templated on the storage type T of x, y, grad_y and
// grad_x and on its unit V (per_channel.cuh): float4 loads and stores where the
// plane size allows, floats otherwise. A 16-bit T is widened exactly as it is
// loaded and rounded once, to nearest even, as it is stored (load_unit,
// store_unit), so the math is the float32 kernels' whatever T is, and a 16-bit
// result is the float32 result on the widened values, rounded once. The reduction
// grid is at most four 256-thread blocks per SM (splits_for; two for the
// backward, whose apply needs ~110 registers), all resident at once. With the
// whole grid one wave, each thread of the statistics pass has only a few steps
// of loads (three of four float4s at [32,64,56,56]), so it keeps two steps in
// flight (for_each_in_split_pipelined) instead of waiting out a memory round
// trip per step; the training forward's elementwise pass does the same with
// steps of three (kApplySteps); the finishing kernels load eight partials a
// channel before adding any (add_partials), one round trip instead of eight.
//
// Each pass is memory-bound: its speed on a GPU, beside a device copy of the same
// bytes, is in bench/results/gpu_h100.md.
//
// The statistics sum deviations from a per-channel shift K = x[0,c,0] (the
// "shifted data" algorithm): sum(x - K) and sum((x - K)^2) in float lose nothing
// to cancellation when |mean| >> std, because K lies within a few standard
// deviations of the mean; unlike Welford, it costs one subtract per element and
// the block partials of one channel simply add.
//
// The fused ReLU (BatchNormArgs::activation) is a template parameter of the
// elementwise and backward kernels: the forward clamps y, the backward masks
// grad_y by the forward's y > 0, recomputed from the x it loads anyway with the
// forward's own expression (batchnorm_affine, kernels/cpu/batchnorm.h), so it
// reads no more than the plain backward.
#include "kernels/cuda/batchnorm.h"
#include "kernels/cuda/gpu_dtype.cuh"
#include "kernels/cuda/per_channel.cuh"

namespace towerlab::cuda {

namespace {

// --- statistics ----------------------------------------------------------------

// partial_sum, partial_sq: [C, splits]; block (c, j) covers range j of channel c
// (ChannelSplit).
template <typename T, typename V>
__global__ void __launch_bounds__(kReduceBlock, kReduceBlocksPerSm)
    batchnorm_stats_partial_kernel(ChannelSplit split, float* partial_sum, float* partial_sq,
                                   const T* __restrict__ x) {
  const float shift = static_cast<float>(x[split.channel() * split.S * kWidth<V>]);
  float sum = 0.0f, sq = 0.0f;
  for_each_in_split_pipelined(
      split, [&](std::int64_t offset) { return load_unit<V>(x, offset); },
      [&](V v) {
        each(
            [&](float e) {
              const float d = e - shift;
              sum += d;
              sq += d * d;
            },
            v);
      });
  sum = block_sum<kReduceBlock>(sum);
  sq = block_sum<kReduceBlock>(sq);
  if (threadIdx.x == 0) {
    partial_sum[split.partial_index()] = sum;
    partial_sq[split.partial_index()] = sq;
  }
}

// a += pa[0..splits), b += pb[0..splits) in double, in the order j = 0, 1, ...
// (the finishing kernels' per-channel sums). kChunk partials of each are loaded
// before the first add: one memory round trip per kChunk partials rather than
// one per partial, which is what a one-block finishing kernel's time is.
__device__ void add_partials(double& a, double& b, const float* pa, const float* pb,
                             std::int64_t splits) {
  constexpr int kChunk = 8;
  for (std::int64_t j0 = 0; j0 < splits; j0 += kChunk) {
    float va[kChunk], vb[kChunk];
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      if (j0 + u < splits) {
        va[u] = pa[j0 + u];
        vb[u] = pb[j0 + u];
      }
    }
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      if (j0 + u < splits) {
        a += va[u];
        b += vb[u];
      }
    }
  }
}

template <typename T>
__global__ void batchnorm_stats_finish_kernel(std::int64_t C, float* mean, float* m2,
                                              const float* partial_sum, const float* partial_sq,
                                              const T* x, std::int64_t S, std::int64_t splits,
                                              std::int64_t count) {
  for (const std::int64_t c : grid_stride(C)) {
    const float shift = static_cast<float>(x[c * S]);
    double sum = 0.0, sq = 0.0;
    add_partials(sum, sq, partial_sum + c * splits, partial_sq + c * splits, splits);
    const double n = static_cast<double>(count);
    mean[c] = static_cast<float>(shift + sum / n);
    m2[c] = static_cast<float>(fmax(sq - sum * sum / n, 0.0));
  }
}

__global__ void batchnorm_merge_stats_kernel(std::int64_t C, float* mean_a, float* m2_a,
                                             const float* mean_b, const float* m2_b, double count_a,
                                             double count_b) {
  for (const std::int64_t c : grid_stride(C)) {
    const double n = count_a + count_b;
    const double delta = static_cast<double>(mean_b[c]) - mean_a[c];
    mean_a[c] = static_cast<float>(mean_a[c] + delta * count_b / n);
    m2_a[c] = static_cast<float>(static_cast<double>(m2_a[c]) + m2_b[c] +
                                 delta * delta * count_a * count_b / n);
  }
}

// --- forward -------------------------------------------------------------------

// The training forward's coefficients of channel c, (center, scale, shift, 0) for
// y = (x - center) * scale + shift, from the batch statistics; any thread may
// evaluate any channel (it reads inputs only).
struct TrainingCoeff {
  const float* mean;
  const float* m2;
  const float* gamma;
  const float* beta;
  std::int64_t count;
  double eps;
  __device__ float inv_std(std::int64_t c) const {
    const double var = static_cast<double>(m2[c]) / static_cast<double>(count);
    return static_cast<float>(1.0 / sqrt(var + eps));
  }
  __device__ float4 operator()(std::int64_t c) const {
    return make_float4(mean[c], gamma[c] * inv_std(c), beta[c], 0.0f);
  }
};

// What the training forward writes besides y: inv_std and, when moving_mean is not
// null, the "fused" update of the moving statistics. One thread per channel.
struct TrainingOutputs {
  float* inv_std;
  float* moving_mean;
  float* moving_var;
  double momentum;
};

__device__ void write_training_outputs(const TrainingCoeff& t, const TrainingOutputs& o,
                                       std::int64_t c) {
  o.inv_std[c] = t.inv_std(c);
  if (o.moving_mean != nullptr) {
    const double unbiased = static_cast<double>(t.m2[c]) / static_cast<double>(t.count - 1);
    o.moving_mean[c] =
        static_cast<float>(o.momentum * o.moving_mean[c] + (1.0 - o.momentum) * t.mean[c]);
    o.moving_var[c] =
        static_cast<float>(o.momentum * o.moving_var[c] + (1.0 - o.momentum) * unbiased);
  }
}

// coeff[c] = t(c) and the outputs, one thread per channel: ahead of the flat
// elementwise kernel (planes of fewer than kSplitRow units).
__global__ void batchnorm_prepare_training_kernel(std::int64_t C, float4* coeff, TrainingCoeff t,
                                                  TrainingOutputs o) {
  for (const std::int64_t c : grid_stride(C)) {
    write_training_outputs(t, o, c);
    coeff[c] = t(c);
  }
}

// Units a step of the training forward's elementwise pass, two steps in flight:
// two buffers of three float4s fit the 64 registers of four blocks a SM (62);
// of four, they spill.
constexpr int kApplySteps = 3;

// y = batchnorm_affine(x) (then ReLU when Relu) on the reduction's own (C, splits)
// grid, each block walking its range backwards
// (for_each_in_split_reversed_pipelined): the statistics pass just read the same ranges forwards,
// so each block starts on what is still in L2 (x, 26 MB at [32,64,56,56], fits the H100's 50 MB
// only for the part read last). A block has one channel: every thread computes its coefficients (no
// C-thread kernel before it, no shared table), and block (c, 0) writes channel c's outputs. Two
// launches after the statistics' partials become one.
template <bool Relu, typename T, typename V>
__global__ void __launch_bounds__(kReduceBlock, kReduceBlocksPerSm)
    batchnorm_training_apply_kernel(ChannelSplit split, T* y, const T* x, TrainingCoeff t,
                                    TrainingOutputs o) {
  const std::int64_t c = split.channel();
  if (split.split() == 0 && threadIdx.x == 0) write_training_outputs(t, o, c);
  const float4 k = t(c);
  for_each_in_split_reversed_pipelined<kApplySteps>(
      split, [&](std::int64_t offset) { return load_unit<V>(x, offset); },
      [&](std::int64_t offset, V v) {
        store_unit(y, offset,
                   map(
                       [&](float e) {
                         const float z = batchnorm_affine(e, k.x, k.y, k.z);
                         return Relu && z < 0.0f ? 0.0f : z;
                       },
                       v));
      });
}

// --- coefficients of the elementwise kernels ---------------------------------------
//
// A source gives channel c's float4 of coefficients, reading only inputs (no
// writes, so any thread may ask for any channel): Precomputed reads them from a
// buffer a C-thread kernel filled; the others compute them. With at most
// kBlockChannels channels each block of an elementwise kernel first puts all C
// into shared memory (BlockCoefficients) and the computing sources need no
// C-thread kernel before it: one launch fewer, which counts on small tensors.

constexpr std::int64_t kBlockChannels = 1024;  // 16 KiB of float4s

// The elementwise kernels run a resident grid (launch_resident): blocks that fit
// on the SMs at once, each filling its coefficients once and then streaming,
// rather than thousands of short blocks each starting with that fill. Their
// __launch_bounds__ hold them to the registers this many 256-thread blocks per SM
// allow; four blocks of kUnroll float4 loads a thread keep 64 KiB a SM in flight.
constexpr int kApplyBlocksPerSm = 4;
constexpr int kBackwardApplyBlocksPerSm = 2;  // three float4 streams in, ~100 registers

// Planes of at least this many units (a warp's worth) run the training forward's
// and the backward's elementwise pass on the reduction's (C, splits) grid, whose
// blocks walk one channel's rows (coalesced only when a row fills a warp); smaller
// planes ([N,C] of a dense layer: strided rows of one value) keep the flat grid.
constexpr std::int64_t kSplitRow = 32;

struct Precomputed {
  const float4* coeff;
  __device__ float4 operator()(std::int64_t c) const { return coeff[c]; }
};

// (moving_mean, gamma * inv_std, beta, 0) with inv_std from the moving variance.
struct InferenceCoeff {
  const float* gamma;
  const float* beta;
  const float* moving_mean;
  const float* moving_var;
  double eps;
  __device__ float4 operator()(std::int64_t c) const {
    const float istd = static_cast<float>(1.0 / sqrt(static_cast<double>(moving_var[c]) + eps));
    return make_float4(moving_mean[c], gamma[c] * istd, beta[c], 0.0f);
  }
};

// coeff[c] = source(c): the C-thread kernel for more than kBlockChannels channels.
template <typename Source>
__global__ void batchnorm_prepare_kernel(std::int64_t C, float4* coeff, Source source) {
  for (const std::int64_t c : grid_stride(C)) coeff[c] = source(c);
}

// The block's view of the coefficients: all C in shared memory when C <=
// kBlockChannels (filled by the whole block, then a barrier: every thread of the
// block must construct it), else source(c) itself, which the launcher makes a
// Precomputed.
template <typename Source>
class BlockCoefficients {
 public:
  __device__ BlockCoefficients(float4* shared, std::int64_t C, const Source& source)
      : shared_(shared), source_(source), in_shared_(C <= kBlockChannels) {
    if (in_shared_) {
      for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) shared_[c] = source_(c);
    }
    __syncthreads();
  }
  __device__ float4 operator[](std::int64_t c) const {
    return in_shared_ ? shared_[c] : source_(c);
  }

 private:
  float4* shared_;
  Source source_;
  bool in_shared_;
};

// y = batchnorm_affine(x, center, scale, shift), then ReLU when Relu ("z < 0 ? 0 :
// z", not fmaxf, which drops a NaN); y may alias x.
// n and S count units V.
template <bool Relu, typename T, typename V, typename Source>
__global__ void __launch_bounds__(kBlockSize, kApplyBlocksPerSm)
    batchnorm_apply_kernel(std::int64_t n, T* y, const T* x, Source source, std::int64_t C,
                           std::int64_t S) {
  __shared__ float4 shared[kBlockChannels];
  const BlockCoefficients<Source> coeff(shared, C, source);
  for_each_with_channel(
      n, C, S, [&](std::int64_t i) { return load_unit<V>(x, i); },
      [&](std::int64_t i, V v, std::int64_t c) {
        const float4 k = coeff[c];
        store_unit(y, i,
                   map(
                       [&](float e) {
                         const float z = batchnorm_affine(e, k.x, k.y, k.z);
                         return Relu && z < 0.0f ? 0.0f : z;
                       },
                       v));
      });
}

// --- backward ------------------------------------------------------------------

// What a ReLU backward recomputes the forward's y from: the statistics, gamma and
// beta (null pointers for the plain backward, which never reads them).
struct ReluSource {
  const float* mean;
  const float* gamma;
  const float* inv_std;
  const float* beta;
};

// The forward's y = batchnorm_affine(x, center, scale, shift) of channel c, with
// its scale gamma * inv_std in float, read once per channel (zeros, unused,
// without Relu).
struct ReluMask {
  float center, scale, shift;
};

template <bool Relu>
__device__ ReluMask relu_mask(const ReluSource& r, std::int64_t c) {
  if constexpr (Relu) {
    return {r.mean[c], r.gamma[c] * r.inv_std[c], r.beta[c]};
  } else {
    return {0.0f, 0.0f, 0.0f};
  }
}

// grad_y masked by the forward's y > 0 (y recomputed from x) when Relu; else grad_y.
template <bool Relu>
__device__ float masked_grad(float grad_y, float x, const ReluMask& m) {
  if constexpr (Relu) {
    return batchnorm_affine(x, m.center, m.scale, m.shift) > 0.0f ? grad_y : 0.0f;
  } else {
    return grad_y;
  }
}

template <bool Relu, typename T, typename V>
__global__ void __launch_bounds__(kReduceBlock, kReduceBlocksPerSm)
    batchnorm_backward_partial_kernel(ChannelSplit split, float* partial_gy, float* partial_gy_dev,
                                      const T* __restrict__ grad_y, const T* __restrict__ x,
                                      const float* __restrict__ mean, ReluSource relu) {
  const std::int64_t c = split.channel();
  const float mu = mean[c];
  const ReluMask mask = relu_mask<Relu>(relu, c);
  float sum = 0.0f, sum_dev = 0.0f;
  for_each_in_split(
      split,
      [&](std::int64_t offset) {
        const V v = load_unit<V>(x, offset);
        const V g = map([&](float gy, float e) { return masked_grad<Relu>(gy, e, mask); },
                        load_unit<V>(grad_y, offset), v);
        return Units2<V>{g, v};
      },
      [&](Units2<V> gy_x) {
        each(
            [&](float gy, float e) {
              sum += gy;
              sum_dev += gy * (e - mu);
            },
            gy_x.a, gy_x.b);
      });
  sum = block_sum<kReduceBlock>(sum);
  sum_dev = block_sum<kReduceBlock>(sum_dev);
  if (threadIdx.x == 0) {
    partial_gy[split.partial_index()] = sum;
    partial_gy_dev[split.partial_index()] = sum_dev;
  }
}

__global__ void batchnorm_backward_finish_kernel(std::int64_t C, float* sum_grad_y,
                                                 float* sum_grad_y_xhat, const float* partial_gy,
                                                 const float* partial_gy_dev, const float* inv_std,
                                                 std::int64_t splits) {
  for (const std::int64_t c : grid_stride(C)) {
    double sum = 0.0, sum_dev = 0.0;
    add_partials(sum, sum_dev, partial_gy + c * splits, partial_gy_dev + c * splits, splits);
    sum_grad_y[c] = static_cast<float>(sum);
    sum_grad_y_xhat[c] = static_cast<float>(sum_dev * inv_std[c]);
  }
}

// (mean, k, k * mean(grad_y), k * inv_std * mean(grad_y * x_hat)) with k = gamma *
// inv_std, so that grad_x += k*grad_y - coeff.z - (x - mean) * coeff.w.
struct BackwardCoeff {
  const float* gamma;
  const float* mean;
  const float* inv_std;
  const float* sum_grad_y;
  const float* sum_grad_y_xhat;
  std::int64_t count;
  __device__ float4 operator()(std::int64_t c) const {
    const double k = static_cast<double>(gamma[c]) * inv_std[c];
    const double n = static_cast<double>(count);
    return make_float4(mean[c], static_cast<float>(k), static_cast<float>(k * sum_grad_y[c] / n),
                       static_cast<float>(k * inv_std[c] * sum_grad_y_xhat[c] / n));
  }
};

// n and S count units V.
template <bool Relu, typename T, typename V, typename Source>
__global__ void __launch_bounds__(kBlockSize, kBackwardApplyBlocksPerSm)
    batchnorm_backward_apply_kernel(std::int64_t n, T* grad_x, const T* __restrict__ grad_y,
                                    const T* __restrict__ x, Source source, ReluSource relu,
                                    std::int64_t C, std::int64_t S, bool assign) {
  __shared__ float4 shared[kBlockChannels];
  const BlockCoefficients<Source> coeff(shared, C, source);
  // assign: grad_x is overwritten and never read (0 + g is g, as in a zeroed buffer).
  // A 16-bit grad_x is added to in float32 and rounded once.
  for_each_with_channel(
      n, C, S,
      [&](std::int64_t i) {
        return Units3<V>{load_unit<V>(grad_y, i), load_unit<V>(x, i),
                         assign ? V{} : load_unit<V>(grad_x, i)};
      },
      [&](std::int64_t i, Units3<V> v, std::int64_t c) {
        const float4 k = coeff[c];
        const ReluMask mask = relu_mask<Relu>(relu, c);
        store_unit(grad_x, i,
                   map(
                       [&](float g, float e, float acc) {
                         const float gy = masked_grad<Relu>(g, e, mask);
                         return acc + k.y * gy - k.z - (e - k.x) * k.w;
                       },
                       v.a, v.b, v.c));
      });
}

// The backward's grad_x on the reduction's (C, splits) grid, each block walking its
// range backwards to start on the grad_y and x the reduction read last (as
// batchnorm_training_apply_kernel); one channel a block, its coefficients computed
// by every thread. Two blocks per SM: three float4 streams of kUnroll loads want
// ~100 registers, and the reduction runs on the same split.
template <bool Relu, typename T, typename V>
__global__ void __launch_bounds__(kReduceBlock, kBackwardApplyBlocksPerSm)
    batchnorm_backward_split_apply_kernel(ChannelSplit split, T* grad_x,
                                          const T* __restrict__ grad_y, const T* __restrict__ x,
                                          BackwardCoeff source, ReluSource relu, bool assign) {
  const std::int64_t c = split.channel();
  const float4 k = source(c);
  const ReluMask mask = relu_mask<Relu>(relu, c);
  for_each_in_split_reversed(
      split,
      [&](std::int64_t offset) {
        return Units3<V>{load_unit<V>(grad_y, offset), load_unit<V>(x, offset),
                         assign ? V{} : load_unit<V>(grad_x, offset)};
      },
      [&](std::int64_t offset, Units3<V> v) {
        store_unit(grad_x, offset,
                   map(
                       [&](float g, float e, float acc) {
                         const float gy = masked_grad<Relu>(g, e, mask);
                         return acc + k.y * gy - k.z - (e - k.x) * k.w;
                       },
                       v.a, v.b, v.c));
      });
}

}  // namespace

// --- launchers -------------------------------------------------------------------

namespace {

// kernel<<<blocks, kBlockSize>>>(n, args...) with blocks = grid_for(n), at most
// blocks_per_sm per SM (see kApplyBlocksPerSm); nothing for n == 0.
template <typename... Params>
void launch_resident(void (*kernel)(std::int64_t, Params...), int blocks_per_sm, std::int64_t n,
                     const Stream& stream, std::type_identity_t<Params>... args) {
  if (n == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  const std::int64_t most = std::int64_t{blocks_per_sm} * sm_count(stream.device().index);
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(grid_for(n, stream), most));
  kernel<<<blocks, kBlockSize, 0, native(stream)>>>(n, args...);
  TL_CUDA_CHECK_LAUNCH();
}

// Whether the kernels walk [N,C,S] in float4 units: use_float4's rule for float
// buffers; a 16-bit buffer is loaded and stored value by value (load_unit,
// store_unit), so there only S counts, and a 16-bit call walks (and so sums) as
// the float32 call on its widened values does, whatever the view's alignment.
template <typename T>
bool in_float4(std::int64_t S, std::initializer_list<const void*> buffers) {
  if constexpr (std::is_same_v<T, float>) {
    return use_float4(S, buffers);
  } else {
    return S % 4 == 0;
  }
}

// The Relu instance of a kernel template, as the activation asks.
template <typename Kernel>
Kernel with_relu(const BatchNormArgs& a, Kernel relu, Kernel plain) {
  return a.activation == Activation::ReLU ? relu : plain;
}

// y = (x - coeff.x) * coeff.y + coeff.z over a.x, with a.activation.
template <typename T, typename V, typename Source>
void apply_in(const BatchNormArgs& a, const Source& source, const Stream& stream) {
  const auto kernel = with_relu(a, batchnorm_apply_kernel<true, T, V, Source>,
                                batchnorm_apply_kernel<false, T, V, Source>);
  const std::int64_t S = a.S / kWidth<V>;
  launch_resident(kernel, kApplyBlocksPerSm, a.N * a.C * S, stream, a.y.data<T>(), a.x.data<T>(),
                  source, a.C, S);
}

template <typename T, typename Source>
void apply(const BatchNormArgs& a, const Source& source, const Stream& stream) {
  if (in_float4<T>(a.S, {a.y.data<T>(), a.x.data<T>()})) {
    apply_in<T, float4>(a, source, stream);
  } else {
    apply_in<T, float>(a, source, stream);
  }
}

// f(source) for a source the blocks of an elementwise kernel evaluate themselves,
// or, past kBlockChannels channels, f(Precomputed) from a C-thread kernel first.
template <typename Source, typename F>
void with_coefficients(std::int64_t C, const Source& source, const Stream& stream, F f) {
  if (C <= kBlockChannels) {
    f(source);
    return;
  }
  Scratch coeff(stream, C * sizeof(float4));
  launch_grid_stride(batchnorm_prepare_kernel<Source>, C, stream, coeff.as<float4>(), source);
  f(Precomputed{coeff.as<float4>()});
}

// The forward's coefficients for a ReLU backward's mask; null pointers otherwise.
ReluSource relu_source(const BatchNormArgs& a) {
  if (a.activation != Activation::ReLU) return {nullptr, nullptr, nullptr, nullptr};
  return {a.mean.data<float>(), a.gamma.data<float>(), a.inv_std.data<float>(),
          a.beta.data<float>()};
}

}  // namespace

void batchnorm_stats(const BatchNormArgs& a, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  with_gpu_dtype("batchnorm_stats", a.x, [&]<typename T>() {
    const T* x = a.x.data<T>();
    const bool vector = in_float4<T>(a.S, {x});
    const ChannelSplit split = channel_split(a.N, a.C, vector ? a.S / 4 : a.S, stream);
    Scratch partial(stream, 2 * a.C * split.splits * sizeof(float));
    float* partial_sum = partial.as<float>();
    float* partial_sq = partial_sum + a.C * split.splits;
    launch_channel_split(vector ? batchnorm_stats_partial_kernel<T, float4>
                                : batchnorm_stats_partial_kernel<T, float>,
                         split, stream, partial_sum, partial_sq, x);
    launch_grid_stride(batchnorm_stats_finish_kernel<T>, a.C, stream, a.mean.data<float>(),
                       a.m2.data<float>(), partial_sum, partial_sq, x, a.S, split.splits,
                       a.N * a.S);
  });
}

void batchnorm_merge_stats(const BatchNormMergeStats& a, const Stream& stream) {
  launch_grid_stride(batchnorm_merge_stats_kernel, a.mean_a.numel(), stream, a.mean_a.data<float>(),
                     a.m2_a.data<float>(), a.mean_b.data<float>(), a.m2_b.data<float>(),
                     static_cast<double>(a.count_a), static_cast<double>(a.count_b));
}

void batchnorm_forward_from_stats(const BatchNormArgs& a, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const bool moving = a.moving_mean.defined();
  const TrainingCoeff t{a.mean.data<float>(),
                        a.m2.data<float>(),
                        a.gamma.data<float>(),
                        a.beta.data<float>(),
                        a.count,
                        a.eps};
  const TrainingOutputs o{a.inv_std.data<float>(), moving ? a.moving_mean.data<float>() : nullptr,
                          moving ? a.moving_var.data<float>() : nullptr, a.momentum};
  with_gpu_dtype("batchnorm_forward_from_stats", a.x, [&]<typename T>() {
    T* y = a.y.data<T>();
    const T* x = a.x.data<T>();
    const bool vector = in_float4<T>(a.S, {y, x});
    const std::int64_t S = vector ? a.S / 4 : a.S;
    if (S >= kSplitRow) {
      // The statistics' split (batchnorm_stats), so that each block reverses its walk.
      const ChannelSplit split = channel_split(a.N, a.C, S, stream);
      const auto kernel = vector ? with_relu(a, batchnorm_training_apply_kernel<true, T, float4>,
                                             batchnorm_training_apply_kernel<false, T, float4>)
                                 : with_relu(a, batchnorm_training_apply_kernel<true, T, float>,
                                             batchnorm_training_apply_kernel<false, T, float>);
      launch_channel_split(kernel, split, stream, y, x, t, o);
      return;
    }
    Scratch coeff(stream, a.C * sizeof(float4));
    launch_grid_stride(batchnorm_prepare_training_kernel, a.C, stream, coeff.as<float4>(), t, o);
    apply<T>(a, Precomputed{coeff.as<float4>()}, stream);
  });
}

void batchnorm_forward_inference(const BatchNormArgs& a, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const InferenceCoeff source{a.gamma.data<float>(), a.beta.data<float>(),
                              a.moving_mean.data<float>(), a.moving_var.data<float>(), a.eps};
  with_gpu_dtype("batchnorm_forward_inference", a.x, [&]<typename T>() {
    with_coefficients(a.C, source, stream, [&](const auto& s) { apply<T>(a, s, stream); });
  });
}

namespace {

// The backward's split: that of batchnorm_backward_split_apply_kernel (two blocks
// per SM) where the apply runs on it, so that it reverses the reduction's walk.
ChannelSplit backward_split(const BatchNormArgs& a, bool vector, const Stream& stream) {
  const std::int64_t S = vector ? a.S / 4 : a.S;
  return channel_split(a.N, a.C, S, stream,
                       S >= kSplitRow ? kBackwardApplyBlocksPerSm : kReduceBlocksPerSm);
}

}  // namespace

void batchnorm_backward_reduce(const BatchNormArgs& a, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  with_gpu_dtype("batchnorm_backward_reduce", a.x, [&]<typename T>() {
    const T* grad_y = a.grad_y.data<T>();
    const T* x = a.x.data<T>();
    const bool vector = in_float4<T>(a.S, {grad_y, x});
    const ChannelSplit split = backward_split(a, vector, stream);
    Scratch partial(stream, 2 * a.C * split.splits * sizeof(float));
    float* partial_gy = partial.as<float>();
    float* partial_gy_dev = partial_gy + a.C * split.splits;
    const auto kernel = vector ? with_relu(a, batchnorm_backward_partial_kernel<true, T, float4>,
                                           batchnorm_backward_partial_kernel<false, T, float4>)
                               : with_relu(a, batchnorm_backward_partial_kernel<true, T, float>,
                                           batchnorm_backward_partial_kernel<false, T, float>);
    launch_channel_split(kernel, split, stream, partial_gy, partial_gy_dev, grad_y, x,
                         a.mean.data<float>(), relu_source(a));
    launch_grid_stride(batchnorm_backward_finish_kernel, a.C, stream, a.sum_grad_y.data<float>(),
                       a.sum_grad_y_xhat.data<float>(), partial_gy, partial_gy_dev,
                       a.inv_std.data<float>(), split.splits);
  });
}

void batchnorm_backward_apply(const BatchNormArgs& a, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const BackwardCoeff source{a.gamma.data<float>(),           a.mean.data<float>(),
                             a.inv_std.data<float>(),         a.sum_grad_y.data<float>(),
                             a.sum_grad_y_xhat.data<float>(), a.count};
  const bool assign = a.grad_x_write == GradWrite::Assign;
  with_gpu_dtype("batchnorm_backward_apply", a.x, [&]<typename T>() {
    T* grad_x = a.grad_x.data<T>();
    const T* grad_y = a.grad_y.data<T>();
    const T* x = a.x.data<T>();
    const bool vector = in_float4<T>(a.S, {grad_x, grad_y, x});
    const std::int64_t S = vector ? a.S / 4 : a.S;
    if (S >= kSplitRow) {
      const auto kernel = vector
                              ? with_relu(a, batchnorm_backward_split_apply_kernel<true, T, float4>,
                                          batchnorm_backward_split_apply_kernel<false, T, float4>)
                              : with_relu(a, batchnorm_backward_split_apply_kernel<true, T, float>,
                                          batchnorm_backward_split_apply_kernel<false, T, float>);
      launch_channel_split(kernel, backward_split(a, vector, stream), stream, grad_x, grad_y, x,
                           source, relu_source(a), assign);
      return;
    }
    with_coefficients(a.C, source, stream, [&](const auto& s) {
      using Source = std::decay_t<decltype(s)>;
      const auto kernel =
          vector ? with_relu(a, batchnorm_backward_apply_kernel<true, T, float4, Source>,
                             batchnorm_backward_apply_kernel<false, T, float4, Source>)
                 : with_relu(a, batchnorm_backward_apply_kernel<true, T, float, Source>,
                             batchnorm_backward_apply_kernel<false, T, float, Source>);
      launch_resident(kernel, kBackwardApplyBlocksPerSm, a.N * a.C * S, stream, grad_x, grad_y, x,
                      s, relu_source(a), a.C, S, assign);
    });
  });
}

}  // namespace towerlab::cuda
