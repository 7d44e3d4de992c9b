// CPU bias add (contracts in kernels/bias.h, the plain reference in
// kernels/reference/bias.h). Tensors viewed as [N,C,S]. The float32 forwards (plain
// and fused with ReLU) run in vector lanes (kernels/cpu/float_lanes.h: AVX-512, AVX2
// or four portable lanes) along the contiguous dimension, the reference's adds and
// ReLU's selection and so their bits; float64 runs the reference.
// Every loop splits over the thread pool (kernels/cpu/parallel.h): the forwards over
// the N images, the backwards over the channels, each channel summing its rows in
// order n = 0, 1, ... whichever thread runs it. Every loop serves the four dtypes:
// a 16-bit x, y, grad_y or grad_x is computed on in float32 and rounded once, with
// bias and grad_bias in float32 (kernels/reference/math_type.h). The 16-bit values
// are widened and rounded by kernels/cpu/convert16.h's vector conversions, a block
// or a row at a time into float32 scratch, and the float32 arithmetic on the
// scratch is the same as on 16-bit values one at a time: the same bits.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bias.h"
#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/float_lanes.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/per_channel.h"
#include "kernels/cpu/relu.h"
#include "kernels/reference/bias.h"
#include "kernels/reference/math_type.h"

namespace towerlab::cpu {

using reference::kIs16Bit;
using reference::math_t;

namespace {

// y = round(x + bias[c]) on the 16-bit values of whole images, [N,C,S] from an
// image's start, and with `relu` then ReLU's forward on the rounded values (so a
// sum that rounds to -0 stays -0, as the unfused pair gives). The values are
// converted a block at a time; a block's bias is added in runs of one channel
// (S > 1) or along the row of channels (S = 1), vectorizable loops either way.
template <typename T>
void bias_add_16bit(T* y, const T* x, const float* bias, std::int64_t N, std::int64_t C,
                    std::int64_t S, bool relu) {
  std::int64_t c = 0, s = 0;  // the channel and position in its row of the next value
  for_each_block(N * C * S, [&](std::int64_t first, std::int64_t count) {
    float v[kConvertBlock];
    widen_16bit(v, x + first, count);
    for (std::int64_t i = 0; i < count;) {
      if (S == 1) {
        const std::int64_t run = std::min(count - i, C - c);
        for (std::int64_t k = 0; k < run; ++k) v[i + k] += bias[c + k];
        i += run;
        c += run;
      } else {
        const std::int64_t run = std::min(count - i, S - s);
        const float b = bias[c];
        for (std::int64_t k = 0; k < run; ++k) v[i + k] += b;
        i += run;
        s += run;
        if (s == S) {
          s = 0;
          ++c;
        }
      }
      if (c == C) c = 0;
    }
    round_to_16bit(y + first, v, count);
    if (relu) relu_forward_16bit(y + first, y + first, count);
  });
}

// y = x + bias[c] on float32 [N,C,S] in groups of W lanes, each value's one float32
// add as in the reference (its bits): with S = 1 (a linear layer's rows) a row of C
// channels adds the bias vector, otherwise a channel's run of S values adds its
// bias in every lane. The reference's inner loop runs over S, which is 1 for every
// linear layer: the lanes run along whichever dimension is contiguous. y may alias
// x (a group is read before it is written). With `relu`, each sum then goes through
// ReLU's forward as the reference's "v < 0 ? +0 : v" (a selection on the comparison,
// which is false for a NaN and for -0: both stay as they are).
template <int W>
void bias_add_lanes(float* y, const float* x, const float* bias, std::int64_t N, std::int64_t C,
                    std::int64_t S, bool relu) {
  const auto activation = [relu](FloatLanes<W> v) {
    return relu ? select_lanes<W>(v < 0.0f, splat_lanes<W>(0.0f), v) : v;
  };
  if (S == 1) {
    for (std::int64_t n = 0; n < N; ++n) {
      float* y_row = y + n * C;        // [C]
      const float* x_row = x + n * C;  // [C]
      for_each_lane_group<W>(C, [&](std::int64_t i, std::int64_t count) {
        store_lanes<W>(y_row + i,
                       activation(load_lanes<W>(x_row + i, count) + load_lanes<W>(bias + i, count)),
                       count);
      });
    }
    return;
  }
  for (std::int64_t row = 0; row < N * C; ++row) {
    const FloatLanes<W> b = splat_lanes<W>(bias[row % C]);
    float* y_run = y + row * S;        // [S]
    const float* x_run = x + row * S;  // [S]
    for_each_lane_group<W>(S, [&](std::int64_t i, std::int64_t count) {
      store_lanes<W>(y_run + i, activation(load_lanes<W>(x_run + i, count) + b), count);
    });
  }
}

// Rows of a T tensor as math_t<T> values, for the backwards' loops: the row itself
// in float32 and float64; in bfloat16 and float16 its widening into this reader's
// scratch, which write_back rounds into the row (a no-op for the others).
template <typename T>
class MathRows {
 public:
  const math_t<T>* read(const T* row, std::int64_t n) {
    if constexpr (kIs16Bit<T>) {
      return widened(row, n);
    } else {
      return row;
    }
  }
  math_t<T>* edit(T* row, std::int64_t n) {
    if constexpr (kIs16Bit<T>) {
      return widened(row, n);
    } else {
      return row;
    }
  }
  void write_back(T* row, const math_t<T>* values, std::int64_t n) {
    if constexpr (kIs16Bit<T>) round_to_16bit(row, values, n);
  }

 private:
  float* widened(const T* row, std::int64_t n) {
    scratch_.resize(static_cast<std::size_t>(n));
    widen_16bit(scratch_.data(), row, n);
    return scratch_.data();
  }

  std::vector<float> scratch_;
};

// y = x + bias[c]; with `relu`, rounded, then ReLU's NaN rule (kernels/reference/relu.h),
// in one pass: rounding before the ReLU keeps a 16-bit sum that rounds to -0 a -0, as
// the unfused pair does. Float32 runs in vector lanes (bias_add_lanes), float64 the
// reference or, with `relu`, the plain loop.
void bias_add_rows(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                   std::int64_t C, std::int64_t S, bool relu) {
  with_any_dtype(x.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    T* out = y.data<T>();         // [N,C,S]
    const T* in = x.data<T>();    // [N,C,S]
    const M* b = bias.data<M>();  // [C]
    parallel_rows(N, C * S, [&](std::int64_t first, std::int64_t last) {
      if constexpr (kIs16Bit<T>) {
        bias_add_16bit(out + first * C * S, in + first * C * S, b, last - first, C, S, relu);
      } else if constexpr (std::is_same_v<T, float>) {
        run_float_lanes([&]<int W>() {
          bias_add_lanes<W>(out + first * C * S, in + first * C * S, b, last - first, C, S, relu);
        });
      } else if (!relu) {
        reference::bias_add_forward(out + first * C * S, in + first * C * S, b, last - first, C, S);
      } else {
        for (std::int64_t n = first; n < last; ++n) {
          for (std::int64_t c = 0; c < C; ++c) {
            const std::int64_t base = (n * C + c) * S;
            for (std::int64_t s = 0; s < S; ++s) {
              const T v = static_cast<T>(static_cast<M>(in[base + s]) + b[c]);
              out[base + s] = static_cast<M>(v) < M(0) ? T(M(0)) : v;
            }
          }
        }
      }
    });
  });
}

}  // namespace

void bias_add_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                      std::int64_t C, std::int64_t S) {
  bias_add_rows(y, x, bias, N, C, S, false);
}

// Sums in double whatever the dtype, a row's S values in sum_over's four running
// sums (the reference's one running sum within a rounding), then adds once. With
// S = 1 (a linear layer's [N,C]) a channel's values lie a row apart: the channels
// are then summed sixteen at a time (a cache line of float32), row after row, each
// in its own running sum in order n = 0, 1, ...: the same additions, read along the
// rows instead of down the columns.
void bias_add_backward(const Tensor& grad_bias, const Tensor& grad_y, std::int64_t N,
                       std::int64_t C, std::int64_t S) {
  with_any_dtype(grad_y.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    const T* gy = grad_y.data<T>();  // [N,C,S]
    M* gb = grad_bias.data<M>();     // [C]
    if (S == 1) {
      constexpr std::int64_t kLanes = 16;
      parallel_rows((C + kLanes - 1) / kLanes, kLanes * N,
                    [&](std::int64_t first, std::int64_t last) {
                      const std::int64_t c0 = first * kLanes, c1 = std::min(C, last * kLanes);
                      std::vector<double> sums(static_cast<std::size_t>(c1 - c0), 0.0);
                      MathRows<T> rows;
                      for (std::int64_t n = 0; n < N; ++n) {
                        const M* row = rows.read(gy + n * C + c0, c1 - c0);  // channels c0..c1
                        for (std::int64_t c = c0; c < c1; ++c)
                          sums[c - c0] += static_cast<double>(row[c - c0]);
                      }
                      for (std::int64_t c = c0; c < c1; ++c) {
                        gb[c] = static_cast<M>(static_cast<double>(gb[c]) + sums[c - c0]);
                      }
                    });
      return;
    }
    parallel_rows(C, N * S, [&](std::int64_t first, std::int64_t last) {
      MathRows<T> rows;
      for (std::int64_t c = first; c < last; ++c) {
        double sum = 0.0;
        for (std::int64_t n = 0; n < N; ++n) {
          const M* row = rows.read(gy + (n * C + c) * S, S);
          sum += sum_over(S, [&](std::int64_t s) { return static_cast<double>(row[s]); });
        }
        gb[c] = static_cast<M>(static_cast<double>(gb[c]) + sum);
      }
    });
  });
}

void bias_add_relu_forward(const Tensor& y, const Tensor& x, const Tensor& bias, std::int64_t N,
                           std::int64_t C, std::int64_t S) {
  bias_add_rows(y, x, bias, N, C, S, true);
}

// One pass: each masked gradient value is added to grad_x (when it is wanted) and
// to its channel's sum, which goes into grad_bias once; each channel sums its
// values in order n = 0, 1, ... (then s), as bias_add_backward does.
void bias_add_relu_backward(const Tensor& grad_x, const Tensor& grad_bias, const Tensor& grad_y,
                            const Tensor& y, std::int64_t N, std::int64_t C, std::int64_t S) {
  with_any_dtype(grad_y.dtype(), [&]<typename T>() {
    using M = math_t<T>;
    const T* gy = grad_y.data<T>();                         // [N,C,S]
    const T* out = y.data<T>();                             // [N,C,S]
    T* gx = grad_x.defined() ? grad_x.data<T>() : nullptr;  // [N,C,S]
    M* gb = grad_bias.data<M>();                            // [C]
    // A row of `count` values from `first`: each masked gradient value in M, added
    // to grad_x's row (a 16-bit one widened, added to in float32 and rounded once)
    // and passed to `sum`, in order.
    struct Rows {
      MathRows<T> gy, y, gx;
    };
    const auto masked_row = [&](Rows& rows, std::int64_t first, std::int64_t count,
                                const auto& sum) {
      const M* g = rows.gy.read(gy + first, count);
      const M* o = rows.y.read(out + first, count);
      M* x = gx != nullptr ? rows.gx.edit(gx + first, count) : nullptr;
      sum(count, [&](std::int64_t k) {
        const M m = relu_mask(g[k], o[k]);
        if (x != nullptr) x[k] += m;
        return static_cast<double>(m);
      });
      if (x != nullptr) rows.gx.write_back(gx + first, x, count);
    };
    if (S == 1) {
      // [N,C], a fully connected layer: a channel's values are C apart, so a thread
      // walks the rows for its block of channels, keeping one sum per channel.
      parallel_rows(C, N, [&](std::int64_t first, std::int64_t last) {
        std::vector<double> sum(static_cast<std::size_t>(last - first), 0.0);
        Rows rows;
        for (std::int64_t n = 0; n < N; ++n) {
          masked_row(rows, n * C + first, last - first, [&](std::int64_t count, const auto& term) {
            for (std::int64_t k = 0; k < count; ++k) sum[static_cast<std::size_t>(k)] += term(k);
          });
        }
        for (std::int64_t c = first; c < last; ++c) {
          gb[c] =
              static_cast<M>(static_cast<double>(gb[c]) + sum[static_cast<std::size_t>(c - first)]);
        }
      });
      return;
    }
    parallel_rows(C, N * S, [&](std::int64_t first, std::int64_t last) {
      Rows rows;
      for (std::int64_t c = first; c < last; ++c) {
        double sum = 0.0;
        for (std::int64_t n = 0; n < N; ++n) {
          masked_row(rows, (n * C + c) * S, S,
                     [&](std::int64_t count, const auto& term) { sum += sum_over(count, term); });
        }
        gb[c] = static_cast<M>(static_cast<double>(gb[c]) + sum);
      }
    });
  });
}

}  // namespace towerlab::cpu
