// The host thread pool (engine/thread_pool.h).
//
// A caller publishes a Job in the list of jobs in flight (a shared_ptr, so that a
// worker that wakes late never reads a job that is gone), bumps a generation
// counter and works on chunks itself; workers join a job (at most chunks - 1 of
// them) and claim chunks from its atomic counter. A worker that finds no job to
// join goes back to waiting. Waiting is a short spin (a GEMM issues parallel_for
// calls back to back, and waking a sleeping thread costs tens of microseconds)
// followed by a futex sleep through std::atomic::wait.
#include "engine/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "engine/clock.h"
#include "engine/error.h"

namespace towerlab {

namespace {

using Body = std::function<void(std::int64_t, std::int64_t)>;

// True on pool workers, and on a caller while it runs its own chunk.
thread_local bool t_in_parallel = false;
// This thread's ThreadShare: index of count (one of one without a ThreadShare).
thread_local int t_share_index = 0;
thread_local int t_share_count = 1;
// The group this thread's ThreadShare runs in, if any.
thread_local ThreadShareGroup* t_share_group = nullptr;

// How long an idle thread spins before it sleeps.
constexpr auto kSpinTime = std::chrono::microseconds(100);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until value != old for up to kSpinTime, then sleeps on the futex.
template <typename T>
T wait_for_change(const std::atomic<T>& value, T old) {
  const auto deadline = Clock::now() + kSpinTime;
  for (int i = 0;; ++i) {
    T now = value.load(std::memory_order_acquire);
    if (now != old) return now;
    cpu_relax();
    if ((i & 63) == 63 && Clock::now() > deadline) break;
  }
  for (;;) {
    value.wait(old, std::memory_order_acquire);
    T now = value.load(std::memory_order_acquire);
    if (now != old) return now;
  }
}

struct Job {
  const Body* body = nullptr;
  std::int64_t begin = 0;
  std::int64_t size = 0;
  int chunks = 0;
  int helpers = 0;  // workers that joined; guarded by the pool's job_mutex_
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  // Chunk c is [begin + c*size/chunks, begin + (c+1)*size/chunks): even sizes.
  void run_chunks() {
    for (;;) {
      const int c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      const std::int64_t lo = begin + size * c / chunks;
      const std::int64_t hi = begin + size * (c + 1) / chunks;
      try {
        (*body)(lo, hi);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done.notify_all();
    }
  }
};

class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  ~Pool() {
    std::unique_lock<std::shared_mutex> lock(settings_mutex_);
    stop_workers();
  }

  int threads() const { return threads_.load(std::memory_order_relaxed); }

  void resize(int n) {
    std::unique_lock<std::shared_mutex> lock(settings_mutex_);
    stop_workers();
    start_workers(n);
  }

  void run(std::int64_t begin, std::int64_t end, int share, const Body& body) {
    std::shared_ptr<Job> job;
    {
      std::shared_lock<std::shared_mutex> settings(settings_mutex_);
      const int chunks = static_cast<int>(std::min<std::int64_t>(
          {std::int64_t{share}, std::int64_t(workers_.size()) + 1, end - begin}));
      if (chunks >= 2) {
        job = std::make_shared<Job>();
        job->body = &body;
        job->begin = begin;
        job->size = end - begin;
        job->chunks = chunks;
        run_job(job);
      }
    }
    // Inline (the pool shrank below two threads since the caller looked), outside
    // the lock so that the body may resize the pool.
    if (!job) {
      body(begin, end);
      return;
    }
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  Pool() { start_workers(0); }

  // Publishes the job, runs chunks on the caller and waits for all of them to finish.
  // Called with settings_mutex_ held shared.
  void run_job(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(job_mutex_);
      jobs_.push_back(job);
    }
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();

    t_in_parallel = true;
    job->run_chunks();
    t_in_parallel = false;
    for (int d = job->done.load(std::memory_order_acquire); d < job->chunks;) {
      d = wait_for_change(job->done, d);
    }
    std::lock_guard<std::mutex> lock(job_mutex_);
    jobs_.erase(std::find(jobs_.begin(), jobs_.end(), job));
  }

  // Called with settings_mutex_ held exclusively, so no job is in flight.
  void start_workers(int n) {
    if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    stop_ = false;
    const std::uint64_t seen = generation_.load();
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, seen] { worker_loop(seen); });
    threads_.store(n, std::memory_order_relaxed);
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(job_mutex_);
      stop_ = true;
    }
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (std::thread& worker : workers_) worker.join();
    workers_.clear();
  }

  // A job in flight that still has a chunk to give and room for one more worker
  // (a job of c chunks takes at most c - 1: its caller runs one), oldest first.
  // Called with job_mutex_ held.
  std::shared_ptr<Job> join_a_job() {
    for (const std::shared_ptr<Job>& job : jobs_) {
      if (job->helpers < job->chunks - 1 &&
          job->next.load(std::memory_order_relaxed) < job->chunks) {
        ++job->helpers;
        return job;
      }
    }
    return nullptr;
  }

  // A worker reads the generation before it looks for a job, and sleeps only until
  // the generation moves on from that value: a job published after it looked bumps
  // the generation afterwards, so the worker wakes for it.
  void worker_loop(std::uint64_t seen) {
    t_in_parallel = true;
    for (;;) {
      seen = wait_for_change(generation_, seen);
      for (;;) {
        std::shared_ptr<Job> job;
        {
          std::lock_guard<std::mutex> lock(job_mutex_);
          if (stop_) return;
          job = join_a_job();
        }
        if (!job) break;
        job->run_chunks();
        seen = generation_.load(std::memory_order_acquire);
      }
    }
  }

  // Shared by every parallel_for in flight, held exclusively to resize the pool.
  std::shared_mutex settings_mutex_;
  std::mutex job_mutex_;  // guards jobs_, each job's helpers, and stop_
  std::vector<std::shared_ptr<Job>> jobs_;
  bool stop_ = false;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> threads_{1};
  std::vector<std::thread> workers_;
};

}  // namespace

void parallel_for(std::int64_t begin, std::int64_t end, const Body& body) {
  if (end - begin <= 0) return;
  const int share = t_in_parallel ? 1 : thread_share();
  if (end - begin == 1 || share < 2) {
    body(begin, end);
    return;
  }
  Pool::instance().run(begin, end, share, body);
}

int num_threads() {
  return Pool::instance().threads();
}

void set_num_threads(int n) {
  TL_CHECK(n >= 0, InvalidArgument,
           "set_num_threads: n is " << n << "; pass a positive count, or 0 for the default");
  TL_CHECK(!t_in_parallel, InvalidArgument,
           "set_num_threads: called from inside a parallel_for chunk");
  Pool::instance().resize(n);
}

namespace {

// Thread `index` of `count`'s own share of `threads`.
int own_share(int threads, int index, int count) {
  return std::max(1, threads / count + (index < threads % count ? 1 : 0));
}

}  // namespace

int thread_share() {
  const int threads = num_threads();
  const int own = own_share(threads, t_share_index, t_share_count);
  if (t_share_group == nullptr) return own;
  // The running members' shares include this thread's; relaxed: a share read a
  // moment late only lends a core a moment late.
  const int running = std::max(1, t_share_group->running_share_.load(std::memory_order_relaxed));
  return std::min(threads, std::max(own, threads * own / running));
}

void ThreadShareGroup::start(int count) {
  TL_CHECK(count >= 1, InvalidArgument,
           "ThreadShareGroup::start: " << count << " members; pass a count >= 1");
  const int threads = num_threads();
  int total = 0;
  for (int i = 0; i < count; ++i) total += own_share(threads, i, count);
  running_share_.store(total, std::memory_order_relaxed);
}

ThreadShare::ThreadShare(int index, int count)
    : previous_index_(t_share_index),
      previous_count_(t_share_count),
      previous_group_(t_share_group) {
  TL_CHECK(count >= 1 && index >= 0 && index < count, InvalidArgument,
           "ThreadShare: thread " << index << " of " << count
                                  << "; pass a count >= 1 and 0 <= index < count");
  t_share_index = index;
  t_share_count = count;
  t_share_group = nullptr;
}

ThreadShare::ThreadShare(int index, int count, ThreadShareGroup& group)
    : ThreadShare(index, count) {
  group_ = &group;
  own_ = own_share(num_threads(), index, count);
  t_share_group = &group;
}

ThreadShare::~ThreadShare() {
  if (group_ != nullptr) group_->running_share_.fetch_sub(own_, std::memory_order_relaxed);
  t_share_index = previous_index_;
  t_share_count = previous_count_;
  t_share_group = previous_group_;
}

}  // namespace towerlab
