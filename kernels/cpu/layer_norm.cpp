// CPU layer normalization. float32 runs the reference's double arithmetic
// (kernels/reference/layer_norm.h) in vector lanes (kernels/cpu/float_lanes.h's
// choice of ISA at run time: AVX-512, AVX2 or portable code): each group of V float
// values (half the ISA's float lanes, V doubles filling one register) is widened to
// doubles, the row sums are kept in V double lanes and added lane by lane at the
// row's end, and every result is rounded to float once, as the reference rounds it.
// Only the order of the row sums and the fused multiply-adds of the AVX2 and AVX-512
// code differ from the reference, which keeps the results within the tolerance
// kernels/layer_norm.h states (tests/layer_norm_test.cpp). A row's last D mod V
// values are done one at a time, in double, as the reference does them. Each row's
// sums are one chain of additions, so the forward takes four rows and grad_x two at
// a time, their chains side by side; a row's arithmetic, and its bits, are those it
// has alone. float64 runs the reference.
//
// Threads (kernels/cpu/parallel.h): the forward and grad_x split over rows;
// grad_weight and grad_bias, sums over rows, split over their columns, so each
// column is summed by one thread in row order (its own lane of the float32 path).
// Either way the result is the single-threaded one bit for bit.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cpu/layer_norm.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/float_lanes.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/layer_norm.h"

namespace towerlab::cpu {

namespace {

template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// V floats and V doubles, the doubles one register of the ISA whose float lanes
// are W = 2V: GCC keeps a vector wider than the ISA's registers (W doubles in an
// AVX2 function) on the stack and moves it through general registers at every use
// (kernels/cpu/softmax.cpp's DoubleSum), so these kernels take values V at a time.
template <int V>
struct WideLanes;
#define TL_WIDE_LANES(V)                                       \
  template <>                                                  \
  struct WideLanes<V> {                                        \
    typedef float Float __attribute__((vector_size(4 * V)));   \
    typedef double Double __attribute__((vector_size(8 * V))); \
  };
TL_WIDE_LANES(2)
TL_WIDE_LANES(4)
TL_WIDE_LANES(8)
#undef TL_WIDE_LANES

template <int V>
using Doubles = typename WideLanes<V>::Double;

// V float32 values from p as V doubles (exact).
template <int V>
inline Doubles<V> load_wide(const float* p) {
  typename WideLanes<V>::Float v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, Doubles<V>);
}

// V doubles rounded to float32 (to nearest even, as static_cast<float>) into p.
template <int V>
inline void store_narrow(float* p, Doubles<V> v) {
  const auto f = __builtin_convertvector(v, typename WideLanes<V>::Float);
  std::memcpy(p, &f, sizeof f);
}

template <int V>
inline double sum_lanes(Doubles<V> v) {
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += v[i];
  return sum;
}

template <int V>
inline Doubles<V> splat_double(double v) {
  return Doubles<V>{} + v;
}

// Rows r0 .. r0 + R - 1 of the forward: the reference's three passes over a row (its
// sum, its squared deviations from the mean, the output), the first V * (D / V)
// values of each in lanes. Each row's sums are one chain of additions in its own
// lanes, so R rows taken together run R chains side by side, where one row alone
// waits on each addition's latency; each row's arithmetic, and so its bits, is the
// same for any R.
template <int W, int R>
void forward_block(const reference::LayerNormForwardData<float>& d, std::int64_t r0) {
  constexpr int V = W / 2;
  const std::int64_t D = d.cols, full = D - D % V;
  const float* x[R];  // [R][D]
  for (int i = 0; i < R; ++i) x[i] = d.x + (r0 + i) * D;
  Doubles<V> lanes[R] = {};
  for (std::int64_t j = 0; j < full; j += V) {
    for (int i = 0; i < R; ++i) lanes[i] += load_wide<V>(x[i] + j);
  }
  double mean[R];
  for (int i = 0; i < R; ++i) {
    double sum = sum_lanes<V>(lanes[i]);
    for (std::int64_t j = full; j < D; ++j) sum += x[i][j];
    mean[i] = sum / double(D);
    lanes[i] = Doubles<V>{};
  }
  for (std::int64_t j = 0; j < full; j += V) {
    for (int i = 0; i < R; ++i) {
      const Doubles<V> dev = load_wide<V>(x[i] + j) - splat_double<V>(mean[i]);
      lanes[i] += dev * dev;
    }
  }
  for (int i = 0; i < R; ++i) {
    const std::int64_t r = r0 + i;
    float* y = d.y + r * D;  // [D]
    double m2 = sum_lanes<V>(lanes[i]);
    for (std::int64_t j = full; j < D; ++j) m2 += (x[i][j] - mean[i]) * (x[i][j] - mean[i]);
    const double rstd = 1.0 / std::sqrt(m2 / double(D) + d.eps);
    d.mean[r] = static_cast<float>(mean[i]);
    d.rstd[r] = static_cast<float>(rstd);
    const Doubles<V> mean_lanes = splat_double<V>(mean[i]), rstd_lanes = splat_double<V>(rstd);
    for (std::int64_t j = 0; j < full; j += V) {
      Doubles<V> v = (load_wide<V>(x[i] + j) - mean_lanes) * rstd_lanes;
      if (d.weight != nullptr) v *= load_wide<V>(d.weight + j);
      if (d.bias != nullptr) v += load_wide<V>(d.bias + j);
      store_narrow<V>(y + j, v);
    }
    for (std::int64_t j = full; j < D; ++j) {
      double v = (x[i][j] - mean[i]) * rstd;
      if (d.weight != nullptr) v *= d.weight[j];
      if (d.bias != nullptr) v += d.bias[j];
      y[j] = static_cast<float>(v);
    }
  }
}

// Rows [first, last) of the forward, four at a time, then one at a time.
template <int W>
void forward_rows(const reference::LayerNormForwardData<float>& d, std::int64_t first,
                  std::int64_t last) {
  constexpr int kRowsAtOnce = 4;
  std::int64_t r = first;
  for (; r + kRowsAtOnce <= last; r += kRowsAtOnce) forward_block<W, kRowsAtOnce>(d, r);
  for (; r < last; ++r) forward_block<W, 1>(d, r);
}

// grad_x of rows r0 .. r0 + R - 1: the reference's two passes (the sums of g and
// of g * x_hat, then the gradient), with g = grad_y * weight. As in the forward, R
// rows' sums run side by side, each row's arithmetic the same for any R.
template <int W, int R>
void backward_x_block(const reference::LayerNormBackwardData<float>& d, std::int64_t r0) {
  constexpr int V = W / 2;
  const std::int64_t D = d.cols, full = D - D % V;
  const bool assign = d.grad_x_write == GradWrite::Assign;
  const float *x[R], *gy[R];  // [R][D] each
  Doubles<V> mean_lanes[R], rstd_lanes[R];
  for (int i = 0; i < R; ++i) {
    x[i] = d.x + (r0 + i) * D;
    gy[i] = d.grad_y + (r0 + i) * D;
    mean_lanes[i] = splat_double<V>(d.mean[r0 + i]);
    rstd_lanes[i] = splat_double<V>(d.rstd[r0 + i]);
  }
  const auto g_lanes = [&](int i, std::int64_t j) {
    const Doubles<V> g = load_wide<V>(gy[i] + j);
    return d.weight != nullptr ? g * load_wide<V>(d.weight + j) : g;
  };
  const auto g_one = [&](int i, std::int64_t j) {
    return d.weight != nullptr ? double(gy[i][j]) * double(d.weight[j]) : double(gy[i][j]);
  };
  Doubles<V> g_sums[R] = {}, g_xhat_sums[R] = {};
  for (std::int64_t j = 0; j < full; j += V) {
    for (int i = 0; i < R; ++i) {
      const Doubles<V> g = g_lanes(i, j);
      g_sums[i] += g;
      g_xhat_sums[i] += g * ((load_wide<V>(x[i] + j) - mean_lanes[i]) * rstd_lanes[i]);
    }
  }
  for (int i = 0; i < R; ++i) {
    float* gx = d.grad_x + (r0 + i) * D;  // [D]
    const double mean = d.mean[r0 + i], rstd = d.rstd[r0 + i];
    double sum_g = sum_lanes<V>(g_sums[i]), sum_g_xhat = sum_lanes<V>(g_xhat_sums[i]);
    for (std::int64_t j = full; j < D; ++j) {
      sum_g += g_one(i, j);
      sum_g_xhat += g_one(i, j) * (x[i][j] - mean) * rstd;
    }
    const double mean_g = sum_g / double(D), mean_g_xhat = sum_g_xhat / double(D);
    const Doubles<V> mean_g_lanes = splat_double<V>(mean_g),
                     mean_g_xhat_lanes = splat_double<V>(mean_g_xhat);
    for (std::int64_t j = 0; j < full; j += V) {
      const Doubles<V> x_hat = (load_wide<V>(x[i] + j) - mean_lanes[i]) * rstd_lanes[i];
      Doubles<V> v = rstd_lanes[i] * (g_lanes(i, j) - mean_g_lanes - x_hat * mean_g_xhat_lanes);
      if (!assign) v += load_wide<V>(gx + j);
      store_narrow<V>(gx + j, v);
    }
    for (std::int64_t j = full; j < D; ++j) {
      const double x_hat = (x[i][j] - mean) * rstd;
      const double v = rstd * (g_one(i, j) - mean_g - x_hat * mean_g_xhat);
      gx[j] = assign ? static_cast<float>(v) : static_cast<float>(gx[j] + v);
    }
  }
}

// grad_x of rows [first, last), two at a time (four rows' sums and constants are
// more than the sixteen AVX2 registers hold), then one at a time.
template <int W>
void backward_x_rows(const reference::LayerNormBackwardData<float>& d, std::int64_t first,
                     std::int64_t last) {
  constexpr int kRowsAtOnce = 2;
  std::int64_t r = first;
  for (; r + kRowsAtOnce <= last; r += kRowsAtOnce) backward_x_block<W, kRowsAtOnce>(d, r);
  for (; r < last; ++r) backward_x_block<W, 1>(d, r);
}

// grad_weight and grad_bias of columns [first, last): each column's sums over the
// rows in row order, V columns to a group of lanes (the reference's additions, one
// column per lane), the last (last - first) mod V columns one at a time.
template <int W>
void backward_params_cols(const reference::LayerNormBackwardData<float>& d, std::int64_t first,
                          std::int64_t last) {
  constexpr int V = W / 2;
  const std::int64_t D = d.cols, n = last - first, full = n - n % V;
  std::vector<double> sum_w(std::size_t(n), 0.0), sum_b(std::size_t(n), 0.0);  // [n]
  for (std::int64_t r = 0; r < d.rows; ++r) {
    const float* x = d.x + r * D + first;        // [n]
    const float* gy = d.grad_y + r * D + first;  // [n]
    const double mean = d.mean[r], rstd = d.rstd[r];
    const Doubles<V> mean_lanes = splat_double<V>(mean), rstd_lanes = splat_double<V>(rstd);
    for (std::int64_t j = 0; j < full; j += V) {
      const Doubles<V> g = load_wide<V>(gy + j);
      Doubles<V> w, b;
      std::memcpy(&w, sum_w.data() + j, sizeof w);
      std::memcpy(&b, sum_b.data() + j, sizeof b);
      w += g * ((load_wide<V>(x + j) - mean_lanes) * rstd_lanes);
      b += g;
      std::memcpy(sum_w.data() + j, &w, sizeof w);
      std::memcpy(sum_b.data() + j, &b, sizeof b);
    }
    for (std::int64_t j = full; j < n; ++j) {
      sum_w[std::size_t(j)] += double(gy[j]) * ((x[j] - mean) * rstd);
      sum_b[std::size_t(j)] += gy[j];
    }
  }
  for (std::int64_t j = 0; j < n; ++j) {
    if (d.grad_weight != nullptr) {
      float& gw = d.grad_weight[first + j];
      gw = static_cast<float>(gw + sum_w[std::size_t(j)]);
    }
    if (d.grad_bias != nullptr) {
      float& gb = d.grad_bias[first + j];
      gb = static_cast<float>(gb + sum_b[std::size_t(j)]);
    }
  }
}

}  // namespace

void layer_norm_forward(const LayerNormForward& args) {
  const std::int64_t cols = args.x.shape().back();
  const std::int64_t rows = args.x.numel() / cols;
  with_dtype(args.x.dtype(), [&]<typename T>() {
    const reference::LayerNormForwardData<T> d{
        .y = args.y.data<T>(),
        .mean = args.mean.data<T>(),
        .rstd = args.rstd.data<T>(),
        .x = args.x.data<T>(),
        .weight = data_or_null<T>(args.weight),
        .bias = data_or_null<T>(args.bias),
        .rows = rows,
        .cols = cols,
        .eps = args.eps,
    };
    parallel_rows(rows, cols, [&](std::int64_t lo, std::int64_t hi) {
      if constexpr (std::is_same_v<T, float>) {
        run_float_lanes([&]<int W>() { forward_rows<W>(d, lo, hi); });
      } else {
        reference::layer_norm_forward(d, lo, hi);
      }
    });
  });
}

void layer_norm_backward(const LayerNormBackward& args) {
  const std::int64_t cols = args.x.shape().back();
  const std::int64_t rows = args.x.numel() / cols;
  with_dtype(args.x.dtype(), [&]<typename T>() {
    const reference::LayerNormBackwardData<T> d{
        .grad_x = data_or_null<T>(args.grad_x),
        .grad_weight = data_or_null<T>(args.grad_weight),
        .grad_bias = data_or_null<T>(args.grad_bias),
        .grad_y = args.grad_y.data<T>(),
        .x = args.x.data<T>(),
        .weight = data_or_null<T>(args.weight),
        .mean = args.mean.data<T>(),
        .rstd = args.rstd.data<T>(),
        .rows = rows,
        .cols = cols,
        .grad_x_write = args.grad_x_write,
    };
    if (d.grad_x != nullptr) {
      parallel_rows(rows, cols, [&](std::int64_t lo, std::int64_t hi) {
        if constexpr (std::is_same_v<T, float>) {
          run_float_lanes([&]<int W>() { backward_x_rows<W>(d, lo, hi); });
        } else {
          reference::layer_norm_backward_x(d, lo, hi);
        }
      });
    }
    if (d.grad_weight != nullptr || d.grad_bias != nullptr) {
      parallel_rows(cols, rows, [&](std::int64_t lo, std::int64_t hi) {
        if constexpr (std::is_same_v<T, float>) {
          run_float_lanes([&]<int W>() { backward_params_cols<W>(d, lo, hi); });
        } else {
          reference::layer_norm_backward_params(d, lo, hi);
        }
      });
    }
  });
}

}  // namespace towerlab::cpu
