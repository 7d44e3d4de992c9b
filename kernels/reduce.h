// Whole-tensor reductions.
//   sum(out, x)    out[0] = sum_i x[i]
//   mean(out, x)   out[0] = sum_i x[i] / n       (0 for an empty x, not NaN)
//   sum_squares(out, x)   out[0] = sum_i x[i]^2  (a gradient's squared norm: the
//                  trainer's clipping by the global norm, parallel/trainer.h)
//   first_nonfinite(x)    the smallest i with x[i] NaN or +-infinity, -1 if none
// `out` has one element and x's dtype, on x's device; the result stays on the
// device (no host round trip), so a reduction can feed the next kernel. The CPU
// sums float32 in double in index order (kernels/reference/reduce.h); CUDA sums
// with CUB's DeviceReduce, and the squares in the losses' two fixed stages
// (kernels/cuda/sum_terms.cuh), in float: fixed trees, so the result is the same
// bits run after run, within about 1e-6 relative of the CPU's.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

void sum(const Tensor& out, const Tensor& x, const Stream& stream);
void mean(const Tensor& out, const Tensor& x, const Stream& stream);
void sum_squares(const Tensor& out, const Tensor& x, const Stream& stream);
// The trainer's numerical guard asks this of the averaged gradient every step. The
// answer is needed on the host, so it waits for `stream`.
std::int64_t first_nonfinite(const Tensor& x, const Stream& stream);

}  // namespace towerlab
