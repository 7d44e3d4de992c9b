#include "parallel/buckets.h"

#include <span>

#include "engine/clock.h"
#include "engine/error.h"
#include "engine/scope_exit.h"
#include "parallel/process_group.h"
#include "parallel/ring_allreduce.h"
#include "parallel/trace.h"

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

// Hears tower i's tape report a complete gradient.
struct BucketReducer::Listener final : GradientListener {
  BucketReducer& reducer;
  std::size_t tower;
  Listener(BucketReducer& reducer, std::size_t tower) : reducer(reducer), tower(tower) {}
  void gradient_ready(const std::string& name) override {
    reducer.ready(tower, reducer.readiness_.gradient_ready(tower, name));
  }
};

BucketReducer::BucketReducer(std::vector<Bucket> buckets,
                             const std::vector<const Stream*>& tower_streams,
                             BucketReduction reduction, DType contributions)
    : buckets_(std::move(buckets)),
      reduction_(reduction),
      tower_streams_(tower_streams),
      readiness_(buckets_, tower_streams.size()) {
  std::vector<const Stream*> comm;
  for (std::size_t i = 0; i < tower_streams_.size(); ++i) {
    const Device device = tower_streams_[i]->device();
    comm_streams_.push_back(std::make_unique<Stream>(device));
    comm.push_back(comm_streams_.back().get());
    comm_done_.emplace_back(device);
    ready_events_.emplace_back();
    for (std::size_t b = 0; b < buckets_.size(); ++b) ready_events_.back().emplace_back(device);
    listeners_.push_back(std::make_unique<Listener>(*this, i));
  }
  ring_ = std::make_unique<Ring>(comm, RingReads::InPlace, RingOnOneGpu::OneLaunch, contributions);
}

BucketReducer::~BucketReducer() = default;

void BucketReducer::start_step() {
  readiness_.start_step();
}

void BucketReducer::watch(std::size_t tower, Tape& tape) {
  for (const Bucket& b : buckets_) {
    for (const std::string& name : b.variables) {
      if (!tape.has_variable(name)) ready(tower, readiness_.gradient_ready(tower, name));
    }
  }
  tape.set_gradient_listener(listeners_[tower].get());
}

void BucketReducer::tower_done(std::size_t tower) {
  for (int b : readiness_.complete_all(tower)) ready(tower, b);
}

void BucketReducer::tower_failed() {
  readiness_.abort();
}

void BucketReducer::ready(std::size_t tower, int bucket) {
  if (bucket < 0) return;
  ready_events_[tower][std::size_t(bucket)].record(*tower_streams_[tower]);
  readiness_.publish(bucket);
}

void BucketReducer::reduce(const std::vector<Tensor>& grads, const std::string& step,
                           ProcessGroup* group, const Tensor& staging, Trace* trace,
                           int trace_row) {
  // Even when a tower failed: join() waits for these.
  ScopeExit record_done([this] {
    for (std::size_t i = 0; i < comm_streams_.size(); ++i) comm_done_[i].record(*comm_streams_[i]);
  });
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (!readiness_.wait(int(b))) return;  // a tower failed: its thread reports it
    const Bucket& bucket = buckets_[b];
    const std::string name =
        "gradient bucket " + std::to_string(b) + " of " + std::to_string(buckets_.size());
    const auto start = Clock::now();
    try {
      for (std::size_t i = 0; i < comm_streams_.size(); ++i) {
        comm_streams_[i]->wait(ready_events_[i][b]);
      }
      if (reduction_ == BucketReduction::ReduceScatter) {
        ring_->reduce_scatter_range(grads, bucket.begin, bucket.end);
      } else {
        ring_->allreduce_range(grads, bucket.begin, bucket.end);
      }
      if (group != nullptr) {
        // Staged through the host buffer, at the bucket's place in it.
        const Stream& stream = *comm_streams_[0];
        Tensor staged = staging.slice(bucket.begin, bucket.end);
        Tensor mine = grads[0].slice(bucket.begin, bucket.end);
        copy_tensor(staged, mine, stream);
        stream.synchronize();
        group->allreduce_sum(std::span<float>(staged.data<float>(), std::size_t(staged.numel())),
                             step + ": " + name,
                             ReduceFrame{std::size_t(bucket.begin), std::size_t(staging.numel())});
        copy_tensor(mine, staged, stream);
      }
    } catch (...) {
      rethrow_with_context("Trainer: " + name + " (" + bucket.variables.back() + " to " +
                           bucket.variables.front() + "): ");
    }
    if (trace != nullptr) {
      for (const auto& c : comm_streams_) c->synchronize();
      trace->span(
          trace_row, name, start, "buckets",
          {{"variables", std::int64_t(bucket.variables.size())}, {"bytes", bucket.bytes()}});
    }
  }
}

void BucketReducer::join() {
  for (std::size_t i = 0; i < tower_streams_.size(); ++i) tower_streams_[i]->wait(comm_done_[i]);
}

}  // namespace towerlab
