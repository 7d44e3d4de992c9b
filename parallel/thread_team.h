// A team of host threads that run one job together: run(job) calls job(i) for
// every member i at once, job(0) on the calling thread and job(1) .. job(n-1) each
// on a persistent thread of its own, and returns when all have finished. The
// trainer runs each tower's forward and backward on its own thread with it, and the
// ring runs each host member's steps on its own thread, so that those run side by
// side rather than one after another. Each member holds its share of the host
// thread pool (ThreadShare), so the members' kernels do not oversubscribe the cores;
// a member that finishes its call first lends its share to those still running
// (ThreadShareGroup).
//
// run() rethrows the first failure in member order, after every member has
// finished its call. One run() at a time; between runs the threads sleep.
//
// The caller is member 0, so n members are n threads and a run wakes n - 1 of
// them: the trainer's main thread is tower 0's, and the ring's caller its first
// member. The threads sleep and are woken through std::atomic::wait and notify
// (one futex each way), never spinning. On the 2-core machines an empty run of a
// team of two was fastest this way, slower with a condition variable and the
// caller waiting beside two members, and slowest when members and caller spun
// before sleeping (as the pool's workers do between the GEMM's back-to-back loops,
// engine/thread_pool.cpp): a spinning thread held the core the woken one needed
// (docs/kernels.md, "Measured choices").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "../engine/thread_pool.h"

namespace towerlab {

class ThreadTeam {
 public:
  explicit ThreadTeam(std::size_t n) : ThreadTeam(n, n) {}
  // Members 0 .. kernel_threads-1 share the pool; the others run no kernels of
  // their own (the trainer's gradient reducer, which only coordinates) and keep
  // one thread, so that they do not take cores from the rest.
  ThreadTeam(std::size_t n, std::size_t kernel_threads);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  void run(const std::function<void(std::size_t)>& job);
  std::size_t size() const { return errors_.size(); }

 private:
  void run_member(std::size_t i);  // job_(i) with its share of the pool; its error kept
  void loop(std::size_t i);        // member i's thread, i >= 1

  // run() writes job_, stop_ and errors_ before it bumps generation_, and a member
  // reads them after it sees the bump; a member writes its error before it counts
  // itself out of remaining_, and run() reads the errors once that reaches 0.
  const std::function<void(std::size_t)>* job_ = nullptr;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::atomic<std::uint64_t> generation_{0};  // one more for each run, and to stop
  std::atomic<std::size_t> remaining_{0};     // threads still in this run's job
  std::size_t kernel_threads_;
  ThreadShareGroup shares_;           // the kernel members' (engine/thread_pool.h)
  std::vector<std::thread> threads_;  // members 1 .. n-1
};

}  // namespace towerlab
