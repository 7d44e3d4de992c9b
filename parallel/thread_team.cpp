#include "parallel/thread_team.h"

#include <algorithm>
#include <optional>

#include "engine/thread_pool.h"

namespace towerlab {

ThreadTeam::ThreadTeam(std::size_t n, std::size_t kernel_threads)
    : kernel_threads_(std::min(n, kernel_threads)), errors_(n) {
  for (std::size_t i = 0; i < n; ++i) {
    threads_.emplace_back([this, i, kernel_threads] { loop(i, kernel_threads); });
  }
}

ThreadTeam::~ThreadTeam() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadTeam::run(const std::function<void(std::size_t)>& job) {
  {
    std::lock_guard lock(mutex_);
    job_ = &job;
    remaining_ = threads_.size();
    if (kernel_threads_ > 0) shares_.start(int(kernel_threads_));
    for (auto& e : errors_) e = nullptr;
    ++generation_;
  }
  start_.notify_all();
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return remaining_ == 0; });
  job_ = nullptr;
  for (auto& e : errors_) {
    if (e) std::rethrow_exception(e);
  }
}

void ThreadTeam::loop(std::size_t i, std::size_t kernel_threads) {
  // The members run kernels at the same time, so each takes its share of the host
  // thread pool (engine/thread_pool.h): n members on P cores run P threads, not nP,
  // and a member that finishes first lends its share to those still running (the
  // team's ThreadShareGroup). A member that runs no kernels takes a share of one
  // for good: index 0 of num_threads().
  std::optional<ThreadShare> coordinator;
  if (i >= kernel_threads) coordinator.emplace(0, num_threads());
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(std::size_t)>* job = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr error;
    {
      std::optional<ThreadShare> share;
      if (i < kernel_threads) share.emplace(int(i), int(kernel_threads), shares_);
      try {
        (*job)(i);
      } catch (...) {
        error = std::current_exception();
      }
    }  // this member's share goes back to the group before run() can return
    std::lock_guard lock(mutex_);
    // Moved, not copied: the exception's last reference must not be dropped on this
    // thread after run() has rethrown it on the caller's (ThreadSanitizer reports
    // this thread destroying the exception while the caller reads it).
    errors_[i] = std::move(error);
    if (--remaining_ == 0) done_.notify_all();
  }
}

}  // namespace towerlab
