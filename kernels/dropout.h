// Dropout, forward and backward, with masks that depend on which sample an element
// belongs to, not on which tower computes it.
//
// Dimension letters: R rows (x's first dimension, the samples of a tower's slice),
// D the elements of a row (the product of the other dimensions); n = R D.
//
// The mask is drawn from the counter-based Philox generator (engine/philox.h), never
// stored: element (r, j) of x, the sample key.first_row + r of the whole batch, has
// the global index e = (key.first_row + r) D + j, and is kept when
//   u(e) >= p,  u(e) = philox::to_unit_float(word e % 4 of draw(seed, subsequence, e / 4))
// (dropout_unit in kernels/dropout_unit.h, the one definition both backends call).
// So a sample gets the same mask whether it sits on tower 0 of one or tower 2 of
// three, in this process or another: N towers and P processes take exactly one
// device's step, and a resumed run draws the same masks. The backward recomputes
// the mask from the key instead of keeping a byte per element.
//
// dropout_forward(y, x, p, key)
//   y[i] = x[i] * m[i],   m[i] = 1 / (1 - p) where kept, 0 where dropped    (ASSIGNED)
// dropout_backward(grad_x, grad_y, p, key, write)
//   grad_x[i] += grad_y[i] * m[i]     (ACCUMULATED; = with GradWrite::Assign, which
//                                      never reads grad_x: kernels/grad_write.h)
// x, y, grad_x, grad_y [R, ...] of one shape; y may alias x and grad_x may alias
// grad_y (each element is read before it is written, by the same thread).
// p in [0, 1]: p = 0 is the identity (every u >= 0), p = 1 drops everything (u < 1),
// and 1 / (1 - p) is rounded once to the dtype, so each kept value is x times that
// one number on every device: float32 results are bit-identical on CPU and CUDA.
// NaN: x * 0 keeps a NaN (and gives -0 for negative x), as PyTorch's x * mask * scale.
// In evaluation dropout is not called (ag::dropout returns its input).
//
// Keys. DropoutKey::subsequence separates the dropout ops of one step and the steps
// of a run: dropout_subsequence(step, name) mixes the step with the op's name (its
// variable scope, e.g. "block1/dropout"). The seed is the run's.
//
// Dtypes: float32 on every device, float64 on the CPU; the 16-bit dtypes get the
// typed error of kernels/checks.h.
#pragma once

#include <cstdint>
#include <string_view>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

struct DropoutKey {
  std::uint64_t seed = 0;
  std::uint64_t subsequence = 0;  // dropout_subsequence(step, name)
  std::int64_t first_row = 0;     // the global index, in the whole batch, of x's first row
};

// One stream per (step, op name): FNV-1a of the name, then the step mixed in by a
// 64-bit finalizer (splitmix64's), so neighbouring steps give unrelated streams.
std::uint64_t dropout_subsequence(std::uint64_t step, std::string_view name);

void dropout_forward(const Tensor& y, const Tensor& x, double p, const DropoutKey& key,
                     const Stream& stream);
void dropout_backward(const Tensor& grad_x, const Tensor& grad_y, double p, const DropoutKey& key,
                      const Stream& stream, GradWrite write = GradWrite::Accumulate);

}  // namespace towerlab
