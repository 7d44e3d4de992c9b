#include "parallel/buckets.h"

#include "engine/error.h"

namespace towerlab {

std::vector<Bucket> make_buckets(const VariableSet& set, std::int64_t bucket_bytes) {
  std::vector<Bucket> buckets;
  bool open = false;
  const auto& specs = set.specs();
  for (auto it = specs.rbegin(); it != specs.rend(); ++it) {
    if (!it->trainable) continue;
    if (!open) {
      buckets.push_back({it->offset + it->numel(), it->offset + it->numel(), {}});
      open = true;
    }
    Bucket& b = buckets.back();
    // Trainable variables are laid out back to back in declaration order.
    TL_CHECK(it->offset + it->numel() == b.begin, InvalidArgument,
             "make_buckets: variable " << it->name << " is not next to the bucket's range");
    b.begin = it->offset;
    b.variables.push_back(it->name);
    if (bucket_bytes > 0 && b.bytes() >= bucket_bytes) open = false;
  }
  return buckets;
}

BucketReadiness::BucketReadiness(const std::vector<Bucket>& buckets, std::size_t towers)
    : buckets_(buckets), pending_(towers), towers_ready_(buckets.size(), 0) {
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    for (const std::string& name : buckets[b].variables) bucket_of_[name] = int(b);
  }
  start_step();
}

void BucketReadiness::start_step() {
  for (auto& counts : pending_) {
    counts.clear();
    for (const Bucket& b : buckets_) counts.push_back(std::int64_t(b.variables.size()));
  }
  std::lock_guard lock(mutex_);
  std::fill(towers_ready_.begin(), towers_ready_.end(), 0);
  aborted_ = false;
}

int BucketReadiness::gradient_ready(std::size_t tower, const std::string& name) {
  const auto it = bucket_of_.find(name);
  // A Var made on the tape under a name that is not a trainable variable of the set
  // writes no flat gradient.
  if (it == bucket_of_.end()) return -1;
  std::int64_t& left = pending_[tower][std::size_t(it->second)];
  TL_CHECK(left > 0, InvalidArgument,
           "gradient buckets: tower " << tower << " reported " << name << " twice in one step");
  return --left == 0 ? it->second : -1;
}

std::vector<int> BucketReadiness::complete_all(std::size_t tower) {
  std::vector<int> completed;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (pending_[tower][b] == 0) continue;
    pending_[tower][b] = 0;
    completed.push_back(int(b));
  }
  return completed;
}

void BucketReadiness::publish(int bucket) {
  {
    std::lock_guard lock(mutex_);
    ++towers_ready_[std::size_t(bucket)];
  }
  changed_.notify_all();
}

void BucketReadiness::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  changed_.notify_all();
}

bool BucketReadiness::wait(int bucket) {
  std::unique_lock lock(mutex_);
  changed_.wait(
      lock, [&] { return aborted_ || towers_ready_[std::size_t(bucket)] == int(pending_.size()); });
  return !aborted_;
}

}  // namespace towerlab
