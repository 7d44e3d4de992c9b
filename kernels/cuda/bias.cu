// CUDA bias add (contracts in kernels/bias.h). The forward is a
// grid-stride loop that tracks each element's channel; the backward is the
// two-level per-channel sum of kernels/cuda/per_channel.cuh (block partials, then
// one thread per channel adding them in double and into grad_bias), so the
// result does not depend on scheduling. The fused bias + ReLU kernels are the same
// two patterns, the backward's blocks also adding the masked gradient into grad_x
// as they read it. All kernels are templated on the storage type T of x, y,
// grad_y and grad_x (float, bfloat16, float16; bias and grad_bias float32) and on
// their unit V (per_channel.cuh): float4 loads and stores where the plane size and
// alignment allow, a 16-bit T widened on load and rounded once on store
// (load_unit, store_unit), the math float32 either way.
//
// Each pass is memory-bound: its speed on a GPU, beside a device copy of the same
// bytes, is in bench/results/gpu_h100.md.
#include "engine/half.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/gpu_dtype.cuh"
#include "kernels/cuda/per_channel.cuh"

namespace towerlab::cuda {

namespace {

// y = x + bias, then ReLU when Relu ("z < 0 ? 0 : z", not fmaxf, which drops a
// NaN: kernels/relu.h) on the sum as stored (a 16-bit sum rounded first, as the
// unfused pair has it). y may alias x (in-place bias add). n and S count units V.
template <bool Relu, typename T, typename V>
__global__ void bias_add_forward_kernel(std::int64_t n, T* y, const T* x,
                                        const float* __restrict__ bias, std::int64_t C,
                                        std::int64_t S) {
  for_each_with_channel(
      n, C, S, [&](std::int64_t i) { return load_unit<V>(x, i); },
      [&](std::int64_t i, V v, std::int64_t c) {
        const float b = bias[c];
        store_unit(y, i,
                   map(
                       [&](float e) {
                         const float z = static_cast<float>(T(e + b));
                         return Relu && z < 0.0f ? 0.0f : z;
                       },
                       v));
      });
}

// partial: [C, splits]; block (c, j) sums range j of channel c (ChannelSplit).
template <typename T, typename V>
__global__ void __launch_bounds__(kReduceBlock, kReduceBlocksPerSm)
    bias_backward_partial_kernel(ChannelSplit split, float* partial, const T* __restrict__ grad_y) {
  float sum = 0.0f;
  for_each_in_split(
      split, [&](std::int64_t offset) { return load_unit<V>(grad_y, offset); },
      [&](V v) { each([&](float e) { sum += e; }, v); });
  sum = block_sum<kReduceBlock>(sum);
  if (threadIdx.x == 0) partial[split.partial_index()] = sum;
}

// A masked gradient unit and where it goes in grad_x. (Loading grad_x's unit here
// too, with the step's other loads, would put them in flight together, but costs
// 140 bytes of spills a thread at the 64 registers of four blocks per SM.)
template <typename V>
struct MaskedGrad {
  std::int64_t offset;
  V g;
};

// As bias_backward_partial_kernel on g = grad_y * (y > 0), adding each g into
// grad_x (when not null): every element belongs to exactly one block's range.
template <typename T, typename V>
__global__ void __launch_bounds__(kReduceBlock, kReduceBlocksPerSm)
    bias_relu_backward_partial_kernel(ChannelSplit split, float* partial, T* grad_x,
                                      const T* __restrict__ grad_y, const T* __restrict__ y) {
  float sum = 0.0f;
  for_each_in_split(
      split,
      [&](std::int64_t offset) {
        const V g = map([](float gy, float out) { return out > 0.0f ? gy : 0.0f; },
                        load_unit<V>(grad_y, offset), load_unit<V>(y, offset));
        return MaskedGrad<V>{offset, g};
      },
      [&](MaskedGrad<V> m) {
        if (grad_x != nullptr) {
          store_unit(
              grad_x, m.offset,
              map([](float acc, float g) { return acc + g; }, load_unit<V>(grad_x, m.offset), m.g));
        }
        each([&](float g) { sum += g; }, m.g);
      });
  sum = block_sum<kReduceBlock>(sum);
  if (threadIdx.x == 0) partial[split.partial_index()] = sum;
}

__global__ void bias_backward_finish_kernel(std::int64_t C, float* grad_bias, const float* partial,
                                            std::int64_t splits) {
  for (const std::int64_t c : grid_stride(C)) {
    double sum = 0.0;
    for (std::int64_t j = 0; j < splits; ++j) sum += partial[c * splits + j];
    grad_bias[c] = static_cast<float>(grad_bias[c] + sum);
  }
}

// A fully connected layer's bias gradient, grad_y [N, C] (S = 1) with few rows:
// the per-channel reduction above would have each block read one column with a
// stride of C floats (a sector per value) and leave most of its threads idle, in
// two launches. Here block x takes 32 columns and kColumnRows row-threads per
// column: thread (lane, r) adds rows r, r + kColumnRows, ... of column 32x + lane
// (each row a coalesced 128-byte read across the lanes), then thread (lane, 0)
// adds the kColumnRows sums in order and adds the total into grad_bias: one
// launch, a fixed order.
constexpr int kColumnRows = 8;
constexpr std::int64_t kMostColumnRows = 2048;  // rows per thread stay <= 256

template <typename T>
__global__ void __launch_bounds__(kWarpSize* kColumnRows)
    bias_backward_columns_kernel(float* grad_bias, T* grad_x, const T* __restrict__ grad_y,
                                 const T* __restrict__ y, std::int64_t N, std::int64_t C) {
  __shared__ float sums[kColumnRows][kWarpSize];
  const std::int64_t c = blockIdx.x * std::int64_t{kWarpSize} + threadIdx.x;
  float sum = 0.0f;
  if (c < C) {
    for (std::int64_t n = threadIdx.y; n < N; n += kColumnRows) {
      const std::int64_t i = n * C + c;
      float g = static_cast<float>(grad_y[i]);
      if (y != nullptr) {
        g = static_cast<float>(y[i]) > 0.0f ? g : 0.0f;
        if (grad_x != nullptr) grad_x[i] = T(static_cast<float>(grad_x[i]) + g);
      }
      sum += g;
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int r = 0; r < kColumnRows; ++r) total += sums[r][threadIdx.x];
    grad_bias[c] = static_cast<float>(grad_bias[c] + static_cast<double>(total));
  }
}

// The per-channel sum of grad_y (masked by y > 0 when y is not null, then also
// added into grad_x when that is not null) added into grad_bias.
template <typename T>
void bias_backward(float* grad_bias, T* grad_x, const T* grad_y, const T* y, std::int64_t N,
                   std::int64_t C, std::int64_t S, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  if (N * C == 0) return;
  if (S == 1 && N <= kMostColumnRows) {
    const auto blocks = static_cast<unsigned>((C + kWarpSize - 1) / kWarpSize);
    bias_backward_columns_kernel<T><<<blocks, dim3(kWarpSize, kColumnRows), 0, native(stream)>>>(
        grad_bias, grad_x, grad_y, y, N, C);
    TL_CUDA_CHECK_LAUNCH();
    return;
  }
  const bool vector = use_float4(S, {grad_x, grad_y, y});
  const ChannelSplit split = channel_split(N, C, vector ? S / 4 : S, stream);
  Scratch partial(stream, C * split.splits * sizeof(float));
  if (y == nullptr) {
    launch_channel_split(
        vector ? bias_backward_partial_kernel<T, float4> : bias_backward_partial_kernel<T, float>,
        split, stream, partial.as<float>(), grad_y);
  } else {
    launch_channel_split(vector ? bias_relu_backward_partial_kernel<T, float4>
                                : bias_relu_backward_partial_kernel<T, float>,
                         split, stream, partial.as<float>(), grad_x, grad_y, y);
  }
  launch_grid_stride(bias_backward_finish_kernel, C, stream, grad_bias, partial.as<float>(),
                     split.splits);
}

// y = x + bias (then ReLU when Relu) over x [N,C,S].
template <bool Relu, typename T>
void bias_forward(T* y, const T* x, const float* bias, std::int64_t N, std::int64_t C,
                  std::int64_t S, const Stream& stream) {
  if (use_float4(S, {y, x})) {
    launch_grid_stride(bias_add_forward_kernel<Relu, T, float4>, N * C * (S / 4), stream, y, x,
                       bias, C, S / 4);
  } else {
    launch_grid_stride(bias_add_forward_kernel<Relu, T, float>, N * C * S, stream, y, x, bias, C,
                       S);
  }
}

}  // namespace

void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                      std::int64_t C, std::int64_t S, const Stream& stream) {
  with_gpu_dtype("bias_add_forward", x, [&]<typename T>() {
    bias_forward<false>(y.data<T>(), x.data<T>(), bias.data<float>(), N, C, S, stream);
  });
}

void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, std::int64_t N,
                       std::int64_t C, std::int64_t S, const Stream& stream) {
  with_gpu_dtype("bias_add_backward", grad_y, [&]<typename T>() {
    bias_backward<T>(grad_bias.data<float>(), nullptr, grad_y.data<T>(), nullptr, N, C, S, stream);
  });
}

void bias_add_relu_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                           std::int64_t C, std::int64_t S, const Stream& stream) {
  with_gpu_dtype("bias_add_relu_forward", x, [&]<typename T>() {
    bias_forward<true>(y.data<T>(), x.data<T>(), bias.data<float>(), N, C, S, stream);
  });
}

void bias_add_relu_backward(const Tensor& grad_x, const Tensor& grad_bias, const Tensor& grad_y,
                            const Tensor& y, std::int64_t N, std::int64_t C, std::int64_t S,
                            const Stream& stream) {
  with_gpu_dtype("bias_add_relu_backward", grad_y, [&]<typename T>() {
    bias_backward<T>(grad_bias.data<float>(), grad_x.defined() ? grad_x.data<T>() : nullptr,
                     grad_y.data<T>(), y.data<T>(), N, C, S, stream);
  });
}

}  // namespace towerlab::cuda
