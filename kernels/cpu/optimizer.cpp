// CPU optimizer updates: the specification for kernels/cuda/optimizer.cu. One loop
// per update over the n elements of the flat buffers, in the buffers' dtype; the
// loops carry no dependence between elements, so the compiler vectorizes them and
// they split over the thread pool at any boundary (kernels/cpu/parallel.h). The
// range bodies capture by value: with the scalars captured by reference, a store
// through p might change them as far as the compiler knows, and the loops stay scalar.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/parallel.h"

namespace towerlab::cpu {

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                const SgdParams& params) {
  with_dtype(param.dtype(), [&]<typename T>() {
    T* __restrict p = param.data<T>();       // [n]
    const T* __restrict g = grad.data<T>();  // [n]
    const auto lr = static_cast<T>(params.lr);
    const auto mu = static_cast<T>(params.momentum);
    const auto wd = static_cast<T>(params.weight_decay);
    const std::int64_t n = param.numel();
    T* __restrict v = velocity.defined() ? velocity.data<T>() : nullptr;  // [n]
    parallel_rows(n, 1, [=](std::int64_t lo, std::int64_t hi) {
      if (v == nullptr) {
        for (std::int64_t i = lo; i < hi; ++i) p[i] -= lr * (g[i] + wd * p[i]);
      } else if (params.nesterov) {
        for (std::int64_t i = lo; i < hi; ++i) {
          const T d = g[i] + wd * p[i];
          v[i] = mu * v[i] + d;
          p[i] -= lr * (d + mu * v[i]);
        }
      } else {
        for (std::int64_t i = lo; i < hi; ++i) {
          v[i] = mu * v[i] + (g[i] + wd * p[i]);
          p[i] -= lr * v[i];
        }
      }
    });
  });
}

void rmsprop_update(const Tensor& param, const Tensor& grad, const Tensor& mean_square,
                    const Tensor& moment, const Tensor& mean_grad, const RmspropParams& params) {
  with_dtype(param.dtype(), [&]<typename T>() {
    T* __restrict p = param.data<T>();         // [n]
    const T* __restrict g = grad.data<T>();    // [n]
    T* __restrict ms = mean_square.data<T>();  // [n]
    T* __restrict mom = moment.data<T>();      // [n]
    const auto lr = static_cast<T>(params.lr);
    const auto rho = static_cast<T>(params.decay);
    const auto one_minus_rho = static_cast<T>(1.0 - params.decay);  // in double, as TF and PyTorch
    const auto mu = static_cast<T>(params.momentum);
    const auto eps = static_cast<T>(params.epsilon);
    const std::int64_t n = param.numel();
    T* __restrict mg = mean_grad.defined() ? mean_grad.data<T>() : nullptr;  // [n]
    parallel_rows(n, 1, [=](std::int64_t lo, std::int64_t hi) {
      if (mg != nullptr) {
        for (std::int64_t i = lo; i < hi; ++i) {
          ms[i] = rho * ms[i] + one_minus_rho * g[i] * g[i];
          mg[i] = rho * mg[i] + one_minus_rho * g[i];
          mom[i] = mu * mom[i] + lr * g[i] / std::sqrt(ms[i] - mg[i] * mg[i] + eps);
          p[i] -= mom[i];
        }
      } else {
        for (std::int64_t i = lo; i < hi; ++i) {
          ms[i] = rho * ms[i] + one_minus_rho * g[i] * g[i];
          mom[i] = mu * mom[i] + lr * g[i] / std::sqrt(ms[i] + eps);
          p[i] -= mom[i];
        }
      }
    });
  });
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 const AdamStep& step) {
  with_dtype(param.dtype(), [&]<typename T>() {
    T* __restrict p = param.data<T>();       // [n]
    const T* __restrict g = grad.data<T>();  // [n]
    T* __restrict m1 = m.data<T>();          // [n] first moment
    T* __restrict m2 = v.data<T>();          // [n] second moment
    const auto beta1 = static_cast<T>(step.beta1);
    const auto beta2 = static_cast<T>(step.beta2);
    // 1 - beta in double: in float, 1 - 0.999f is off by 1.3e-5 relative.
    const auto one_minus_beta1 = static_cast<T>(1.0 - step.beta1);
    const auto one_minus_beta2 = static_cast<T>(1.0 - step.beta2);
    const auto eps = static_cast<T>(step.epsilon);
    const auto wd = static_cast<T>(step.weight_decay);
    const auto decay_factor = static_cast<T>(step.decay_factor);
    const auto step_size = static_cast<T>(step.step_size);
    const auto bc2_sqrt = static_cast<T>(step.bias_correction2_sqrt);
    parallel_rows(param.numel(), 1, [=](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) {
        const T p0 = p[i] * decay_factor;
        const T gi = g[i] + wd * p[i];
        m1[i] = beta1 * m1[i] + one_minus_beta1 * gi;
        m2[i] = beta2 * m2[i] + one_minus_beta2 * gi * gi;
        p[i] = p0 - step_size * m1[i] / (std::sqrt(m2[i]) / bc2_sqrt + eps);
      }
    });
  });
}

}  // namespace towerlab::cpu
