#include "parallel/sync_batchnorm.h"

#include <algorithm>
#include <memory>

#include "engine/error.h"
#include "kernels/batchnorm.h"
#include "kernels/elementwise.h"

namespace towerlab {

TowerBatchNormSync::TowerBatchNormSync(std::vector<int> participants, ProcessGroup* group,
                                       std::string step, int stand_in)
    : participants_(std::move(participants)),
      stand_in_(stand_in),
      group_(group),
      step_(std::move(step)) {}

std::vector<TowerBatchNormSync::Published> TowerBatchNormSync::exchange(
    bool stats, int tower, const Tensor& a, const Tensor& b, std::int64_t count,
    const Stream& stream, std::size_t& index) {
  Published mine;
  mine.a = a.clone(stream);
  mine.b = b.clone(stream);
  mine.count = count;
  mine.ready = std::make_shared<Event>(stream.device());
  mine.ready->record(stream);

  std::unique_lock lock(mutex_);
  auto& calls = stats ? stats_calls_ : sum_calls_;
  index = (stats ? next_stats_ : next_sums_)[tower]++;
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
  if (tower == stand_in_) {  // (0, 0) with count 0: merging it changes nothing
    fill(mean, 0.0, stream);
    fill(m2, 0.0, stream);
    count = 0;
  }
  // Alone in one process: the merge of one tower's partials is those partials.
  if (alone()) return count;
  std::size_t index = 0;
  const std::vector<Published> all = exchange(true, tower, mean, m2, count, stream, index);
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
    batchnorm_merge_stats({.mean_a = mean,
                           .m2_a = m2,
                           .count_a = total,
                           .mean_b = other_mean,
                           .m2_b = other_m2,
                           .count_b = all[k].count},
                          stream);
    total += all[k].count;
  }
  if (group_ == nullptr) return total;
  return across_processes(true, index, tower, mean, m2, total, stream);
}

void TowerBatchNormSync::sum(int tower, const Tensor& a, const Tensor& b, const Stream& stream) {
  if (tower == stand_in_) {
    fill(a, 0.0, stream);
    fill(b, 0.0, stream);
  }
  if (alone()) return;  // the sum of one tower's sums
  std::size_t index = 0;
  const std::vector<Published> all = exchange(false, tower, a, b, 0, stream, index);
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
  if (group_ != nullptr) across_processes(false, index, tower, a, b, 0, stream);
}

std::int64_t TowerBatchNormSync::across_processes(bool stats, std::size_t index, int tower,
                                                  const Tensor& a, const Tensor& b,
                                                  std::int64_t count, const Stream& stream) {
  TL_CHECK(a.dtype() == DType::Float32, NotSupported,
           "synchronized batch norm across processes: " << a.describe()
                                                        << "; only float32 is exchanged");
  std::vector<float> host_a, host_b;
  if (tower == participants_.front()) {
    try {
      host_a = a.to_host<float>(stream);
      host_b = b.to_host<float>(stream);
      reduce_on_host(stats, host_a, host_b, count, index);
    } catch (...) {
      finish(tower, true);  // the rank's other towers stop waiting for this result
      throw;
    }
    std::lock_guard lock(mutex_);
    Call& call = (stats ? stats_calls_ : sum_calls_)[index];
    call.a = host_a;
    call.b = host_b;
    call.count = count;
    call.reduced = true;
    arrived_.notify_all();
  } else {
    std::unique_lock lock(mutex_);
    Call& call = (stats ? stats_calls_ : sum_calls_)[index];
    arrived_.wait(lock, [&] { return call.reduced || failed_; });
    TL_CHECK(call.reduced, Error,
             "synchronized batch norm: the collective across processes failed on tower "
                 << participants_.front() << " (tower " << tower << " stops too)");
    host_a = call.a;
    host_b = call.b;
    count = call.count;
  }
  copy_tensor(a, Tensor::from_host<float>(host_a, a.shape(), stream), stream);
  copy_tensor(b, Tensor::from_host<float>(host_b, b.shape(), stream), stream);
  return count;
}

void TowerBatchNormSync::reduce_on_host(bool stats, std::vector<float>& a, std::vector<float>& b,
                                        std::int64_t& count, std::size_t index) {
  const std::size_t channels = a.size();
  const std::string what =
      step_ + ": batch norm " + (stats ? "statistics " : "sums ") + std::to_string(index);
  if (!stats) {
    std::vector<float> both(a);
    both.insert(both.end(), b.begin(), b.end());
    group_->allreduce_sum(std::span<float>(both), what);
    std::copy(both.begin(), both.begin() + std::ptrdiff_t(channels), a.begin());
    std::copy(both.begin() + std::ptrdiff_t(channels), both.end(), b.begin());
    return;
  }
  // Row r: rank r's count, mean, M2, in double (exact for the float values and for
  // counts up to 2^53); the other ranks add zeros to it.
  const std::size_t row = 1 + 2 * channels;
  const int ranks = group_->size();
  std::vector<double> rows(std::size_t(ranks) * row, 0.0);
  double* mine = rows.data() + std::size_t(group_->rank()) * row;
  mine[0] = double(count);
  std::copy(a.begin(), a.end(), mine + 1);
  std::copy(b.begin(), b.end(), mine + 1 + channels);
  group_->allreduce_sum(std::span<double>(rows), what);
  // The rows merged in rank order by the towers' merge, on the host.
  const Stream& host = default_stream(Device::cpu());
  const Shape shape{std::int64_t(channels)};
  Tensor mean = Tensor::empty(shape, host), m2 = Tensor::empty(shape, host);
  Tensor other_mean = Tensor::empty(shape, host), other_m2 = Tensor::empty(shape, host);
  std::int64_t total = 0;
  for (int r = 0; r < ranks; ++r) {
    const double* from = rows.data() + std::size_t(r) * row;
    float* to_mean = (r == 0 ? mean : other_mean).data<float>();
    float* to_m2 = (r == 0 ? m2 : other_m2).data<float>();
    for (std::size_t c = 0; c < channels; ++c) {
      to_mean[c] = float(from[1 + c]);
      to_m2[c] = float(from[1 + channels + c]);
    }
    const std::int64_t n = std::int64_t(from[0]);
    // A rank without samples (count 0) changes nothing; skipping it also keeps a
    // merge of two empty partials from dividing by zero.
    if (r > 0 && n > 0) {
      batchnorm_merge_stats({.mean_a = mean,
                             .m2_a = m2,
                             .count_a = total,
                             .mean_b = other_mean,
                             .m2_b = other_m2,
                             .count_b = n},
                            host);
    }
    total += n;
  }
  a = mean.to_host<float>(host);
  b = m2.to_host<float>(host);
  count = total;
}

void TowerBatchNormSync::finish(int tower, bool failed) {
  std::lock_guard lock(mutex_);
  finished_[tower] = true;
  failed_ = failed_ || failed;
  arrived_.notify_all();
}

}  // namespace towerlab
