// A permutation as the backends move it (contract in kernels/permute.h): the
// dimensions of size 1 dropped, and the dimensions that stay next to each other in
// the same order merged into one, so that y [2,3,4,5] = x [2,3,5,4] permuted by
// (0,1,3,2) moves as y [6,4,5] from x [6,5,4] by (0,2,1), and a permutation that
// keeps the last dimension copies rows of its full length. Built once by the
// dispatch (kernels/permute.cpp), read by the CPU backend and the CUDA launcher:
// the layout is data, computed in one place. Internal: not installed.
#pragma once

#include <cstdint>
#include <vector>

#include "../engine/tensor.h"

namespace towerlab {

// Ranks above this after merging (a permutation of 9 or more dimensions none of
// which stay together) are NotSupported.
constexpr int kMaxPermuteRank = 8;

struct PermutePlan {
  int rank = 0;                              // after merging; 0 for a single element
  std::int64_t shape[kMaxPermuteRank]{};     // y's merged shape, dimension k
  std::int64_t x_stride[kMaxPermuteRank]{};  // elements of x between neighbours along y's k
  std::int64_t numel = 0;

  // Elements of y between neighbours along y's dimension k (row-major).
  std::int64_t y_stride(int k) const {
    std::int64_t stride = 1;
    for (int d = k + 1; d < rank; ++d) stride *= shape[d];
    return stride;
  }
  // The dimension of y along which x is contiguous (x_stride 1), or -1 for rank 0.
  int x_contiguous_dim() const {
    for (int k = 0; k < rank; ++k) {
      if (x_stride[k] == 1) return k;
    }
    return -1;
  }
  // A batch of 2-D transposes: y [batch, cols, rows] from x [batch, rows, cols]
  // (rank 2 with batch 1, or rank 3 with the batch outermost in both).
  bool is_batched_transpose() const {
    return (rank == 2 && x_stride[0] == 1) ||
           (rank == 3 && x_stride[1] == 1 && x_stride[0] == shape[1] * shape[2]);
  }
};

// dims already checked (a permutation of x_shape's rank, no negative entries).
// NotSupported naming `op` when more than kMaxPermuteRank dimensions remain.
PermutePlan plan_permute(const char* op, const Shape& x_shape,
                         const std::vector<std::int64_t>& dims);

}  // namespace towerlab
