// CUDA activations (contracts in kernels/activation.h): one grid-stride kernel per
// direction, the activation chosen per element by a switch on its kind (uniform
// across the grid, so every thread takes the same branch), templated on the
// storage type (float, bfloat16, float16). The formulas and their guards at the
// saturated tails are the reference's (kernels/reference/activation.cpp), in
// float32 whatever the storage, a 16-bit result rounded once as it is stored.
// The files an op takes, in order: the top of kernels/relu.h.
#include "engine/half.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/gpu_dtype.cuh"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

constexpr float kSqrtHalf = 0.70710678118654752f;     // 1 / sqrt 2
constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286536f;  // sqrt(2 / pi)
constexpr float kGeluTanhCubic = 0.044715f;

// exp of a non-positive argument only, so no |x| overflows.
__device__ __forceinline__ float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

// a * b, 0 where b has saturated to 0 (the NaN of inf * 0 otherwise).
__device__ __forceinline__ float times_unless_zero(float a, float b) {
  return b == 0.0f ? 0.0f : a * b;
}

// erfc rather than 1 + erf, which cancels in the negative tail.
__device__ __forceinline__ float normal_cdf(float x) {
  return 0.5f * erfcf(-x * kSqrtHalf);
}

__device__ __forceinline__ float gelu_tanh_u(float x) {
  return kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
}

__device__ float activation_value(ActivationKind kind, float slope, float x) {
  switch (kind) {
    case ActivationKind::Sigmoid:
      return sigmoid(x);
    case ActivationKind::Tanh:
      return tanhf(x);
    case ActivationKind::Gelu:
      return times_unless_zero(x, normal_cdf(x));
    case ActivationKind::GeluTanh:
      return times_unless_zero(x, sigmoid(2.0f * gelu_tanh_u(x)));
    case ActivationKind::SiLU:
      return times_unless_zero(x, sigmoid(x));
    case ActivationKind::LeakyReLU:
      return x > 0.0f ? x : slope * x;
  }
  return x;
}

__device__ float activation_derivative(ActivationKind kind, float slope, float x) {
  switch (kind) {
    case ActivationKind::Sigmoid: {
      const float s = sigmoid(x);
      return s * (1.0f - s);
    }
    case ActivationKind::Tanh: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
    case ActivationKind::Gelu:
      return normal_cdf(x) + times_unless_zero(x, kInvSqrt2Pi * expf(-0.5f * x * x));
    case ActivationKind::GeluTanh: {
      const float s = sigmoid(2.0f * gelu_tanh_u(x));
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * x * x);
      return s + times_unless_zero(x * du, 2.0f * s * (1.0f - s));
    }
    case ActivationKind::SiLU: {
      const float s = sigmoid(x);
      return s + times_unless_zero(x, s * (1.0f - s));
    }
    case ActivationKind::LeakyReLU:
      return x > 0.0f ? 1.0f : slope;
  }
  return 1.0f;
}

template <typename T>
__global__ void activation_forward_kernel(std::int64_t n, T* y, const T* x, ActivationKind kind,
                                          float slope) {
  for (const std::int64_t i : grid_stride(n)) {
    y[i] = T(activation_value(kind, slope, static_cast<float>(x[i])));
  }
}

template <typename T>
__global__ void activation_backward_kernel(std::int64_t n, T* grad_x, const T* grad_y, const T* x,
                                           ActivationKind kind, float slope, bool assign) {
  for (const std::int64_t i : grid_stride(n)) {
    const float g = static_cast<float>(grad_y[i]) *
                    activation_derivative(kind, slope, static_cast<float>(x[i]));
    grad_x[i] = T(assign ? g : static_cast<float>(grad_x[i]) + g);
  }
}

}  // namespace

void activation_forward(const Tensor& y, const Tensor& x, const ActivationOp& act,
                        const Stream& stream) {
  with_gpu_dtype("activation_forward", y, [&]<typename T>() {
    launch_grid_stride(activation_forward_kernel<T>, y.numel(), stream, y.data<T>(), x.data<T>(),
                       act.kind, static_cast<float>(act.negative_slope));
  });
}

void activation_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const ActivationOp& act, const Stream& stream, GradWrite write) {
  with_gpu_dtype("activation_backward", grad_x, [&]<typename T>() {
    launch_grid_stride(activation_backward_kernel<T>, grad_x.numel(), stream, grad_x.data<T>(),
                       grad_y.data<T>(), x.data<T>(), act.kind,
                       static_cast<float>(act.negative_slope), write == GradWrite::Assign);
  });
}

}  // namespace towerlab::cuda
