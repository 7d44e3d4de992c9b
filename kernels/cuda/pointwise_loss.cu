// CUDA pointwise losses (contract in kernels/pointwise_loss.h), float32.
//
// The loss is the two-stage sum of kernels/cuda/sum_terms.cuh over a Term that
// computes one element's term; the backward is one grid-stride kernel. The kind is
// a template parameter, so each kernel holds one formula and no per-element switch.
// Every comparison is written so that NaN falls through to the result (fminf and
// fmaxf would drop it), as the contract's NaN rule asks.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pointwise_loss.h"
#include "kernels/cuda/sum_terms.cuh"

namespace towerlab::cuda {

namespace {

using Kind = PointwiseLossKind;

__device__ __forceinline__ float sign_of(float d) {
  return d > 0.0f ? 1.0f : d < 0.0f ? -1.0f : d;
}

__device__ __forceinline__ float clamp_to(float d, float delta) {
  return d > delta ? delta : d < -delta ? -delta : d;
}

template <Kind kKind>
__device__ __forceinline__ float term(float x, float t, float delta) {
  if constexpr (kKind == Kind::BinaryCrossEntropyWithLogits) {
    // fmaxf drops a NaN logit, but x * t carries it into the term.
    return fmaxf(x, 0.0f) - x * t + log1pf(expf(-fabsf(x)));
  } else if constexpr (kKind == Kind::L1) {
    return fabsf(x - t);
  } else {
    const float a = fabsf(x - t);
    return a <= delta ? 0.5f * a * a : delta * (a - 0.5f * delta);
  }
}

// d term / d pred.
template <Kind kKind>
__device__ __forceinline__ float pred_derivative(float x, float t, float delta) {
  if constexpr (kKind == Kind::BinaryCrossEntropyWithLogits) {
    return 1.0f / (1.0f + expf(-x)) - t;  // expf(-x) overflows to inf for x < -88: 1/inf = 0
  } else if constexpr (kKind == Kind::L1) {
    return sign_of(x - t);
  } else {
    return clamp_to(x - t, delta);
  }
}

// d term / d target.
template <Kind kKind>
__device__ __forceinline__ float target_derivative(float x, float t, float delta) {
  if constexpr (kKind == Kind::BinaryCrossEntropyWithLogits) {
    return t != t ? t : -x;  // a NaN target makes its gradient NaN too
  } else {
    return -pred_derivative<kKind>(x, t, delta);
  }
}

template <Kind kKind>
struct Term {
  const float* pred;
  const float* target;
  float delta;
  __device__ float operator()(std::int64_t i) const {
    return term<kKind>(pred[i], target[i], delta);
  }
};

template <Kind kKind>
__global__ void pointwise_loss_backward_kernel(std::int64_t n, float* grad_pred, float* grad_target,
                                               const float* grad_loss, const float* pred,
                                               const float* target, float scale, float delta) {
  const float factor = scale * *grad_loss;
  for (const std::int64_t i : grid_stride(n)) {
    const float x = pred[i], t = target[i];
    if (grad_pred != nullptr) grad_pred[i] += factor * pred_derivative<kKind>(x, t, delta);
    if (grad_target != nullptr) grad_target[i] += factor * target_derivative<kKind>(x, t, delta);
  }
}

// Calls body.template operator()<kind>() for the op's kind.
template <typename Body>
void with_kind(Kind kind, const Body& body) {
  switch (kind) {
    case Kind::BinaryCrossEntropyWithLogits:
      return body.template operator()<Kind::BinaryCrossEntropyWithLogits>();
    case Kind::L1:
      return body.template operator()<Kind::L1>();
    case Kind::Huber:
      return body.template operator()<Kind::Huber>();
  }
}

}  // namespace

void pointwise_loss_forward(const Tensor& loss, const Tensor& pred, const Tensor& target,
                            const PointwiseLossOp& op, float scale, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const float delta = static_cast<float>(op.delta);
  with_kind(op.kind, [&]<Kind kKind>() {
    losses::sum_terms(loss.data<float>(), pred.numel(),
                      Term<kKind>{pred.data<float>(), target.data<float>(), delta}, scale, stream);
  });
}

void pointwise_loss_backward(const Tensor& grad_pred, const Tensor& grad_target,
                             const Tensor& grad_loss, const Tensor& pred, const Tensor& target,
                             const PointwiseLossOp& op, float scale, const Stream& stream) {
  float* gx = grad_pred.defined() ? grad_pred.data<float>() : nullptr;
  float* gt = grad_target.defined() ? grad_target.data<float>() : nullptr;
  const float delta = static_cast<float>(op.delta);
  with_kind(op.kind, [&]<Kind kKind>() {
    launch_grid_stride(pointwise_loss_backward_kernel<kKind>, pred.numel(), stream, gx, gt,
                       grad_loss.data<float>(), pred.data<float>(), target.data<float>(), scale,
                       delta);
  });
}

}  // namespace towerlab::cuda
