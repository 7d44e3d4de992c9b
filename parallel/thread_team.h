// A team of persistent host threads that run one job together: run(job) calls
// job(i) on thread i for every i at once and returns when all have finished. The
// trainer runs each tower's forward and backward on its own thread with it, and the
// ring runs each host member's steps on its own thread, so that those run side by
// side rather than one after another. Each thread holds its share of the host
// thread pool (ThreadShare), so the members' kernels do not oversubscribe the cores;
// a member that finishes its call first lends its share to those still running
// (ThreadShareGroup).
//
// run() rethrows the first failure in thread order, after every thread has
// finished its call. One run() at a time; the threads sleep between runs.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "../engine/thread_pool.h"

namespace towerlab {

class ThreadTeam {
 public:
  explicit ThreadTeam(std::size_t n) : ThreadTeam(n, n) {}
  // Threads 0 .. kernel_threads-1 share the pool; the others run no kernels of
  // their own (the trainer's gradient reducer, which only coordinates) and keep
  // one thread, so that they do not take cores from the rest.
  ThreadTeam(std::size_t n, std::size_t kernel_threads);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  void run(const std::function<void(std::size_t)>& job);
  std::size_t size() const { return threads_.size(); }

 private:
  void loop(std::size_t i, std::size_t kernel_threads);

  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  std::size_t remaining_ = 0;
  std::size_t kernel_threads_;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  ThreadShareGroup shares_;  // the kernel members' (engine/thread_pool.h)
  std::vector<std::thread> threads_;
};

}  // namespace towerlab
