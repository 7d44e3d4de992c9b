// The host thread pool: one small persistent pool per process that CPU kernels
// use to spread a loop over the cores (the GEMM first of all).
//
//   parallel_for(begin, end, body)
//     calls body(chunk_begin, chunk_end) on disjoint, contiguous chunks that cover
//     [begin, end) exactly once, at most one chunk per thread of the caller's share
//     (thread_share()), and returns when all have finished. The calling thread runs
//     chunks itself, and runs every chunk no worker has taken: a caller never waits
//     for a worker to become free. An exception thrown by a chunk is rethrown in the
//     caller (the first one, if several throw) after every chunk has finished.
//
// It runs the whole range inline, on the calling thread, when:
//   - the range has fewer than two items, or the caller's share is one thread;
//   - it is called from inside a chunk (nested parallel_for), so a kernel that
//     calls another parallel kernel never waits on itself.
//
// Several threads may call parallel_for at once (CPU towers do). Each caller's job
// takes at most share - 1 workers, and a worker serves one job at a time, so the
// callers and the workers together never run more threads than the pool has plus
// the callers themselves.
//
// Threads: std::thread::hardware_concurrency() by default (the caller plus that
// many minus one workers), or what set_num_threads() asked for. That number is
// process-wide; ThreadShare divides it among threads that run kernels at once.
//
// Results: kernels split their work in ways that depend neither on the thread count
// nor on the share (kernels/cpu/parallel.h), so neither changes a result's bits.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "settings.h"

namespace towerlab {

void parallel_for(std::int64_t begin, std::int64_t end,
                  const std::function<void(std::int64_t, std::int64_t)>& body);

// num_threads() and set_num_threads(n), the pool's size: engine/settings.h.

// Threads a parallel_for called on this thread may use, the caller included: this
// thread's share while a ThreadShare lives on it, num_threads() otherwise (>= 1).
int thread_share();

// Threads that run kernels at the same time and lend each other the cores that
// the ones already finished leave idle (the trainer's CPU towers, the ring's host
// members: parallel/thread_team.h). start(count) begins a run of `count` members,
// all counted as running before any of them starts (so the first to start does not
// borrow the shares of those about to); each member then holds a
// ThreadShare(index, count, group) while it runs, and leaves the group when that
// ends. A member's share is its part of the pool in proportion to the shares of
// the members still running:
//   max(its own share, num_threads() * its own share / the running members' shares)
// at most num_threads(). Two towers on two cores run one thread each; when one
// tower is done with its half of the batch, the other's kernels take both cores
// for the rest of its half, instead of leaving one idle until it catches up (on a
// shared machine, towers of equal work seldom finish together). Results do not
// change: kernels split their work the same way on any number of threads.
class ThreadShareGroup {
 public:
  ThreadShareGroup() = default;
  ThreadShareGroup(const ThreadShareGroup&) = delete;
  ThreadShareGroup& operator=(const ThreadShareGroup&) = delete;

  // Counts members 0 .. count - 1 as running, each with its own share. Call it
  // before they start, when no member of an earlier run is left.
  void start(int count);

 private:
  friend class ThreadShare;
  friend int thread_share();
  std::atomic<int> running_share_{0};  // the sum of the live members' own shares
};

// Gives the calling thread its share of the pool while `count` threads run kernels
// at the same time (the trainer's CPU towers, one thread each): thread `index` of
// `count` uses num_threads() / count threads, the first num_threads() % count
// indices one more, and at least one (its own). T towers on P cores then run P
// threads in all instead of each fanning out onto every core. With a group, the
// thread is one of its running members while the ThreadShare lives and may borrow
// the shares of members that have finished (ThreadShareGroup). Restores the
// previous share when it goes out of scope. Throws InvalidArgument unless
// 0 <= index < count.
class ThreadShare {
 public:
  ThreadShare(int index, int count);
  ThreadShare(int index, int count, ThreadShareGroup& group);
  ~ThreadShare();
  ThreadShare(const ThreadShare&) = delete;
  ThreadShare& operator=(const ThreadShare&) = delete;

 private:
  int previous_index_;
  int previous_count_;
  ThreadShareGroup* previous_group_;
  ThreadShareGroup* group_ = nullptr;
  int own_ = 0;  // this thread's own share, counted in group_'s running shares
};

}  // namespace towerlab
