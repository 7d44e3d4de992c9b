// The activations' plain reference (contracts in kernels/reference/activation.h).
#include "kernels/reference/activation.h"

#include <cmath>
#include <numbers>

#include "engine/half.h"

namespace towerlab::reference {

namespace {

constexpr double kGeluTanhCubic = 0.044715;

// 1 / (1 + exp(-x)) without exp of a positive argument, so no x overflows.
double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);  // a NaN x comes here and stays a NaN
  return e / (1.0 + e);
}

// a * b, taken as 0 where b is 0: x times a factor that has saturated to 0, which
// would be the NaN of inf * 0 at x = +-inf.
double times_unless_zero(double a, double b) {
  return b == 0 ? 0.0 : a * b;
}

// Phi(x) = erfc(-x / sqrt 2) / 2: accurate relative to its value in the negative
// tail, where 1 + erf(x / sqrt 2) cancels.
double normal_cdf(double x) {
  return 0.5 * std::erfc(-x * std::numbers::sqrt2 / 2);
}

double normal_pdf(double x) {
  return std::exp(-0.5 * x * x) * std::numbers::inv_sqrtpi / std::numbers::sqrt2;
}

// GELU's tanh form: u = sqrt(2/pi) (x + 0.044715 x^3).
double gelu_tanh_u(double x) {
  return std::numbers::sqrt2 * std::numbers::inv_sqrtpi * (x + kGeluTanhCubic * x * x * x);
}

double gelu_tanh_du(double x) {
  return std::numbers::sqrt2 * std::numbers::inv_sqrtpi * (1.0 + 3.0 * kGeluTanhCubic * x * x);
}

}  // namespace

double activation_value(const ActivationOp& act, double x) {
  switch (act.kind) {
    case ActivationKind::Sigmoid:
      return sigmoid(x);
    case ActivationKind::Tanh:
      return std::tanh(x);
    case ActivationKind::Gelu:
      return times_unless_zero(x, normal_cdf(x));
    case ActivationKind::GeluTanh:
      return times_unless_zero(x, sigmoid(2.0 * gelu_tanh_u(x)));
    case ActivationKind::SiLU:
      return times_unless_zero(x, sigmoid(x));
    case ActivationKind::LeakyReLU:
      return x > 0 ? x : act.negative_slope * x;
  }
  return x;
}

double activation_derivative(const ActivationOp& act, double x) {
  switch (act.kind) {
    case ActivationKind::Sigmoid: {
      const double s = sigmoid(x);
      return s * (1.0 - s);
    }
    case ActivationKind::Tanh: {
      const double t = std::tanh(x);
      return 1.0 - t * t;
    }
    case ActivationKind::Gelu:
      return normal_cdf(x) + times_unless_zero(x, normal_pdf(x));
    case ActivationKind::GeluTanh: {
      const double s = sigmoid(2.0 * gelu_tanh_u(x));
      return s + times_unless_zero(x * gelu_tanh_du(x), 2.0 * s * (1.0 - s));
    }
    case ActivationKind::SiLU: {
      const double s = sigmoid(x);
      return s + times_unless_zero(x, s * (1.0 - s));
    }
    case ActivationKind::LeakyReLU:
      return x > 0 ? 1.0 : act.negative_slope;
  }
  return 1.0;
}

template <typename T>
void activation_forward(T* y, const T* x, std::int64_t n, const ActivationOp& act) {
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<T>(activation_value(act, static_cast<double>(x[i])));
  }
}

template <typename T>
void activation_backward(T* grad_x, const T* grad_y, const T* x, std::int64_t n,
                         const ActivationOp& act, GradWrite write) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double g =
        static_cast<double>(grad_y[i]) * activation_derivative(act, static_cast<double>(x[i]));
    grad_x[i] = static_cast<T>(write == GradWrite::Assign ? g : static_cast<double>(grad_x[i]) + g);
  }
}

#define TL_INSTANTIATE_ACTIVATION(T)                                                              \
  template void activation_forward<T>(T*, const T*, std::int64_t, const ActivationOp&);           \
  template void activation_backward<T>(T*, const T*, const T*, std::int64_t, const ActivationOp&, \
                                       GradWrite);
TL_INSTANTIATE_ACTIVATION(float)
TL_INSTANTIATE_ACTIVATION(double)
TL_INSTANTIATE_ACTIVATION(bfloat16)
TL_INSTANTIATE_ACTIVATION(float16)
#undef TL_INSTANTIATE_ACTIVATION

}  // namespace towerlab::reference
