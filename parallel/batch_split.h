// Splitting a batch among towers: sizes differ by at most one (the first N mod T
// towers get one sample more), a tower with no samples sits the step out, nothing
// is dropped, and each tower's weight is its share of the samples, so that the
// weighted sum of the towers' mean losses is the mean loss of the whole batch.
// Across processes the batch is split among the ranks first, the same way, then
// each rank's share among its towers; a tower's weight stays its share of the
// whole (global) batch.
#pragma once

#include <cstdint>
#include <vector>

namespace towerlab {

struct TowerSlice {
  std::int64_t begin = 0;  // first sample of the batch
  std::int64_t end = 0;    // one past the last
  double weight = 0.0;     // (end - begin) / batch size; 0 for an empty tower
  std::int64_t size() const { return end - begin; }
};

// Throws InvalidArgument for a negative batch or no towers.
std::vector<TowerSlice> split_batch(std::int64_t batch, std::int64_t towers);

// Rank `rank`'s towers: its share of the batch (split among `ranks`) split among
// its `towers`, as slices of the whole batch weighted by their share of it.
// split_batch(n, 1, 0, t) is split_batch(n, t). Throws InvalidArgument for a rank
// outside [0, ranks), besides split_batch's cases.
std::vector<TowerSlice> split_batch(std::int64_t batch, std::int64_t ranks, std::int64_t rank,
                                    std::int64_t towers);

}  // namespace towerlab
