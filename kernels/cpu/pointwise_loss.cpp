// CPU pointwise losses: the plain reference (kernels/reference/pointwise_loss.h).
// The loss is one running sum in index order on one thread, as every CPU loss
// (kernels/cpu/loss.cpp says why); the gradients split over the thread pool.
#include "kernels/cpu/pointwise_loss.h"

#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/pointwise_loss.h"

namespace towerlab::cpu {

void pointwise_loss_forward(const Tensor& loss, const Tensor& pred, const Tensor& target,
                            const PointwiseLossOp& op, double scale) {
  with_dtype(pred.dtype(), [&]<typename T>() {
    const double total =
        reference::pointwise_loss_sum(op, pred.data<T>(), target.data<T>(), pred.numel());
    loss.data<T>()[0] = static_cast<T>(total * scale);
  });
}

void pointwise_loss_backward(const Tensor& grad_pred, const Tensor& grad_target,
                             const Tensor& grad_loss, const Tensor& pred, const Tensor& target,
                             const PointwiseLossOp& op, double scale) {
  with_dtype(pred.dtype(), [&]<typename T>() {
    const T* x = pred.data<T>();                                      // [n]
    const T* t = target.data<T>();                                    // [n]
    T* gx = grad_pred.defined() ? grad_pred.data<T>() : nullptr;      // [n]
    T* gt = grad_target.defined() ? grad_target.data<T>() : nullptr;  // [n]
    const double factor = scale * static_cast<double>(grad_loss.data<T>()[0]);
    parallel_rows(pred.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::pointwise_loss_backward(op, gx != nullptr ? gx + lo : nullptr,
                                         gt != nullptr ? gt + lo : nullptr, x + lo, t + lo, factor,
                                         hi - lo);
    });
  });
}

}  // namespace towerlab::cpu
