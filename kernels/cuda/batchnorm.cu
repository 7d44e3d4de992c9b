// CUDA batch normalization (contracts in kernels/batchnorm.h), float32.
//
// Per-channel reductions are two-level (kernels/cuda/per_channel.cuh): a grid of
// (C, splits) blocks writes float partial sums, then one thread per channel adds
// a channel's partials in double. Elementwise steps read one float4 of
// per-channel coefficients, prepared by a C-thread kernel, and the element.
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
#include "kernels/cuda/per_channel.cuh"

namespace towerlab::cuda {

namespace {

// --- statistics ----------------------------------------------------------------

// partial_sum, partial_sq: [C, splits]; block (c, j) covers range j of channel c
// (ChannelSplit).
__global__ void batchnorm_stats_partial_kernel(ChannelSplit split, float* partial_sum,
                                               float* partial_sq, const float* __restrict__ x) {
  const float shift = x[split.channel() * split.S];
  float sum = 0.0f, sq = 0.0f;
  for_each_in_split(
      split, [&](std::int64_t offset) { return x[offset]; },
      [&](float v) {
        const float d = v - shift;
        sum += d;
        sq += d * d;
      });
  sum = block_sum<kReduceBlock>(sum);
  sq = block_sum<kReduceBlock>(sq);
  if (threadIdx.x == 0) {
    partial_sum[split.partial_index()] = sum;
    partial_sq[split.partial_index()] = sq;
  }
}

__global__ void batchnorm_stats_finish_kernel(std::int64_t C, float* mean, float* m2,
                                              const float* partial_sum, const float* partial_sq,
                                              const float* x, std::int64_t S, std::int64_t splits,
                                              std::int64_t count) {
  for (const std::int64_t c : grid_stride(C)) {
    double sum = 0.0, sq = 0.0;
    for (std::int64_t j = 0; j < splits; ++j) {
      sum += partial_sum[c * splits + j];
      sq += partial_sq[c * splits + j];
    }
    const double n = static_cast<double>(count);
    mean[c] = static_cast<float>(x[c * S] + sum / n);
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

// coeff[c] = (center, scale, shift, 0) for y = (x - center) * scale + shift. The
// training form also writes inv_std and updates the moving statistics (when
// moving_mean is not null): the "fused" update, one thread per channel.
__global__ void batchnorm_prepare_training_kernel(std::int64_t C, float4* coeff, float* inv_std,
                                                  float* moving_mean, float* moving_var,
                                                  const float* gamma, const float* beta,
                                                  const float* mean, const float* m2,
                                                  std::int64_t count, double eps, double momentum) {
  for (const std::int64_t c : grid_stride(C)) {
    const double var = static_cast<double>(m2[c]) / static_cast<double>(count);
    const float istd = static_cast<float>(1.0 / sqrt(var + eps));
    inv_std[c] = istd;
    coeff[c] = make_float4(mean[c], gamma[c] * istd, beta[c], 0.0f);
    if (moving_mean != nullptr) {
      const double unbiased = static_cast<double>(m2[c]) / static_cast<double>(count - 1);
      moving_mean[c] = static_cast<float>(momentum * moving_mean[c] + (1.0 - momentum) * mean[c]);
      moving_var[c] = static_cast<float>(momentum * moving_var[c] + (1.0 - momentum) * unbiased);
    }
  }
}

__global__ void batchnorm_prepare_inference_kernel(std::int64_t C, float4* coeff,
                                                   const float* gamma, const float* beta,
                                                   const float* moving_mean,
                                                   const float* moving_var, double eps) {
  for (const std::int64_t c : grid_stride(C)) {
    const float istd = static_cast<float>(1.0 / sqrt(static_cast<double>(moving_var[c]) + eps));
    coeff[c] = make_float4(moving_mean[c], gamma[c] * istd, beta[c], 0.0f);
  }
}

// y = batchnorm_affine(x, center, scale, shift), then ReLU when Relu ("z < 0 ? 0 :
// z", not fmaxf, which drops a NaN); y may alias x.
template <bool Relu>
__global__ void batchnorm_apply_kernel(std::int64_t n, float* y, const float* x,
                                       const float4* __restrict__ coeff, std::int64_t C,
                                       std::int64_t S) {
  for_each_with_channel(
      n, C, S, [&](std::int64_t i) { return x[i]; },
      [&](std::int64_t i, float v, std::int64_t c) {
        const float4 k = coeff[c];
        const float z = batchnorm_affine(v, k.x, k.y, k.z);
        y[i] = Relu && z < 0.0f ? 0.0f : z;
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

// grad_y masked by the forward's y > 0 (y recomputed from x in channel c, with the
// forward's scale gamma * inv_std in float) when Relu; else grad_y.
template <bool Relu>
__device__ float masked_grad(float grad_y, float x, const ReluSource& r, std::int64_t c) {
  if constexpr (Relu) {
    const float y = batchnorm_affine(x, r.mean[c], r.gamma[c] * r.inv_std[c], r.beta[c]);
    return y > 0.0f ? grad_y : 0.0f;
  } else {
    return grad_y;
  }
}

template <bool Relu>
__global__ void batchnorm_backward_partial_kernel(ChannelSplit split, float* partial_gy,
                                                  float* partial_gy_dev,
                                                  const float* __restrict__ grad_y,
                                                  const float* __restrict__ x,
                                                  const float* __restrict__ mean, ReluSource relu) {
  const std::int64_t c = split.channel();
  const float mu = mean[c];
  float sum = 0.0f, sum_dev = 0.0f;
  for_each_in_split(
      split,
      [&](std::int64_t offset) {
        const float v = x[offset];
        return make_float2(masked_grad<Relu>(grad_y[offset], v, relu, c), v);
      },
      [&](float2 gy_x) {
        sum += gy_x.x;
        sum_dev += gy_x.x * (gy_x.y - mu);
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
    for (std::int64_t j = 0; j < splits; ++j) {
      sum += partial_gy[c * splits + j];
      sum_dev += partial_gy_dev[c * splits + j];
    }
    sum_grad_y[c] = static_cast<float>(sum);
    sum_grad_y_xhat[c] = static_cast<float>(sum_dev * inv_std[c]);
  }
}

// coeff[c] = (mean, k, k * mean(grad_y), k * inv_std * mean(grad_y * x_hat)) with
// k = gamma * inv_std, so that grad_x += k*grad_y - coeff.z - (x - mean) * coeff.w.
__global__ void batchnorm_prepare_backward_kernel(std::int64_t C, float4* coeff, const float* gamma,
                                                  const float* mean, const float* inv_std,
                                                  const float* sum_grad_y,
                                                  const float* sum_grad_y_xhat,
                                                  std::int64_t count) {
  for (const std::int64_t c : grid_stride(C)) {
    const double k = static_cast<double>(gamma[c]) * inv_std[c];
    const double n = static_cast<double>(count);
    coeff[c] =
        make_float4(mean[c], static_cast<float>(k), static_cast<float>(k * sum_grad_y[c] / n),
                    static_cast<float>(k * inv_std[c] * sum_grad_y_xhat[c] / n));
  }
}

template <bool Relu>
__global__ void batchnorm_backward_apply_kernel(std::int64_t n, float* grad_x,
                                                const float* __restrict__ grad_y,
                                                const float* __restrict__ x,
                                                const float4* __restrict__ coeff, ReluSource relu,
                                                std::int64_t C, std::int64_t S, bool assign) {
  // assign: grad_x is overwritten and never read (0 + g is g, as in a zeroed buffer).
  for_each_with_channel(
      n, C, S,
      [&](std::int64_t i) { return make_float3(grad_y[i], x[i], assign ? 0.0f : grad_x[i]); },
      [&](std::int64_t i, float3 v, std::int64_t c) {
        const float4 k = coeff[c];
        const float gy = masked_grad<Relu>(v.x, v.y, relu, c);
        grad_x[i] = v.z + k.y * gy - k.z - (v.y - k.x) * k.w;
      });
}

}  // namespace

// --- launchers -------------------------------------------------------------------

namespace {

// y = (x - coeff.x) * coeff.y + coeff.z over a.x, with a.activation.
void apply(const BatchNormArgs& a, const float4* coeff, const Stream& stream) {
  const auto kernel = a.activation == Activation::ReLU ? batchnorm_apply_kernel<true>
                                                       : batchnorm_apply_kernel<false>;
  launch_grid_stride(kernel, a.N * a.C * a.S, stream, a.y.data<float>(), a.x.data<float>(), coeff,
                     a.C, a.S);
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
  const ChannelSplit split = channel_split(a.N, a.C, a.S, stream);
  Scratch partial(stream, 2 * a.C * split.splits * sizeof(float));
  float* partial_sum = partial.as<float>();
  float* partial_sq = partial_sum + a.C * split.splits;
  launch_channel_split(batchnorm_stats_partial_kernel, split, stream, partial_sum, partial_sq,
                       a.x.data<float>());
  launch_grid_stride(batchnorm_stats_finish_kernel, a.C, stream, a.mean.data<float>(),
                     a.m2.data<float>(), partial_sum, partial_sq, a.x.data<float>(), a.S,
                     split.splits, split.per_channel);
}

void batchnorm_merge_stats(const BatchNormMergeStats& a, const Stream& stream) {
  launch_grid_stride(batchnorm_merge_stats_kernel, a.mean_a.numel(), stream, a.mean_a.data<float>(),
                     a.m2_a.data<float>(), a.mean_b.data<float>(), a.m2_b.data<float>(),
                     static_cast<double>(a.count_a), static_cast<double>(a.count_b));
}

void batchnorm_forward_from_stats(const BatchNormArgs& a, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  Scratch coeff(stream, a.C * sizeof(float4));
  const bool moving = a.moving_mean.defined();
  launch_grid_stride(batchnorm_prepare_training_kernel, a.C, stream, coeff.as<float4>(),
                     a.inv_std.data<float>(), moving ? a.moving_mean.data<float>() : nullptr,
                     moving ? a.moving_var.data<float>() : nullptr, a.gamma.data<float>(),
                     a.beta.data<float>(), a.mean.data<float>(), a.m2.data<float>(), a.count, a.eps,
                     a.momentum);
  apply(a, coeff.as<float4>(), stream);
}

void batchnorm_forward_inference(const BatchNormArgs& a, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  Scratch coeff(stream, a.C * sizeof(float4));
  launch_grid_stride(batchnorm_prepare_inference_kernel, a.C, stream, coeff.as<float4>(),
                     a.gamma.data<float>(), a.beta.data<float>(), a.moving_mean.data<float>(),
                     a.moving_var.data<float>(), a.eps);
  apply(a, coeff.as<float4>(), stream);
}

void batchnorm_backward_reduce(const BatchNormArgs& a, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const ChannelSplit split = channel_split(a.N, a.C, a.S, stream);
  Scratch partial(stream, 2 * a.C * split.splits * sizeof(float));
  float* partial_gy = partial.as<float>();
  float* partial_gy_dev = partial_gy + a.C * split.splits;
  const auto kernel = a.activation == Activation::ReLU ? batchnorm_backward_partial_kernel<true>
                                                       : batchnorm_backward_partial_kernel<false>;
  launch_channel_split(kernel, split, stream, partial_gy, partial_gy_dev, a.grad_y.data<float>(),
                       a.x.data<float>(), a.mean.data<float>(), relu_source(a));
  launch_grid_stride(batchnorm_backward_finish_kernel, a.C, stream, a.sum_grad_y.data<float>(),
                     a.sum_grad_y_xhat.data<float>(), partial_gy, partial_gy_dev,
                     a.inv_std.data<float>(), split.splits);
}

void batchnorm_backward_apply(const BatchNormArgs& a, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  Scratch coeff(stream, a.C * sizeof(float4));
  launch_grid_stride(batchnorm_prepare_backward_kernel, a.C, stream, coeff.as<float4>(),
                     a.gamma.data<float>(), a.mean.data<float>(), a.inv_std.data<float>(),
                     a.sum_grad_y.data<float>(), a.sum_grad_y_xhat.data<float>(), a.count);
  const auto kernel = a.activation == Activation::ReLU ? batchnorm_backward_apply_kernel<true>
                                                       : batchnorm_backward_apply_kernel<false>;
  launch_grid_stride(kernel, a.N * a.C * a.S, stream, a.grad_x.data<float>(),
                     a.grad_y.data<float>(), a.x.data<float>(), coeff.as<float4>(), relu_source(a),
                     a.C, a.S, a.grad_x_write == GradWrite::Assign);
}

}  // namespace towerlab::cuda
