// CPU softmax and log-softmax (contracts in kernels/softmax.h). float32 runs in
// vector lanes (kernels/cpu/float_lanes.h: AVX-512, AVX2 or four portable lanes,
// chosen at run time), float64 runs the plain reference (kernels/reference/
// softmax.h), which stays the specification: the float32 rows follow its steps
// (the maximum of the kept values, which skips a NaN; the sum of exp(x - m); then
// exp(x - m) / sum or (x - m) - log(sum)), with float_lanes.h's exp in float32 and
// the sums of a row accumulated in double lanes, so that a long row's sum adds no
// error of its own. The NaN rule, the exact 0 and -inf of masked and -inf entries
// and the limits at large logits carry over; the results stay within
// 1e-6 + 1e-5 |reference| of the double reference on every ISA
// (tests/softmax_test.cpp). A row's kept values are read in groups of W lanes, the
// last one padded (-inf for the maximum and the exponentials, so they add 0).
// Rows are independent and each is computed whole by one thread, so the result is
// the single-threaded one bit for bit.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/float_lanes.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/softmax.h"

namespace towerlab::cpu {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The lanes of v combined by op (max or +) as a tree, halves first: log2(W)
// dependent steps rather than W. Lane order does not matter to max, and to a sum
// in double of float terms hardly: the row's sum is in the tolerance either way.
template <typename Lanes, typename T, int W, typename Op>
T reduce_lanes(Lanes v, const Op& op) {
  T lanes[W];
  std::memcpy(lanes, &v, sizeof lanes);
  for (int half = W / 2; half >= 1; half /= 2) {
    for (int i = 0; i < half; ++i) lanes[i] = op(lanes[i], lanes[i + half]);
  }
  return lanes[0];
}

template <int W>
double sum_of_lanes(DoubleLanes<W> v) {
  return reduce_lanes<DoubleLanes<W>, double, W>(v, [](double a, double b) { return a + b; });
}

// A row's sum in double lanes, added one group of W float lanes at a time. With AVX2
// (W = 8) the W doubles are kept as two pieces of four, one register each: GCC holds
// a 64-byte vector in an AVX2 function on the stack and moves it through general
// registers at every addition, which took most of a short row's time. total() adds
// the pieces lane by lane, then reduces the four as sum_of_lanes does: the first
// step of sum_of_lanes<8>'s tree, so the same sum, bit for bit.
template <int W>
struct DoubleSum {
  static constexpr int kWidth = W == 8 ? 4 : W;  // doubles a piece
  DoubleLanes<kWidth> piece[W / kWidth]{};

  void add(FloatLanes<W> v) {
    if constexpr (kWidth == W) {
      piece[0] += widen_lanes<W>(v);
    } else {
      piece[0] += widen_lanes<4>(__builtin_shufflevector(v, v, 0, 1, 2, 3));
      piece[1] += widen_lanes<4>(__builtin_shufflevector(v, v, 4, 5, 6, 7));
    }
  }
  // sum += a b, each product exact in double.
  void add_products(FloatLanes<W> a, FloatLanes<W> b) {
    if constexpr (kWidth == W) {
      piece[0] += widen_lanes<W>(a) * widen_lanes<W>(b);
    } else {
      piece[0] += widen_lanes<4>(__builtin_shufflevector(a, a, 0, 1, 2, 3)) *
                  widen_lanes<4>(__builtin_shufflevector(b, b, 0, 1, 2, 3));
      piece[1] += widen_lanes<4>(__builtin_shufflevector(a, a, 4, 5, 6, 7)) *
                  widen_lanes<4>(__builtin_shufflevector(b, b, 4, 5, 6, 7));
    }
  }
  double total() const {
    if constexpr (kWidth == W) {
      return sum_of_lanes<W>(piece[0]);
    } else {
      return sum_of_lanes<4>(piece[0] + piece[1]);
    }
  }
};

template <int W>
float max_of_lanes(FloatLanes<W> v) {
  return reduce_lanes<FloatLanes<W>, float, W>(v, [](float a, float b) { return a > b ? a : b; });
}

// One row: y [D] from x [D], of which the first `kept` are kept; y may alias x.
template <int W>
void forward_row(float* y, const float* x, std::int64_t kept, std::int64_t cols, SoftmaxKind kind) {
  FloatLanes<W> lanes_max = splat_lanes<W>(-kInf);
  for_each_lane_group<W>(kept, [&](std::int64_t j, std::int64_t count) {
    const FloatLanes<W> v = load_lanes<W>(x + j, count, -kInf);
    lanes_max = select_lanes<W>(v > lanes_max, v, lanes_max);  // a NaN is skipped
  });
  const float m = max_of_lanes<W>(lanes_max);  // no lane holds a NaN

  // exp(x - m), kept in y for softmax, and its sum.
  DoubleSum<W> lanes_sum;
  for_each_lane_group<W>(kept, [&](std::int64_t j, std::int64_t count) {
    const FloatLanes<W> e = exp_lanes<W>(load_lanes<W>(x + j, count, -kInf) - m);
    if (kind == SoftmaxKind::Softmax) store_lanes<W>(y + j, e, count);
    lanes_sum.add(e);
  });
  const double sum = lanes_sum.total();

  if (kind == SoftmaxKind::Softmax) {
    const auto inv_sum = static_cast<float>(1.0 / sum);
    for_each_lane_group<W>(kept, [&](std::int64_t j, std::int64_t count) {
      store_lanes<W>(y + j, load_lanes<W>(y + j, count) * inv_sum, count);
    });
  } else {
    const auto log_sum = static_cast<float>(std::log(sum));
    for_each_lane_group<W>(kept, [&](std::int64_t j, std::int64_t count) {
      store_lanes<W>(y + j, (load_lanes<W>(x + j, count) - m) - log_sum, count);
    });
  }
  std::fill(y + kept, y + cols, kind == SoftmaxKind::LogSoftmax ? -kInf : 0.0f);
}

// One row's backward: grad_x [D] from grad_y [D] and the forward's y [D].
template <int W>
void backward_row(float* grad_x, const float* grad_y, const float* y, std::int64_t kept,
                  std::int64_t cols, SoftmaxKind kind, GradWrite write) {
  // softmax: sum grad_y y (each product exact in double); log-softmax: sum grad_y.
  DoubleSum<W> lanes_sum;
  for_each_lane_group<W>(kept, [&](std::int64_t j, std::int64_t count) {
    const FloatLanes<W> gy = load_lanes<W>(grad_y + j, count);
    if (kind == SoftmaxKind::LogSoftmax) {
      lanes_sum.add(gy);
    } else {
      lanes_sum.add_products(gy, load_lanes<W>(y + j, count));
    }
  });
  const auto sum = static_cast<float>(lanes_sum.total());
  for_each_lane_group<W>(kept, [&](std::int64_t j, std::int64_t count) {
    const FloatLanes<W> gy = load_lanes<W>(grad_y + j, count);
    const FloatLanes<W> out = load_lanes<W>(y + j, count);
    FloatLanes<W> g =
        kind == SoftmaxKind::LogSoftmax ? gy - exp_lanes<W>(out) * sum : out * (gy - sum);
    if (write == GradWrite::Accumulate) g += load_lanes<W>(grad_x + j, count);
    store_lanes<W>(grad_x + j, g, count);
  });
  // Masked entries: a gradient of exactly 0, added (nothing changes) or assigned.
  if (write == GradWrite::Assign) std::fill(grad_x + kept, grad_x + cols, 0.0f);
}

}  // namespace

void softmax_forward(const Tensor& y, const Tensor& x, SoftmaxKind kind, SoftmaxMask mask) {
  const std::int64_t cols = x.shape().back();
  const std::int64_t rows = x.numel() / cols;
  with_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [R, D]
    const T* in = x.data<T>();  // [R, D]
    parallel_rows(rows, cols, [&](std::int64_t lo, std::int64_t hi) {
      if constexpr (std::is_same_v<T, float>) {
        run_float_lanes([&]<int W>() {
          for (std::int64_t r = lo; r < hi; ++r) {
            forward_row<W>(out + r * cols, in + r * cols, reference::softmax_kept(r, cols, mask),
                           cols, kind);
          }
        });
      } else {
        reference::softmax_forward(out, in, lo, hi, cols, kind, mask);
      }
    });
  });
}

void softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, SoftmaxKind kind,
                      SoftmaxMask mask, GradWrite write) {
  const std::int64_t cols = y.shape().back();
  const std::int64_t rows = y.numel() / cols;
  with_dtype(grad_x.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [R, D]
    const T* gy = grad_y.data<T>();  // [R, D]
    const T* out = y.data<T>();      // [R, D]
    parallel_rows(rows, cols, [&](std::int64_t lo, std::int64_t hi) {
      if constexpr (std::is_same_v<T, float>) {
        run_float_lanes([&]<int W>() {
          for (std::int64_t r = lo; r < hi; ++r) {
            backward_row<W>(gx + r * cols, gy + r * cols, out + r * cols,
                            reference::softmax_kept(r, cols, mask), cols, kind, write);
          }
        });
      } else {
        reference::softmax_backward(gx, gy, out, lo, hi, cols, kind, mask, write);
      }
    });
  });
}

}  // namespace towerlab::cpu
