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

std::vector<TowerSlice> split_batch(std::int64_t batch, std::int64_t ranks, std::int64_t rank,
                                    std::int64_t towers) {
  TL_CHECK(ranks > 0, InvalidArgument, "split_batch: no ranks");
  TL_CHECK(rank >= 0 && rank < ranks, InvalidArgument,
           "split_batch: rank " << rank << " of " << ranks << " (ranks count from 0)");
  const TowerSlice share = split_batch(batch, ranks)[std::size_t(rank)];
  std::vector<TowerSlice> slices = split_batch(share.size(), towers);
  for (TowerSlice& s : slices) {
    s.begin += share.begin;
    s.end += share.begin;
    s.weight = batch > 0 ? double(s.size()) / double(batch) : 0.0;
  }
  return slices;
}

}  // namespace towerlab
