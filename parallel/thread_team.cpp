#include "parallel/thread_team.h"

#include <algorithm>
#include <optional>

#include "engine/error.h"
#include "engine/thread_pool.h"

namespace towerlab {

ThreadTeam::ThreadTeam(std::size_t n, std::size_t kernel_threads)
    : errors_(n), kernel_threads_(std::min(n, kernel_threads)) {
  TL_CHECK(n >= 1, InvalidArgument, "ThreadTeam: 0 members; a team needs at least one");
  for (std::size_t i = 1; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
}

ThreadTeam::~ThreadTeam() {
  stop_ = true;
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadTeam::run(const std::function<void(std::size_t)>& job) {
  job_ = &job;
  for (auto& e : errors_) e = nullptr;
  if (kernel_threads_ > 0) shares_.start(int(kernel_threads_));
  remaining_.store(threads_.size(), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_member(0);
  for (std::size_t left; (left = remaining_.load(std::memory_order_acquire)) != 0;) {
    remaining_.wait(left, std::memory_order_acquire);
  }
  job_ = nullptr;
  for (auto& e : errors_) {
    if (e) std::rethrow_exception(e);
  }
}

void ThreadTeam::run_member(std::size_t i) {
  // The members run kernels at the same time, so each takes its share of the host
  // thread pool (engine/thread_pool.h): n members on P cores run P threads, not nP,
  // and a member that finishes first lends its share to those still running (the
  // team's ThreadShareGroup). A member that runs no kernels takes a share of one:
  // index 0 of num_threads().
  std::optional<ThreadShare> share;
  if (i < kernel_threads_) {
    share.emplace(int(i), int(kernel_threads_), shares_);
  } else {
    share.emplace(0, num_threads());
  }
  try {
    (*job_)(i);
  } catch (...) {
    // Moved into place, never copied: the exception's last reference must not be
    // dropped on a member's thread after run() has rethrown it on the caller's
    // (ThreadSanitizer reports the member destroying it while the caller reads it).
    errors_[i] = std::current_exception();
  }
}  // the member's share goes back to the group before run() can return

void ThreadTeam::loop(std::size_t i) {
  for (std::uint64_t seen = 0;;) {
    generation_.wait(seen, std::memory_order_acquire);  // until run() or the destructor bumps it
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    run_member(i);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_all();
  }
}

}  // namespace towerlab
