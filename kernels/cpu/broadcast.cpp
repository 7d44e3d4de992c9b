// CPU broadcasting, on the index spaces of kernels/broadcast_plan.h, whose last
// dimension each loop walks as a run: broadcast_binary's runs have strides 0 or 1
// for each operand (the last dimension kept is contiguous in every operand that
// has it), which the compiler vectorizes; sum_to_shape keeps a run of outputs'
// sums side by side in double and adds each reduced step to all of them, so each
// output still adds its values one at a time in the reference's row-major order.
// Both therefore give the reference's bits (kernels/reference/broadcast.h, against
// which the tests hold them), and split over outputs on the thread pool, each
// computed whole by one thread, the single-threaded bits.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cpu/broadcast.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/error.h"
#include "kernels/broadcast_plan.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"

namespace towerlab::cpu {

namespace {

using kernels::StridedDims;

// The operands' offsets of index i of the first `rank` dimensions of `dims`.
void offsets_of(std::int64_t i, const StridedDims& dims, int rank, std::int64_t& first,
                std::int64_t& second) {
  first = second = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const std::int64_t coord = i % dims.size[d];
    i /= dims.size[d];
    first += coord * dims.stride[0][d];
    second += coord * dims.stride[1][d];
  }
}

// out[j] = a[j * sa] op b[j * sb] for j < n, with the strides fixed at compile time.
template <typename T, std::int64_t kSa, std::int64_t kSb>
void run(T* out, const T* a, const T* b, std::int64_t n, BroadcastOp op) {
  if (op == BroadcastOp::Add) {
    for (std::int64_t j = 0; j < n; ++j) out[j] = a[j * kSa] + b[j * kSb];
  } else if (op == BroadcastOp::Sub) {
    for (std::int64_t j = 0; j < n; ++j) out[j] = a[j * kSa] - b[j * kSb];
  } else {
    for (std::int64_t j = 0; j < n; ++j) out[j] = a[j * kSa] * b[j * kSb];
  }
}

}  // namespace

void broadcast_binary(const Tensor& out, const Tensor& a, const Tensor& b, BroadcastOp op) {
  const StridedDims dims = kernels::binary_dims(out.shape(), a.shape(), b.shape());
  // The run: the last dimension (one value when every dimension has size 1).
  const int last = dims.rank - 1;
  const std::int64_t run_length = last >= 0 ? dims.size[last] : 1;
  const std::int64_t sa = last >= 0 ? dims.stride[0][last] : 1;
  const std::int64_t sb = last >= 0 ? dims.stride[1][last] : 1;
  with_dtype(out.dtype(), [&]<typename T>() {
    T* y = out.data<T>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    parallel_rows(out.numel() / run_length, run_length, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        std::int64_t oa, ob;
        offsets_of(r, dims, last < 0 ? 0 : last, oa, ob);
        T* o = y + r * run_length;
        // A run's strides are 0 or 1: the last dimension kept is contiguous in every
        // operand that has it, and at least one has it.
        if (sa == 1 && sb == 1) {
          run<T, 1, 1>(o, pa + oa, pb + ob, run_length, op);
        } else if (sa == 1 && sb == 0) {
          run<T, 1, 0>(o, pa + oa, pb + ob, run_length, op);
        } else {
          TL_CHECK(sa == 0 && sb == 1, InvalidArgument,
                   "broadcast_binary: a run with strides " << sa << " and " << sb);
          run<T, 0, 1>(o, pa + oa, pb + ob, run_length, op);
        }
      }
    });
  });
}

void sum_to_shape(const Tensor& out, const Tensor& x, GradWrite write) {
  const kernels::SumDims plan = kernels::sum_dims(out.shape(), x.shape());
  const StridedDims& kept = plan.kept;
  const StridedDims& reduced = plan.reduced;
  // A run: the last kept dimension (or one output), and the last reduced one.
  const int kept_last = kept.rank - 1, reduced_last = reduced.rank - 1;
  const std::int64_t outputs = kept.rank > 0 ? kept.size[kept_last] : 1;
  const std::int64_t out_step = kept.rank > 0 ? kept.stride[0][kept_last] : 0;
  const std::int64_t steps = reduced.rank > 0 ? reduced.size[reduced_last] : 1;
  const std::int64_t x_step = reduced.rank > 0 ? reduced.stride[0][reduced_last] : 0;
  const std::int64_t outer_steps = plan.count / steps;  // 0 for an empty x
  with_dtype(out.dtype(), [&]<typename T>() {
    T* y = out.data<T>();
    const T* px = x.data<T>();
    parallel_rows(
        out.numel() / outputs, outputs * (plan.count + 1), [&](std::int64_t lo, std::int64_t hi) {
          std::vector<double> sums(static_cast<std::size_t>(outputs));
          for (std::int64_t q = lo; q < hi; ++q) {
            std::int64_t base, unused;
            offsets_of(q, kept, kept_last < 0 ? 0 : kept_last, base, unused);
            std::fill(sums.begin(), sums.end(), 0.0);
            for (std::int64_t s = 0; s < outer_steps; ++s) {
              std::int64_t offset;
              offsets_of(s, reduced, reduced_last < 0 ? 0 : reduced_last, offset, unused);
              const T* from = px + base + offset;
              // Each output's values in step order either way; the loop that walks
              // memory contiguously goes inside.
              if (out_step == 1) {
                for (std::int64_t t = 0; t < steps; ++t) {
                  const T* step = from + t * x_step;
                  for (std::int64_t k = 0; k < outputs; ++k)
                    sums[std::size_t(k)] += double(step[k]);
                }
              } else {
                for (std::int64_t k = 0; k < outputs; ++k) {
                  const T* values = from + k * out_step;
                  double sum = sums[std::size_t(k)];
                  for (std::int64_t t = 0; t < steps; ++t) sum += double(values[t * x_step]);
                  sums[std::size_t(k)] = sum;
                }
              }
            }
            T* to = y + q * outputs;
            for (std::int64_t k = 0; k < outputs; ++k) {
              const double sum = sums[std::size_t(k)];
              to[k] =
                  write == GradWrite::Assign ? static_cast<T>(sum) : static_cast<T>(to[k] + sum);
            }
          }
        });
  });
}

}  // namespace towerlab::cpu
