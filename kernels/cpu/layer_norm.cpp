// CPU layer normalization: the plain reference (kernels/reference/layer_norm.h) on
// each thread's range (kernels/cpu/parallel.h). The forward and grad_x split over
// rows; grad_weight and grad_bias, sums over rows, split over their columns, so each
// column is summed by one thread in row order. Either way the result is the
// single-threaded one bit for bit.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cpu/layer_norm.h"

#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/layer_norm.h"

namespace towerlab::cpu {

namespace {

template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
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
      reference::layer_norm_forward(d, lo, hi);
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
        reference::layer_norm_backward_x(d, lo, hi);
      });
    }
    if (d.grad_weight != nullptr || d.grad_bias != nullptr) {
      parallel_rows(cols, rows, [&](std::int64_t lo, std::int64_t hi) {
        reference::layer_norm_backward_params(d, lo, hi);
      });
    }
  });
}

}  // namespace towerlab::cpu
