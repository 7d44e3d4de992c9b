// Permute (transpose is its two-axis case): y is x with its dimensions reordered,
// written out contiguous (the engine's tensors are contiguous, engine/tensor.h: a
// permutation is a copy, never a view).
//
// Dimensions: x has rank R and dims is a permutation of 0 .. R-1 (each entry may
// also be written from the end, -1 for R-1, as PyTorch's permute takes it). y has
// rank R and y.shape[k] = x.shape[dims[k]]:
//   permute_forward(y, x, dims)            y[i_0, ..., i_{R-1}] = x[j],  j[dims[k]] = i_k
//   permute_backward(grad_x, grad_y, dims) grad_x += grad_y permuted by the inverse of
//                                          dims (inverse_permutation), into x's shape
// The forward assigns y; the backward accumulates into grad_x, as every backward in
// towerlab does, or assigns it when asked (kernels/grad_write.h: every element is
// written). transpose(d0, d1) is the permutation that swaps d0 and d1
// (transpose_dims). A copy moves bits: NaN and infinities stay as they are, and the
// backward's additions are the only arithmetic.
//
// dtypes: every dtype the device holds (float32, bfloat16, float16; float64 on the
// CPU); one dtype for all tensors. A 16-bit accumulation adds in float32 and rounds
// once (engine/half.h), as a cast would.
//
// Aliasing: y must not overlap x (nor grad_x grad_y): a permutation cannot be
// written in place element by element.
//
// Speed: dimensions that stay next to each other in the same order are moved as
// one (kernels/permute_plan.h), so a permutation that keeps the last dimension
// copies whole rows; one that moves it (a transpose of the last two dimensions)
// goes through tiles, 32 x 32 on the CPU and through shared memory on CUDA, so that
// both the reads and the writes are contiguous.
//
// Errors: dims that are not a permutation of the rank (a repeated or out-of-range
// entry, the wrong length) are InvalidArgument naming the op, dims and x's shape;
// a y or grad_x of the wrong shape is a ShapeError naming both; tensors of
// different dtypes or devices are ShapeError / InvalidArgument (kernels/checks.h).
#pragma once

#include <cstdint>
#include <vector>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

void permute_forward(const Tensor& y, const Tensor& x, const std::vector<std::int64_t>& dims,
                     const Stream& stream);
void permute_backward(const Tensor& grad_x, const Tensor& grad_y,
                      const std::vector<std::int64_t>& dims, const Stream& stream,
                      GradWrite write = GradWrite::Accumulate);

// y's shape for permute_forward(y, x, dims): shape[dims[k]] for each k. Checks dims
// as permute_forward does (InvalidArgument naming `op`).
Shape permuted_shape(const char* op, const Shape& shape, const std::vector<std::int64_t>& dims);
// The permutation that undoes dims (dims checked, negative entries resolved):
// inverse[dims[k]] = k.
std::vector<std::int64_t> inverse_permutation(const std::vector<std::int64_t>& dims);
// The identity permutation of `rank` with d0 and d1 swapped (each may count from the
// end); InvalidArgument naming `op` when either is out of range.
std::vector<std::int64_t> transpose_dims(const char* op, std::int64_t rank, std::int64_t d0,
                                         std::int64_t d1);

}  // namespace towerlab
