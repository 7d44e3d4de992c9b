// The pointwise losses' plain reference (contracts in kernels/reference/pointwise_loss.h).
#include "kernels/reference/pointwise_loss.h"

#include <algorithm>
#include <cmath>

namespace towerlab::reference {

namespace {

// sign(d) with sign(0) == 0 and NaN kept.
double sign(double d) {
  return d > 0.0 ? 1.0 : d < 0.0 ? -1.0 : d;
}

// d clamped to [-delta, delta], NaN kept.
double clamp(double d, double delta) {
  return d > delta ? delta : d < -delta ? -delta : d;
}

double sigmoid(double x) {
  // exp of a non-positive argument only: no overflow at either end.
  const double e = std::exp(-std::abs(x));
  return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

}  // namespace

double pointwise_loss_term(const PointwiseLossOp& op, double x, double t) {
  switch (op.kind) {
    case PointwiseLossKind::BinaryCrossEntropyWithLogits:
      return std::max(x, 0.0) - x * t + std::log1p(std::exp(-std::abs(x)));
    case PointwiseLossKind::L1:
      return std::abs(x - t);
    case PointwiseLossKind::Huber: {
      const double a = std::abs(x - t);
      return a <= op.delta ? 0.5 * a * a : op.delta * (a - 0.5 * op.delta);
    }
  }
  return NAN;
}

double pointwise_loss_pred_derivative(const PointwiseLossOp& op, double x, double t) {
  switch (op.kind) {
    case PointwiseLossKind::BinaryCrossEntropyWithLogits:
      return sigmoid(x) - t;
    case PointwiseLossKind::L1:
      return sign(x - t);
    case PointwiseLossKind::Huber:
      return clamp(x - t, op.delta);
  }
  return NAN;
}

double pointwise_loss_target_derivative(const PointwiseLossOp& op, double x, double t) {
  if (op.kind == PointwiseLossKind::BinaryCrossEntropyWithLogits) return std::isnan(t) ? t : -x;
  return -pointwise_loss_pred_derivative(op, x, t);
}

template <typename T>
double pointwise_loss_sum(const PointwiseLossOp& op, const T* pred, const T* target,
                          std::int64_t n) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    total += pointwise_loss_term(op, static_cast<double>(pred[i]), static_cast<double>(target[i]));
  }
  return total;
}

template <typename T>
void pointwise_loss_backward(const PointwiseLossOp& op, T* grad_pred, T* grad_target, const T* pred,
                             const T* target, double factor, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(pred[i]), t = static_cast<double>(target[i]);
    if (grad_pred != nullptr) {
      grad_pred[i] += static_cast<T>(factor * pointwise_loss_pred_derivative(op, x, t));
    }
    if (grad_target != nullptr) {
      grad_target[i] += static_cast<T>(factor * pointwise_loss_target_derivative(op, x, t));
    }
  }
}

#define TL_POINTWISE_LOSS(T)                                                                       \
  template double pointwise_loss_sum<T>(const PointwiseLossOp&, const T*, const T*, std::int64_t); \
  template void pointwise_loss_backward<T>(const PointwiseLossOp&, T*, T*, const T*, const T*,     \
                                           double, std::int64_t);
TL_POINTWISE_LOSS(float)
TL_POINTWISE_LOSS(double)
#undef TL_POINTWISE_LOSS

}  // namespace towerlab::reference
