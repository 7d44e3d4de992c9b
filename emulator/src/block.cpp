// Kernels on the emulated GPUs: launches, blocks and their barriers. The warps'
// meeting point (shuffles, votes, __syncwarp, the warp-collective instructions) is
// warp.cpp; a block's __shared__ memory and the asynchronous copies into it are
// shared_memory.cpp; block_internal.h is the scheduler's state the three share.
//
// A launch is one operation on its stream (src/streams.cpp); the stream's worker
// thread runs its blocks one after another. The threads of a block run on fibers
// (stacks switched with Boost.Context's fcontext) owned by that worker, never by
// another stream's. A fiber runs one CUDA thread after another, each to its end,
// and leaves the worker only when its thread must wait (a barrier, a warp
// operation); the worker then gives a fresh fiber the threads not yet started, and
// resumes a waiting one once what it waits for has happened. A kernel without
// barriers thus runs all its threads on one stack with no switch at all, and one
// with barriers gets a fiber per thread.
//
// Ordering, as ThreadSanitizer is told it. Every CUDA thread has its own TSan
// context, whatever fiber runs it, so TSan sees the threads of a block as threads:
//   - every thread starts from what the worker saw when the block began, and the
//     worker sees all of it when the block ends, so block k is ordered before
//     block k + 1 and the launch after the operations before it on its stream;
//   - __syncthreads and __syncwarp order memory with a release by every arriving
//     thread and an acquire by every leaving one; nothing else does (shuffles and
//     votes exchange values without ordering memory; switches order nothing).
// A missing barrier is therefore a data race report even though the threads take
// turns on one host thread. The scheduler's own state is touched in Hidden scopes
// (internal.h): it is bookkeeping, not kernel memory.
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/detail/fcontext.hpp>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "block_internal.h"

#ifdef TLEMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace tlemu::detail {
namespace {

// Under ThreadSanitizer every CUDA thread of a block gets a fiber (a stack) of its
// own: two threads of one block run one after another on one stack would write the
// same stack words with nothing ordering them, which TSan would report. Elsewhere a
// fiber runs as many threads as it can, one after another.
#ifdef TLEMU_TSAN
constexpr bool kFiberPerThread = true;
#else
constexpr bool kFiberPerThread = false;
#endif

// TSan's contexts: each CUDA thread has one (no-ops without TSan), and under TSan a
// fiber, which runs one thread only, is charged to that thread's. ThreadSanitizer
// holds at most 8128 contexts at once (threads and fibers together), and a worker
// keeps one per CUDA thread of the widest block it has run, so a trainer's dozen
// stream workers with blocks of 1024 threads could exceed that: a worker that ends a
// launch while the process holds more than kTsanContextBudget gives its own back
// (making them again costs system time, so it is not done after every launch).
std::atomic<int> live_tsan_contexts{0};
constexpr int kTsanContextBudget = 4096;

}  // namespace

[[noreturn]] __attribute__((format(printf, 1, 2))) void kernel_bug(const char* format, ...) {
  std::fputs("emulated GPU: ", stderr);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::_Exit(86);
}

const char* short_name(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash != nullptr ? slash + 1 : file;
}

void* new_tsan_context() {
#ifdef TLEMU_TSAN
  ++live_tsan_contexts;
  return __tsan_create_fiber(0);
#else
  return nullptr;
#endif
}
void destroy_tsan_context(void* context) {
#ifdef TLEMU_TSAN
  __tsan_destroy_fiber(context);
  --live_tsan_contexts;
#else
  (void)context;
#endif
}

Scheduler& scheduler() {
  thread_local Scheduler s;
  return s;
}

std::string block_name(const Scheduler& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "kernel %s on cuda:%d, block (%u,%u,%u)", s.launch->kernel,
                s.device, blockIdx.x, blockIdx.y, blockIdx.z);
  return buf;
}

// --- switching ---------------------------------------------------------------------------

// The switches are Boost.Context's fcontext (make_fcontext, jump_fcontext), the
// low-level layer under its fibers: a few instructions that save and restore the
// callee-saved registers and the stack pointer. glibc's swapcontext also makes a
// sigprocmask system call at every switch, and under AddressSanitizer it is
// intercepted to clear the shadow of the whole stack it switches to; with a switch
// at every barrier and warp operation those were most of an emulated test's time.
// The sanitizers are told of every switch here (ASan: __sanitizer_start/
// finish_switch_fiber; TSan: __tsan_switch_to_fiber), as they need for any
// hand-made stack switch (suspend, block_internal.h, is the way back).

namespace {

// From the worker into fiber f, as its thread (or as itself, between threads).
void resume(Scheduler& s, Fiber& f) {
  void* tsan;
  bool first;
  {
    Hidden hidden;
    s.running = &f;
    s.starting = &f;
    tsan = f.thread != nullptr ? f.thread->tsan : f.tsan;
    first = !std::exchange(f.started, true);
  }
#ifdef TLEMU_TSAN
  // A new fiber starts from the worker's view (its scheduler, its stack); after that
  // switches order nothing.
  __tsan_switch_to_fiber(tsan, first ? 0 : __tsan_switch_to_fiber_no_sync);
#else
  (void)tsan;
  (void)first;
#endif
#ifdef TLEMU_ASAN
  __sanitizer_start_switch_fiber(&s.main_fake_stack, f.stack, kStackBytes);
#endif
  const fcontext::fcontext_t stopped = fcontext::jump_fcontext(f.context, nullptr).fctx;
#ifdef TLEMU_ASAN
  __sanitizer_finish_switch_fiber(s.main_fake_stack, nullptr, nullptr);
#endif
  Hidden hidden;
  f.context = stopped;  // it jumped back from there
  s.running = nullptr;
}

void thread_exited(Scheduler& s, Thread& t);

// The next thread of the block not yet started, now run by fiber f; or null.
Thread* take_unstarted(Scheduler& s, Fiber& f) {
  Hidden hidden;
  Thread* t;
  if (kFiberPerThread) {
    t = std::exchange(f.assigned, nullptr);
  } else {
    s.starter_queued = false;
    t = s.next_unstarted < s.threads ? s.thread_slots[s.next_unstarted++].get() : nullptr;
  }
  if (t == nullptr) {
    f.thread = nullptr;
    return nullptr;
  }
  t->state = ThreadState::Running;
  t->fiber = &f;
  f.thread = t;
  return t;
}

// A fiber's life: it starts the block's threads one after another, each run to its
// end (or suspended and resumed in between), until none is left; then it waits for
// the next block. The TSan context switches stay in this frame, so every context's
// function entries and exits pair up.
void fiber_main(fcontext::transfer_t from_worker) {
  Scheduler& s = scheduler();
  Fiber* self;
  {
    Hidden hidden;
    self = s.starting;
    s.main_context = from_worker.fctx;
  }
  Fiber& f = *self;
#ifdef TLEMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &s.main_stack_bottom, &s.main_stack_size);
#endif
  for (;;) {
    while (Thread* t = take_unstarted(s, f)) {
      TLEMU_BECOME(t->tsan);
      tsan_acquire(&s.block_start);
      take_coordinates(*t);
      const KernelLaunch* launch;
      {
        Hidden hidden;
        launch = s.launch;
      }
      launch->thread_body();
      thread_exited(s, *t);
      tsan_release(&s.block_end);
      TLEMU_BECOME(f.tsan);
    }
    suspend(s, f);  // no thread left; resumed when a block needs a starter
  }
}

Fiber& idle_fiber(Scheduler& s) {
  if (!s.idle.empty()) {
    Fiber* f = s.idle.back();
    s.idle.pop_back();
    return *f;
  }
  auto f = std::make_unique<Fiber>();
  const std::size_t page = static_cast<std::size_t>(getpagesize());
  void* region = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) kernel_bug("cannot map a %zu-byte fiber stack", kStackBytes);
  mprotect(region, page, PROT_NONE);  // a stack overflow faults instead of corrupting
#ifdef TLEMU_ASAN
  // The region may have been a fiber stack that was unmapped while suspended: its
  // frames' redzones are still poisoned in ASan's shadow, which munmap leaves as is.
  __asan_unpoison_memory_region(region, kStackBytes + page);
#endif
  f->stack = static_cast<char*>(region) + page;
  f->context = fcontext::make_fcontext(f->stack + kStackBytes, kStackBytes, fiber_main);
  s.fibers.push_back(std::move(f));
  return *s.fibers.back();
}

// --- the block's threads meeting ----------------------------------------------------------

void thread_exited(Scheduler& s, Thread& t) {
  Hidden hidden;
  t.state = ThreadState::Exited;
  --s.live;
  Warp& w = s.warps[t.tid / 32];
  const unsigned bit = 1u << (t.tid % 32);
  w.exited |= bit;
  if (w.arrived != 0 && (w.mask & bit) != 0) {
    kernel_bug(
        "%s: thread %u (warp %u lane %u) returned while lanes of its warp wait for it in a "
        "warp operation with mask 0x%08x: a lane of the mask exited instead of arriving",
        block_name(s).c_str(), t.tid, t.tid / 32, t.tid % 32, w.mask);
  }
  // A thread that returned no longer counts at the barrier (sm_70 and later).
  if (s.at_barrier != 0 && s.at_barrier == s.live) {
    s.at_barrier = 0;
    ++s.barrier_generation;
    for (unsigned i = 0; i < s.threads; ++i) {
      Thread& other = *s.thread_slots[i];
      if (other.state == ThreadState::AtBarrier) wake(s, other);
    }
  }
}

std::string describe_waiters(const Scheduler& s) {
  Hidden hidden;
  std::string out;
  for (unsigned i = 0; i < s.threads; ++i) {
    const Thread& t = *s.thread_slots[i];
    if (t.state != ThreadState::AtBarrier && t.state != ThreadState::AtWarp) continue;
    char line[200];
    std::snprintf(line, sizeof line, "\n  thread %u waits in %s at %s:%u", i, t.waiting_for,
                  short_name(t.waiting_at.file_name()), t.waiting_at.line());
    out += line;
    if (out.size() > 2000) return out + "\n  ...";
  }
  return out;
}

void run_block(Scheduler& s, uint3 block_index) {
  {
    Hidden hidden;
    blockIdx = block_index;
    s.live = s.threads;
    s.next_unstarted = 0;
    s.at_barrier = 0;
    ++s.block_serial;
    s.shared_bytes = 0;
    for (unsigned w = 0; w < s.warps.size(); ++w) {
      const unsigned lanes = std::min(32u, s.threads - 32 * w);
      s.warps[w] = Warp{};
      s.warps[w].members = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    }
    while (s.thread_slots.size() < s.threads) {
      s.thread_slots.push_back(std::make_unique<Thread>());
      s.thread_slots.back()->tid = static_cast<unsigned>(s.thread_slots.size() - 1);
    }
    const dim3 b = s.launch->block;
    for (unsigned i = 0; i < s.threads; ++i) {
      Thread& t = *s.thread_slots[i];
      t.index = {i % b.x, i / b.x % b.y, i / (b.x * b.y)};
      t.state = ThreadState::NotStarted;
      t.fiber = nullptr;
      t.pending.clear();  // copies its previous block never waited for are dropped
      t.commits = 0;
    }
    s.ready.clear();
    if (kFiberPerThread) {
      s.next_unstarted = s.threads;  // every thread is given its fiber here: no starters
      while (s.fibers.size() < s.threads) idle_fiber(s);
      for (unsigned i = 0; i < s.threads; ++i) {
        s.fibers[i]->assigned = s.thread_slots[i].get();
        s.fibers[i]->tsan = s.thread_slots[i]->tsan;
        s.ready.push_back(s.fibers[i].get());
      }
    } else {
      s.ready.push_back(&idle_fiber(s));
      s.starter_queued = true;
    }
  }
  tsan_release(&s.block_start);
  for (;;) {
    Fiber* f;
    {
      Hidden hidden;
      if (s.ready.empty()) break;
      f = s.ready.front();
      s.ready.pop_front();
    }
    resume(s, *f);
    Hidden hidden;
    if (f->thread == nullptr) {
      if (!kFiberPerThread) s.idle.push_back(f);  // it ran out of threads to start
    } else if (s.next_unstarted < s.threads && !s.starter_queued) {
      // Its thread waits: another fiber starts the threads not yet started.
      s.ready.push_back(&idle_fiber(s));
      s.starter_queued = true;
    }
  }
  tsan_acquire(&s.block_end);
  if (s.live != 0) {
    kernel_bug(
        "%s: %u live threads wait where the others can never come (a barrier or warp "
        "operation in divergent code): they never reach it%s",
        block_name(s).c_str(), s.live, describe_waiters(s).c_str());
  }
}

}  // namespace

Thread& running_thread(const char* what) {
  Hidden hidden;
  Scheduler& s = scheduler();
  if (s.running == nullptr || s.running->thread == nullptr)
    kernel_bug("%s called outside a kernel", what);
  return *s.running->thread;
}

// --- what kernels call ---------------------------------------------------------------------

void block_barrier(const std::source_location& where) {
  Scheduler& s = scheduler();
  Thread& f = running_thread("__syncthreads");
  unsigned long generation;
  {
    Hidden hidden;
    if (s.at_barrier == 0) {
      s.barrier_site = where;
    } else if (s.barrier_site.line() != where.line() ||
               (s.barrier_site.file_name() != where.file_name() &&
                std::strcmp(s.barrier_site.file_name(), where.file_name()) != 0)) {
      kernel_bug(
          "%s: threads of one phase reached different __syncthreads (%s:%u and %s:%u, "
          "thread %u): a barrier in divergent code",
          block_name(s).c_str(), short_name(s.barrier_site.file_name()), s.barrier_site.line(),
          short_name(where.file_name()), where.line(), f.tid);
    }
    generation = s.barrier_generation;
  }
  tsan_release(&s.barrier_token[generation & 1]);
  {
    Hidden hidden;
    if (++s.at_barrier == s.live) {
      s.at_barrier = 0;
      ++s.barrier_generation;
      for (unsigned t = 0; t < s.threads; ++t) {
        Thread& other = *s.thread_slots[t];
        if (other.state == ThreadState::AtBarrier) wake(s, other);
      }
    } else {
      f.state = ThreadState::AtBarrier;
      f.waiting_at = s.barrier_site;
      f.waiting_for = "__syncthreads";
    }
  }
  wait_until(s, f, [&] { return s.barrier_generation != generation; });
  tsan_acquire(&s.barrier_token[generation & 1]);
}

// --- launches ------------------------------------------------------------------------------

void run_kernel(const KernelLaunch& launch, int device) {
  if (take_kernel_fault(device)) {
    raise_sticky(
        device, cudaErrorIllegalAddress,
        std::string("kernel ") + launch.kernel + ": an injected fault (tlemu::fault_kernel)");
    return;
  }
  for (std::size_t i = 0; i < launch.pointers.size(); ++i) {
    const void* p = launch.pointers[i];
    if (p == nullptr) continue;
    auto a = find_allocation(p, 0);
    std::string problem;
    if (!a) {
      problem = describe_pointer(p);
    } else if (a->device >= 0 && !peer_enabled(device, a->device)) {
      problem = describe_pointer(p) + ", and peer access from cuda:" + std::to_string(device) +
                " to cuda:" + std::to_string(a->device) + " is not enabled";
    }
    if (!problem.empty()) {
      raise_sticky(device, cudaErrorIllegalAddress,
                   std::string("kernel ") + launch.kernel + " on cuda:" + std::to_string(device) +
                       ": pointer argument " + std::to_string(i + 1) + " is " + problem);
      return;
    }
  }
  Scheduler& s = scheduler();
  const dim3 g = launch.grid, b = launch.block;
  {
    Hidden hidden;
    s.launch = &launch;
    s.device = device;
    s.threads = b.x * b.y * b.z;
    s.warps.assign((s.threads + 31) / 32, Warp{});
    blockDim = b;
    gridDim = g;
  }
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x) run_block(s, {x, y, z});
  {
    Hidden hidden;
    s.launch = nullptr;
  }
  if (kFiberPerThread && live_tsan_contexts.load() > kTsanContextBudget) s.release_fibers();
  count_kernel(std::uint64_t{g.x} * g.y * g.z, std::uint64_t{g.x} * g.y * g.z * s.threads);
}

void submit(KernelLaunch&& launch) {
  const dim3 g = launch.grid, b = launch.block;
  const std::uint64_t threads = std::uint64_t{b.x} * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x == 0 ||
      g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535 ||
      launch.shared_bytes > kSharedLimit) {
    char why[200];
    std::snprintf(why, sizeof why,
                  "kernel %s: grid (%u,%u,%u), block (%u,%u,%u), %zu bytes of "
                  "dynamic shared memory",
                  launch.kernel, g.x, g.y, g.z, b.x, b.y, b.z, launch.shared_bytes);
    fail(cudaErrorInvalidConfiguration, why);
    return;
  }
  const int device = stream_device(launch.stream);
  if (device < 0) {
    fail(cudaErrorInvalidResourceHandle,
         std::string("kernel ") + launch.kernel + ": the stream is not a live stream");
    return;
  }
  if (device != current_device()) {
    fail(cudaErrorInvalidResourceHandle,
         std::string("kernel ") + launch.kernel +
             ": launched on a stream of cuda:" + std::to_string(device) +
             " while the current device is cuda:" + std::to_string(current_device()));
    return;
  }
  auto shared = std::make_shared<KernelLaunch>(std::move(launch));
  const cudaStream_t stream = shared->stream;
  const cudaError_t e = enqueue(stream, {std::string("kernel ") + shared->kernel,
                                         [shared, device] { run_kernel(*shared, device); }});
  if (e != cudaSuccess) fail(e);
}

}  // namespace tlemu::detail
