// CUDA optimizer updates (contracts in kernels/optimizer.h), float32.
//
// Every optimizer is one kernel template, fused_update_kernel, run with an update
// functor that maps one element's (p, g, slots) to its new (p, slots). The update is
// a handful of flops per 20-32 bytes moved, so the kernel's only job is to stream
// the buffers at the speed of memory: each element is loaded and stored once, and
// when every buffer is 16-byte aligned the loads and stores are float4 (one 128-bit
// access per buffer per 4 elements: a quarter of the memory instructions, which is
// what lets a grid-stride loop reach the bandwidth of a device-to-device copy).
// Views into a flat buffer can start at any element, so unaligned buffers take the
// scalar loop instead; either way the element formulas are the same.
#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/optimizer.h"

namespace towerlab::cuda {

namespace {

// The buffers of one update: p and g, then kSlots slot buffers (velocity, ...).
template <int kSlots>
struct Buffers {
  float* param;
  const float* grad;
  float* slots[kSlots > 0 ? kSlots : 1];
};

// p -= lr * (g + wd * p)
struct SgdPlain {
  static constexpr int kSlots = 0;
  float lr, weight_decay;
  __device__ void operator()(float& p, float g, float* /*slots*/) const {
    p -= lr * (g + weight_decay * p);
  }
};

// slots: velocity
struct SgdMomentum {
  static constexpr int kSlots = 1;
  float lr, momentum, weight_decay;
  bool nesterov;
  __device__ void operator()(float& p, float g, float* s) const {
    const float d = g + weight_decay * p;
    s[0] = momentum * s[0] + d;
    p -= lr * (nesterov ? d + momentum * s[0] : s[0]);
  }
};

// slots: mean_square, moment, and mean_grad when centered
template <bool kCentered>
struct Rmsprop {
  static constexpr int kSlots = kCentered ? 3 : 2;
  float lr, decay, one_minus_decay, momentum, epsilon;
  __device__ void operator()(float& p, float g, float* s) const {
    s[0] = decay * s[0] + one_minus_decay * g * g;
    float denom_sq = s[0] + epsilon;
    if constexpr (kCentered) {
      s[2] = decay * s[2] + one_minus_decay * g;
      denom_sq = s[0] - s[2] * s[2] + epsilon;
    }
    s[1] = momentum * s[1] + lr * g / sqrtf(denom_sq);
    p -= s[1];
  }
};

// slots: m, v
struct Adam {
  static constexpr int kSlots = 2;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, epsilon, weight_decay, decay_factor,
      step_size, bias_correction2_sqrt;
  __device__ void operator()(float& p, float g, float* s) const {
    g += weight_decay * p;
    s[0] = beta1 * s[0] + one_minus_beta1 * g;
    s[1] = beta2 * s[1] + one_minus_beta2 * g * g;
    p = p * decay_factor - step_size * s[0] / (sqrtf(s[1]) / bias_correction2_sqrt + epsilon);
  }
};

__device__ __forceinline__ float& component(float4& v, int k) {
  return k == 0 ? v.x : (k == 1 ? v.y : (k == 2 ? v.z : v.w));
}

template <typename Update, bool kVector>
__global__ void fused_update_kernel(std::int64_t n, Buffers<Update::kSlots> b, Update update) {
  constexpr int kSlots = Update::kSlots;
  const std::int64_t first = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  std::int64_t tail_begin = 0;
  if constexpr (kVector) {
    const std::int64_t n4 = n / 4;
    for (std::int64_t i = first; i < n4; i += stride) {
      float4 p = reinterpret_cast<const float4*>(b.param)[i];
      float4 g = reinterpret_cast<const float4*>(b.grad)[i];
      float4 s[kSlots > 0 ? kSlots : 1];
#pragma unroll
      for (int j = 0; j < kSlots; ++j) s[j] = reinterpret_cast<const float4*>(b.slots[j])[i];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float e[kSlots > 0 ? kSlots : 1];
#pragma unroll
        for (int j = 0; j < kSlots; ++j) e[j] = component(s[j], k);
        update(component(p, k), component(g, k), e);
#pragma unroll
        for (int j = 0; j < kSlots; ++j) component(s[j], k) = e[j];
      }
      reinterpret_cast<float4*>(b.param)[i] = p;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) reinterpret_cast<float4*>(b.slots[j])[i] = s[j];
    }
    tail_begin = n4 * 4;
  }
  for (std::int64_t i = tail_begin + first; i < n; i += stride) {
    float p = b.param[i];
    float e[kSlots > 0 ? kSlots : 1];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) e[j] = b.slots[j][i];
    update(p, b.grad[i], e);
    b.param[i] = p;
#pragma unroll
    for (int j = 0; j < kSlots; ++j) b.slots[j][i] = e[j];
  }
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
}

template <typename Update>
void launch_update(const Tensor& param, const Tensor& grad,
                   const std::array<const Tensor*, Update::kSlots>& slots, const Update& update,
                   const Stream& stream) {
  Buffers<Update::kSlots> b{param.data<float>(), grad.data<float>(), {}};
  bool vector = aligned16(b.param) && aligned16(b.grad);
  for (int j = 0; j < Update::kSlots; ++j) {
    b.slots[j] = slots[j]->template data<float>();
    vector = vector && aligned16(b.slots[j]);
  }
  const std::int64_t n = param.numel();
  if (n == 0) return;
  // Not launch_grid_stride: the float4 loop's threads each take four elements, so
  // its grid is sized for n/4 items while the kernel still needs the element count.
  CudaDeviceGuard guard(stream.device().index);
  const auto kernel =
      vector ? fused_update_kernel<Update, true> : fused_update_kernel<Update, false>;
  const std::int64_t items = vector ? (n + 3) / 4 : n;
  kernel<<<grid_for(items, stream), kBlockSize, 0, native(stream)>>>(n, b, update);
  TL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                const SgdParams& params, const Stream& stream) {
  const auto lr = static_cast<float>(params.lr);
  const auto wd = static_cast<float>(params.weight_decay);
  if (!velocity.defined()) {
    launch_update(param, grad, {}, SgdPlain{lr, wd}, stream);
    return;
  }
  launch_update(param, grad, {&velocity},
                SgdMomentum{lr, static_cast<float>(params.momentum), wd, params.nesterov}, stream);
}

void rmsprop_update(const Tensor& param, const Tensor& grad, const Tensor& mean_square,
                    const Tensor& moment, const Tensor& mean_grad, const RmspropParams& params,
                    const Stream& stream) {
  const auto lr = static_cast<float>(params.lr);
  const auto decay = static_cast<float>(params.decay);
  const auto one_minus_decay = static_cast<float>(1.0 - params.decay);
  const auto momentum = static_cast<float>(params.momentum);
  const auto epsilon = static_cast<float>(params.epsilon);
  if (mean_grad.defined()) {
    launch_update(param, grad, {&mean_square, &moment, &mean_grad},
                  Rmsprop<true>{lr, decay, one_minus_decay, momentum, epsilon}, stream);
  } else {
    launch_update(param, grad, {&mean_square, &moment},
                  Rmsprop<false>{lr, decay, one_minus_decay, momentum, epsilon}, stream);
  }
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 const AdamStep& step, const Stream& stream) {
  // 1 - beta in double: in float, 1 - 0.999f is off by 1.3e-5 relative.
  const Adam update{static_cast<float>(step.beta1),
                    static_cast<float>(1.0 - step.beta1),
                    static_cast<float>(step.beta2),
                    static_cast<float>(1.0 - step.beta2),
                    static_cast<float>(step.epsilon),
                    static_cast<float>(step.weight_decay),
                    static_cast<float>(step.decay_factor),
                    static_cast<float>(step.step_size),
                    static_cast<float>(step.bias_correction2_sqrt)};
  launch_update(param, grad, {&m, &v}, update, stream);
}

}  // namespace towerlab::cuda
