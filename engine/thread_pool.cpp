// The host thread pool (engine/thread_pool.h).
//
// One job at a time: the caller publishes a Job (a shared_ptr, so that a worker
// that wakes late never reads a job that is gone), bumps a generation counter and
// works on chunks itself; workers claim chunks from the job's atomic counter. A
// worker that finds no chunk left goes back to waiting. Waiting is a short spin
// (a GEMM issues parallel_for calls back to back, and waking a sleeping thread
// costs tens of microseconds) followed by a futex sleep through std::atomic::wait.
#include "engine/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/error.h"

namespace towerlab {

namespace {

using Body = std::function<void(std::int64_t, std::int64_t)>;

// True on pool workers, and on a caller while it runs its own chunk.
thread_local bool t_in_parallel = false;

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
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 0;; ++i) {
    T now = value.load(std::memory_order_acquire);
    if (now != old) return now;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) break;
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
    std::lock_guard<std::mutex> lock(dispatch_mutex_);
    stop_workers();
  }

  int threads() const { return threads_.load(std::memory_order_relaxed); }

  void resize(int n) {
    std::lock_guard<std::mutex> lock(dispatch_mutex_);
    stop_workers();
    start_workers(n);
  }

  void run(std::int64_t begin, std::int64_t end, const Body& body) {
    std::unique_lock<std::mutex> dispatch(dispatch_mutex_, std::try_to_lock);
    if (!dispatch.owns_lock() || workers_.empty()) {
      body(begin, end);  // another thread has the pool: run inline (never queue)
      return;
    }
    auto job = std::make_shared<Job>();
    job->body = &body;
    job->begin = begin;
    job->size = end - begin;
    job->chunks = static_cast<int>(std::min<std::int64_t>(threads(), job->size));
    {
      std::lock_guard<std::mutex> lock(job_mutex_);
      job_ = job;
    }
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();

    t_in_parallel = true;
    job->run_chunks();
    t_in_parallel = false;
    for (int d = job->done.load(std::memory_order_acquire); d < job->chunks;) {
      d = wait_for_change(job->done, d);
    }
    {
      std::lock_guard<std::mutex> lock(job_mutex_);
      job_.reset();
    }
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  Pool() { start_workers(0); }

  // Called with dispatch_mutex_ held, so no job is in flight.
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

  void worker_loop(std::uint64_t seen) {
    t_in_parallel = true;
    for (;;) {
      seen = wait_for_change(generation_, seen);
      std::shared_ptr<Job> job;
      {
        std::lock_guard<std::mutex> lock(job_mutex_);
        if (stop_) return;
        job = job_;
      }
      if (job) job->run_chunks();
    }
  }

  std::mutex dispatch_mutex_;  // held by the one caller whose job is in flight
  std::mutex job_mutex_;       // guards job_ and stop_
  std::shared_ptr<Job> job_;
  bool stop_ = false;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> threads_{1};
  std::vector<std::thread> workers_;
};

}  // namespace

void parallel_for(std::int64_t begin, std::int64_t end, const Body& body) {
  if (end - begin <= 0) return;
  if (end - begin == 1 || t_in_parallel) {
    body(begin, end);
    return;
  }
  Pool::instance().run(begin, end, body);
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

}  // namespace towerlab
