// The plain reference of permute (contract in kernels/permute.h): one loop over y's
// elements, each looked up in x by its index. The CPU backend's rows and tiles and
// the CUDA kernels are tested against it. T is float, double, bfloat16 or float16.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"
#include "kernels/grad_write.h"

namespace towerlab::reference {

// y = (or +=) x permuted by dims: x [x_shape], y [x_shape[dims[0]], ...]; dims a
// permutation of 0 .. R-1 (no negative entries).
template <typename T>
void permute(T* y, const T* x, const Shape& x_shape, const std::vector<std::int64_t>& dims,
             GradWrite write);

}  // namespace towerlab::reference
