#include "parallel/sync_batchnorm.h"

#include <algorithm>
#include <memory>

#include "engine/error.h"
#include "kernels/batchnorm.h"
#include "kernels/elementwise.h"

namespace towerlab {

TowerBatchNormSync::TowerBatchNormSync(std::vector<int> participants)
    : participants_(std::move(participants)) {}

std::vector<TowerBatchNormSync::Published> TowerBatchNormSync::exchange(bool stats, int tower,
                                                                        const Tensor& a,
                                                                        const Tensor& b,
                                                                        std::int64_t count,
                                                                        const Stream& stream) {
  Published mine;
  mine.a = a.clone(stream);
  mine.b = b.clone(stream);
  mine.count = count;
  mine.ready = std::make_shared<Event>(stream.device());
  mine.ready->record(stream);

  std::unique_lock lock(mutex_);
  auto& calls = stats ? stats_calls_ : sum_calls_;
  const std::size_t index = (stats ? next_stats_ : next_sums_)[tower]++;
  if (calls.size() <= index) calls.resize(index + 1);
  calls[index].by_tower[tower] = mine;
  arrived_.notify_all();
  arrived_.wait(lock, [&] {
    if (failed_) return true;
    for (int p : participants_) {
      if (!calls[index].by_tower.contains(p) && finished_[p]) return true;  // it never will
    }
    return calls[index].by_tower.size() == participants_.size();
  });
  TL_CHECK(!failed_, Error,
           "synchronized batch norm: another tower failed during this step (tower "
               << tower << " stops too)");
  TL_CHECK(calls[index].by_tower.size() == participants_.size(), InvalidArgument,
           "synchronized batch norm: the towers made different numbers of batch-norm calls "
           "(the tower function must run the same layers on every tower)");
  std::vector<Published> all;
  for (int p : participants_) all.push_back(calls[index].by_tower.at(p));
  return all;
}

std::int64_t TowerBatchNormSync::merge_stats(int tower, const Tensor& mean, const Tensor& m2,
                                             std::int64_t count, const Stream& stream) {
  const std::vector<Published> all = exchange(true, tower, mean, m2, count, stream);
  // mean, m2 := the first participant's partials, then merge the others in order.
  Tensor other_mean = Tensor::empty(mean.shape(), stream, mean.dtype());
  Tensor other_m2 = Tensor::empty(m2.shape(), stream, m2.dtype());
  std::int64_t total = 0;
  for (std::size_t k = 0; k < all.size(); ++k) {
    stream.wait(*all[k].ready);
    if (k == 0) {
      copy_tensor(mean, all[k].a, stream);
      copy_tensor(m2, all[k].b, stream);
      total = all[k].count;
      continue;
    }
    copy_tensor(other_mean, all[k].a, stream);
    copy_tensor(other_m2, all[k].b, stream);
    batchnorm_merge_stats(mean, m2, total, other_mean, other_m2, all[k].count, stream);
    total += all[k].count;
  }
  return total;
}

void TowerBatchNormSync::sum(int tower, const Tensor& a, const Tensor& b, const Stream& stream) {
  const std::vector<Published> all = exchange(false, tower, a, b, 0, stream);
  Tensor other_a = Tensor::empty(a.shape(), stream, a.dtype());
  Tensor other_b = Tensor::empty(b.shape(), stream, b.dtype());
  for (std::size_t k = 0; k < all.size(); ++k) {
    stream.wait(*all[k].ready);
    if (k == 0) {
      copy_tensor(a, all[k].a, stream);
      copy_tensor(b, all[k].b, stream);
      continue;
    }
    copy_tensor(other_a, all[k].a, stream);
    copy_tensor(other_b, all[k].b, stream);
    add(a, a, other_a, stream);
    add(b, b, other_b, stream);
  }
}

void TowerBatchNormSync::finish(int tower, bool failed) {
  std::lock_guard lock(mutex_);
  finished_[tower] = true;
  failed_ = failed_ || failed;
  arrived_.notify_all();
}

}  // namespace towerlab
