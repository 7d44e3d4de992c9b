#include "parallel/batch_split.h"

#include "engine/error.h"

namespace towerlab {

std::vector<TowerSlice> split_batch(std::int64_t batch, std::int64_t towers) {
  TL_CHECK(towers > 0, InvalidArgument, "split_batch: no towers");
  TL_CHECK(batch >= 0, InvalidArgument, "split_batch: negative batch size " << batch);
  std::vector<TowerSlice> slices;
  std::int64_t begin = 0;
  for (std::int64_t t = 0; t < towers; ++t) {
    const std::int64_t size = batch / towers + (t < batch % towers ? 1 : 0);
    slices.push_back({begin, begin + size, batch > 0 ? double(size) / double(batch) : 0.0});
    begin += size;
  }
  return slices;
}

}  // namespace towerlab
