// CPU broadcasting: the plain reference (kernels/reference/broadcast.h) on each
// thread's range of outputs (kernels/cpu/parallel.h). Each output is computed
// whole by one thread, its sum included, so the result is the single-threaded one
// bit for bit.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cpu/broadcast.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/broadcast.h"

namespace towerlab::cpu {

void broadcast_binary(const Tensor& out, const Tensor& a, const Tensor& b, BroadcastOp op) {
  with_dtype(out.dtype(), [&]<typename T>() {
    parallel_rows(out.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      reference::broadcast_binary(out.data<T>(), out.shape(), a.data<T>(), a.shape(), b.data<T>(),
                                  b.shape(), op, lo, hi);
    });
  });
}

void sum_to_shape(const Tensor& out, const Tensor& x, GradWrite write) {
  const std::int64_t per_output = std::max<std::int64_t>(1, x.numel() / out.numel());
  with_dtype(out.dtype(), [&]<typename T>() {
    parallel_rows(out.numel(), per_output, [&](std::int64_t lo, std::int64_t hi) {
      reference::sum_to_shape(out.data<T>(), out.shape(), x.data<T>(), x.shape(), lo, hi, write);
    });
  });
}

}  // namespace towerlab::cpu
