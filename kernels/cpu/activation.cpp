// CPU activations (contracts in kernels/activation.h). float32 runs in vector
// lanes (kernels/cpu/float_lanes.h: AVX-512, AVX2 or four portable lanes, chosen at
// run time): f and f' below are the reference's formulas (kernels/reference/
// activation.cpp) term for term, in float32 with float_lanes.h's exp, logistic,
// tanh and normal tail, so the NaN rule, the limits at +-inf, the sigmoid that never
// overflows and GELU's tails relative to their value carry over; the results stay
// within 1e-6 + 1e-5 |reference| of the double reference on every ISA
// (tests/activation_test.cpp). float64 runs the reference itself. In bfloat16 and
// float16 each value is still computed in double and rounded once, as the reference
// does, but on blocks: the inputs widened (exactly) by kernels/cpu/convert16.h into
// double scratch, the reference's float64 loop run on the block (the 16-bit loop's
// arithmetic, in the same order), and the results rounded by convert16.h's two
// vector steps, to odd into float32 and from there to 16 bits (engine/half.h's
// T(double)): the reference's bits. Elementwise, so the loops split over the thread pool at any
// boundary (kernels/cpu/parallel.h). The files an op takes, in order: the top of
// kernels/relu.h.
#include "kernels/cpu/activation.h"

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/float_lanes.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/activation.h"
#include "kernels/reference/math_type.h"

namespace towerlab::cpu {
namespace {

using reference::kIs16Bit;

// The block's 16-bit values x widened into double scratch.
template <typename T>
void widen_to_double(double* dst, const T* x, std::int64_t count) {
  float v[kConvertBlock];
  widen_16bit(v, x, count);
  for (std::int64_t i = 0; i < count; ++i) dst[i] = static_cast<double>(v[i]);
}

// y = T(d) for the block's double results: rounded to odd into float32, then to
// 16 bits, the two steps of engine/half.h's T(double).
template <typename T>
void round_from_double(T* y, const double* d, std::int64_t count) {
  float v[kConvertBlock];
  round_to_odd_float(v, d, count);
  round_to_16bit(y, v, count);
}

template <typename T>
void activation_forward_16bit(T* y, const T* x, std::int64_t n, const ActivationOp& act) {
  for_each_block(n, [&](std::int64_t first, std::int64_t count) {
    double v[kConvertBlock];
    widen_to_double(v, x + first, count);
    reference::activation_forward(v, v, count, act);
    round_from_double(y + first, v, count);
  });
}

template <typename T>
void activation_backward_16bit(T* grad_x, const T* grad_y, const T* x, std::int64_t n,
                               const ActivationOp& act, GradWrite write) {
  for_each_block(n, [&](std::int64_t first, std::int64_t count) {
    double gx[kConvertBlock], gy[kConvertBlock], in[kConvertBlock];
    widen_to_double(gy, grad_y + first, count);
    widen_to_double(in, x + first, count);
    if (write == GradWrite::Accumulate) widen_to_double(gx, grad_x + first, count);
    reference::activation_backward(gx, gy, in, count, act, write);
    round_from_double(grad_x + first, gx, count);
  });
}

// GELU's tanh form: u = sqrt(2/pi) (x + 0.044715 x^3).
constexpr float kSqrt2OverPi = 0.797884560802865356f;
constexpr float kGeluTanhCubic = 0.044715f;

template <int W>
inline FloatLanes<W> gelu_tanh_u(FloatLanes<W> x) {
  return kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
}

// Phi(x) from Phi(-|x|): the tail itself for x < 0, 1 minus it above.
template <int W>
inline FloatLanes<W> normal_cdf(FloatLanes<W> x, FloatLanes<W> lower_tail) {
  return select_lanes<W>(x < 0.0f, lower_tail, 1.0f - lower_tail);
}

// f(x) of kernels/activation.h's table on W lanes.
template <ActivationKind K, int W>
inline FloatLanes<W> value_lanes(FloatLanes<W> x, float slope) {
  if constexpr (K == ActivationKind::Sigmoid) {
    return logistic_lanes<W>(x).value;
  } else if constexpr (K == ActivationKind::Tanh) {
    return tanh_lanes<W>(x).value;
  } else if constexpr (K == ActivationKind::Gelu) {
    return times_unless_zero<W>(x, normal_cdf<W>(x, normal_tail<W>(x).lower_tail));
  } else if constexpr (K == ActivationKind::GeluTanh) {
    return times_unless_zero<W>(x, logistic_lanes<W>(2.0f * gelu_tanh_u<W>(x)).value);
  } else if constexpr (K == ActivationKind::SiLU) {
    return times_unless_zero<W>(x, logistic_lanes<W>(x).value);
  } else {
    return select_lanes<W>(x > 0.0f, x, slope * x);
  }
}

// f'(x) on W lanes.
template <ActivationKind K, int W>
inline FloatLanes<W> derivative_lanes(FloatLanes<W> x, float slope) {
  if constexpr (K == ActivationKind::Sigmoid) {
    return logistic_lanes<W>(x).derivative;
  } else if constexpr (K == ActivationKind::Tanh) {
    return tanh_lanes<W>(x).derivative;
  } else if constexpr (K == ActivationKind::Gelu) {
    const NormalTail<W> n = normal_tail<W>(x);
    return normal_cdf<W>(x, n.lower_tail) + times_unless_zero<W>(x, n.density);
  } else if constexpr (K == ActivationKind::GeluTanh) {
    const FloatLanes<W> du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * x * x);
    const Logistic<W> s = logistic_lanes<W>(2.0f * gelu_tanh_u<W>(x));
    return s.value + times_unless_zero<W>(x * du, 2.0f * s.derivative);
  } else if constexpr (K == ActivationKind::SiLU) {
    const Logistic<W> s = logistic_lanes<W>(x);
    return s.value + times_unless_zero<W>(x, s.derivative);
  } else {
    return select_lanes<W>(x > 0.0f, splat_lanes<W>(1.0f), splat_lanes<W>(slope));
  }
}

// fn.template operator()<K>() with K = kind, so each activation's loop is compiled
// on its own.
template <typename Fn>
void with_kind(ActivationKind kind, const Fn& fn) {
  switch (kind) {
    case ActivationKind::Sigmoid:
      return fn.template operator()<ActivationKind::Sigmoid>();
    case ActivationKind::Tanh:
      return fn.template operator()<ActivationKind::Tanh>();
    case ActivationKind::Gelu:
      return fn.template operator()<ActivationKind::Gelu>();
    case ActivationKind::GeluTanh:
      return fn.template operator()<ActivationKind::GeluTanh>();
    case ActivationKind::SiLU:
      return fn.template operator()<ActivationKind::SiLU>();
    case ActivationKind::LeakyReLU:
      return fn.template operator()<ActivationKind::LeakyReLU>();
  }
}

void activation_forward_float(float* y, const float* x, std::int64_t n, const ActivationOp& act) {
  const auto slope = static_cast<float>(act.negative_slope);
  with_kind(act.kind, [&]<ActivationKind K>() {
    run_float_lanes([&]<int W>() {
      for_each_lane_group<W>(n, [&](std::int64_t i, std::int64_t count) {
        store_lanes<W>(y + i, value_lanes<K, W>(load_lanes<W>(x + i, count), slope), count);
      });
    });
  });
}

// grad_x = grad_y f'(x), plus grad_x's old value with GradWrite::Accumulate.
void activation_backward_float(float* grad_x, const float* grad_y, const float* x, std::int64_t n,
                               const ActivationOp& act, GradWrite write) {
  const auto slope = static_cast<float>(act.negative_slope);
  with_kind(act.kind, [&]<ActivationKind K>() {
    run_float_lanes([&]<int W>() {
      for_each_lane_group<W>(n, [&](std::int64_t i, std::int64_t count) {
        FloatLanes<W> g = load_lanes<W>(grad_y + i, count) *
                          derivative_lanes<K, W>(load_lanes<W>(x + i, count), slope);
        if (write == GradWrite::Accumulate) g += load_lanes<W>(grad_x + i, count);
        store_lanes<W>(grad_x + i, g, count);
      });
    });
  });
}

}  // namespace

void activation_forward(const Tensor& y, const Tensor& x, const ActivationOp& act) {
  with_any_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      if constexpr (kIs16Bit<T>) {
        activation_forward_16bit(out + lo, in + lo, hi - lo, act);
      } else if constexpr (std::is_same_v<T, float>) {
        activation_forward_float(out + lo, in + lo, hi - lo, act);
      } else {
        reference::activation_forward(out + lo, in + lo, hi - lo, act);
      }
    });
  });
}

void activation_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const ActivationOp& act, GradWrite write) {
  with_any_dtype(grad_x.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [n]
    const T* gy = grad_y.data<T>();  // [n]
    const T* in = x.data<T>();       // [n]
    parallel_rows(grad_x.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      if constexpr (kIs16Bit<T>) {
        activation_backward_16bit(gx + lo, gy + lo, in + lo, hi - lo, act, write);
      } else if constexpr (std::is_same_v<T, float>) {
        activation_backward_float(gx + lo, gy + lo, in + lo, hi - lo, act, write);
      } else {
        reference::activation_backward(gx + lo, gy + lo, in + lo, hi - lo, act, write);
      }
    });
  });
}

}  // namespace towerlab::cpu
