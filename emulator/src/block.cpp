// Kernels on the emulated GPUs: launches, blocks, barriers, warps and shared memory.
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
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_pipeline.h"
#include "internal.h"

#ifdef TLEMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif
#ifdef TLEMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace tlemu::detail {
namespace {

constexpr std::size_t kStackBytes = std::size_t{256} << 10;  // sanitizers' frames are large
constexpr std::size_t kSharedLimit = std::size_t{48} << 10;  // static __shared__ per block
// Under ThreadSanitizer every CUDA thread of a block gets a fiber (a stack) of its
// own: two threads of one block run one after another on one stack would write the
// same stack words with nothing ordering them, which TSan would report. Elsewhere a
// fiber runs as many threads as it can, one after another.
#ifdef TLEMU_TSAN
constexpr bool kFiberPerThread = true;
#else
constexpr bool kFiberPerThread = false;
#endif

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

// TSan's contexts: each CUDA thread has one (no-ops without TSan), and under TSan a
// fiber, which runs one thread only, is charged to that thread's. ThreadSanitizer
// holds at most 8128 contexts at once (threads and fibers together), and a worker
// keeps one per CUDA thread of the widest block it has run, so a trainer's dozen
// stream workers with blocks of 1024 threads could exceed that: a worker that ends a
// launch while the process holds more than kTsanContextBudget gives its own back
// (making them again costs system time, so it is not done after every launch).
std::atomic<int> live_tsan_contexts{0};
constexpr int kTsanContextBudget = 4096;

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
// Makes `context` the one TSan charges what runs next to. A macro, not a function:
// TSan pairs every function's entry and exit within one context, and a call that
// switched contexts would return into the other one.
#ifdef TLEMU_TSAN
#define TLEMU_BECOME(context) __tsan_switch_to_fiber((context), __tsan_switch_to_fiber_no_sync)
#else
#define TLEMU_BECOME(context) (void)(context)
#endif

enum class ThreadState { NotStarted, Running, AtBarrier, AtWarp, Exited };

struct Fiber;

// One asynchronous copy (cuda_pipeline.h) not yet waited for: its bytes, read at
// issue, and the batch it belongs to (the thread's count of commits at issue).
struct PendingCopy {
  char* dst;
  unsigned char bytes[16];
  std::size_t size;
  std::uint64_t batch;
};

struct SharedBlock;

// One CUDA thread of the running block (reused by the same index of every block).
struct Thread {
  unsigned tid = 0;  // linear index in the block
  uint3 index;
  ThreadState state = ThreadState::NotStarted;
  Fiber* fiber = nullptr;           // the fiber running it
  std::source_location waiting_at;  // a copy: the caller's lives on the fiber's stack
  const char* waiting_for = "";
  void* tsan = new_tsan_context();
  std::vector<PendingCopy> pending;          // its asynchronous copies, oldest first
  std::vector<PendingCopy> landing;          // those a wait completes (kept to reuse its storage)
  const SharedBlock* copy_target = nullptr;  // the array its last copy went to
  std::uint64_t commits = 0;                 // batches it committed
};

namespace fcontext = boost::context::detail;

struct Fiber {
  fcontext::fcontext_t context = nullptr;  // where it resumes
  char* stack = nullptr;                   // below it, one guard page
  void* tsan = nullptr;  // the context of the thread it runs (under TSan, set per block)
  void* asan_fake_stack = nullptr;
  Thread* thread = nullptr;    // the CUDA thread it runs, or none between threads
  Thread* assigned = nullptr;  // kFiberPerThread: the thread it runs next
  bool started = false;        // its first resume orders it after the worker's state
};

// One warp's meeting point. Values go through slot[generation parity]: a lane can
// leave the next round's value only after every lane has left this round, so the
// other buffer is never overwritten while a slow lane still reads it.
struct Warp {
  unsigned members = 0;  // lanes that exist (the last warp of a block may be partial)
  unsigned exited = 0;
  unsigned arrived = 0;
  unsigned mask = 0;
  unsigned long generation = 0;
  std::uint64_t slot[2][32] = {};
  unsigned ballot[2] = {};
  char token[2] = {};  // what __syncwarp releases to and acquires from
  // The round under way is a warp-collective instruction (warp_collective): which one,
  // and where its first lane called it; null for a shuffle, vote or __syncwarp.
  Combine collective = nullptr;
  const char* collective_what = "";
  std::source_location collective_site;
};

// A warp's operands and results of warp_collective, double-buffered like Warp::slot.
// Kept apart from Warp (which every block resets) and made on a warp's first
// collective instruction only: 8 KiB a warp that most kernels never touch.
struct WarpExchange {
  WarpWords in[2];
  WarpWords out[2];
};

struct SharedBlock {
  std::unique_ptr<char, void (*)(void*)> memory{nullptr, std::free};  // posix_memalign'd
  std::size_t bytes = 0;
  std::uint64_t block_serial = 0;  // the block that last filled it
};

// The worker thread's scheduler: its fibers and threads, the running block and launch.
struct Scheduler {
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<Fiber*> idle;  // fibers with no thread, ready to start the next ones
  std::vector<std::unique_ptr<Thread>> thread_slots;
  fcontext::fcontext_t main_context = nullptr;  // the worker, while a fiber runs
  void* main_tsan = nullptr;
  void* main_fake_stack = nullptr;
  const void* main_stack_bottom = nullptr;
  std::size_t main_stack_size = 0;
  Fiber* running = nullptr;   // the fiber on the CPU, null while the worker schedules
  Fiber* starting = nullptr;  // the fiber a fresh context begins as

  // The running block.
  const KernelLaunch* launch = nullptr;
  int device = 0;
  unsigned threads = 0;
  unsigned next_unstarted = 0;
  bool starter_queued = false;  // a fiber is queued to start threads
  unsigned live = 0;
  unsigned at_barrier = 0;
  unsigned long barrier_generation = 0;
  std::source_location barrier_site;
  char barrier_token[2] = {};
  char block_start = 0, block_end = 0;  // tokens: the worker's view in, the threads' out
  std::vector<Warp> warps;
  std::vector<std::unique_ptr<WarpExchange>> exchange;  // by warp, made when first needed
  std::deque<Fiber*> ready;
  std::uint64_t block_serial = 0;
  std::size_t shared_bytes = 0;
  std::map<const void*, SharedBlock> shared;

  Scheduler() {
#ifdef TLEMU_TSAN
    main_tsan = __tsan_get_current_fiber();
#endif
  }
  ~Scheduler() {
    release_fibers();
    Hidden hidden;
    shared.clear();
  }

  // Frees every fiber (its stack) and every thread slot (its TSan context); the next
  // block makes new ones. Called between launches, when every fiber is suspended for
  // good (munmap clears the stacks' TSan shadow too; ASan's is cleared when a stack is
  // mapped, idle_fiber).
  void release_fibers() {
    // The fibers' and threads' state was read in their own TSan contexts, which never
    // hand anything back to the worker: freeing it is bookkeeping too.
    Hidden hidden;
    for (auto& f : fibers) munmap(f->stack - getpagesize(), kStackBytes + getpagesize());
    for (auto& t : thread_slots) destroy_tsan_context(t->tsan);
    fibers.clear();
    idle.clear();
    thread_slots.clear();
  }
};

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
// hand-made stack switch.

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

// The running thread's coordinates, after it (re)gains its worker.
void take_coordinates(const Thread& t) {
  Hidden hidden;
  threadIdx = t.index;
}

// From fiber f back to the worker; returns when the worker resumes f. Called as the
// context the fiber is in (its thread's, or its own between threads).
void suspend(Scheduler& s, [[maybe_unused]] Fiber& f) {
  TLEMU_BECOME(s.main_tsan);
#ifdef TLEMU_ASAN
  __sanitizer_start_switch_fiber(&f.asan_fake_stack, s.main_stack_bottom, s.main_stack_size);
#endif
  const fcontext::fcontext_t worker = fcontext::jump_fcontext(s.main_context, nullptr).fctx;
#ifdef TLEMU_ASAN
  __sanitizer_finish_switch_fiber(f.asan_fake_stack, &s.main_stack_bottom, &s.main_stack_size);
#endif
  Hidden hidden;
  s.main_context = worker;  // the worker jumped here from there
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

unsigned linear_tid() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// Makes the thread runnable again (its fiber resumes it).
void wake(Scheduler& s, Thread& t) {
  t.state = ThreadState::Running;
  s.ready.push_back(t.fiber);
}

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

// Waits (giving the worker to the other threads) until `done()`.
template <typename Done>
void wait_until(Scheduler& s, Thread& t, Done done) {
  for (;;) {
    {
      Hidden hidden;
      if (done()) return;
    }
    suspend(s, *t.fiber);
    take_coordinates(t);  // the threads that ran meanwhile left theirs
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

Thread& running_thread(const char* what) {
  Hidden hidden;
  Scheduler& s = scheduler();
  if (s.running == nullptr || s.running->thread == nullptr)
    kernel_bug("%s called outside a kernel", what);
  return *s.running->thread;
}

}  // namespace

// --- what kernels call ---------------------------------------------------------------------

unsigned lane_id() {
  return linear_tid() % 32;
}

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

WarpResult warp_round(unsigned mask, std::uint64_t value, bool vote, int source, bool orders_memory,
                      const char* what, const std::source_location& where) {
  Scheduler& s = scheduler();
  Thread& f = running_thread(what);
  const unsigned lane = f.tid % 32;
  Warp& w = s.warps[f.tid / 32];
  auto bug = [&](const char* problem) {
    kernel_bug("%s at %s:%u, %s, warp %u lane %u, mask 0x%08x: %s", what,
               short_name(where.file_name()), where.line(), block_name(s).c_str(), f.tid / 32, lane,
               mask, problem);
  };
  unsigned long generation;
  int buffer;
  {
    Hidden hidden;
    if ((mask >> lane & 1u) == 0) bug("the calling lane is not in the mask");
    if ((mask & ~w.members) != 0) bug("the mask names lanes that do not exist in this block");
    if ((mask & w.exited) != 0) bug("the mask names a lane that has already exited");
    if (w.arrived != 0 && w.collective != nullptr) {
      bug((std::string("other lanes of the warp wait in ") + w.collective_what + " at " +
           short_name(w.collective_site.file_name()) + ":" +
           std::to_string(w.collective_site.line()) + ": lanes in divergent code")
              .c_str());
    }
    if (w.arrived != 0 && w.mask != mask) bug("lanes of the warp disagree on the mask");
    if (source >= 0 && (mask >> source & 1u) == 0)
      bug("the lane reads a lane that is not in the mask: the value is undefined");
    generation = w.generation;
    buffer = static_cast<int>(generation & 1);
    w.mask = mask;
    w.slot[buffer][lane] = value;
    if (w.arrived == 0) w.ballot[buffer] = 0;
    if (vote) w.ballot[buffer] |= 1u << lane;
  }
  if (orders_memory) tsan_release(&w.token[buffer]);
  {
    Hidden hidden;
    w.arrived |= 1u << lane;
    if (w.arrived == mask) {
      w.arrived = 0;
      ++w.generation;
      for (unsigned t = 32 * (f.tid / 32); t < std::min(s.threads, 32 * (f.tid / 32) + 32); ++t) {
        Thread& other = *s.thread_slots[t];
        if (other.state == ThreadState::AtWarp) wake(s, other);
      }
    } else {
      f.state = ThreadState::AtWarp;
      f.waiting_at = where;
      f.waiting_for = what;
    }
  }
  wait_until(s, f, [&] { return w.generation != generation; });
  if (orders_memory) tsan_acquire(&w.token[buffer]);
  Hidden hidden;
  return {source >= 0 ? w.slot[buffer][source] : value, w.ballot[buffer]};
}

void warp_instruction_bug(const char* what, const std::source_location& where,
                          const std::string& problem) {
  Scheduler& s = scheduler();
  const Thread& f = running_thread(what);
  kernel_bug("%s at %s:%u, %s, warp %u lane %u: %s", what, short_name(where.file_name()),
             where.line(), block_name(s).c_str(), f.tid / 32, f.tid % 32, problem.c_str());
}

void warp_collective(Combine combine, const std::uint32_t* in, std::uint32_t* out, const char* what,
                     const std::source_location& where) {
  Scheduler& s = scheduler();
  Thread& f = running_thread(what);
  const unsigned lane = f.tid % 32;
  const unsigned warp = f.tid / 32;
  Warp& w = s.warps[warp];
  auto site = [](const std::source_location& at) {
    return std::string(short_name(at.file_name())) + ":" + std::to_string(at.line());
  };
  unsigned long generation;
  int buffer;
  WarpExchange* x;
  {
    Hidden hidden;
    if (w.members != 0xffffffffu) {
      warp_instruction_bug(what, where,
                           "the warp has fewer than 32 threads (the block's size is not a "
                           "multiple of 32): all 32 lanes must execute a .aligned instruction");
    }
    if (w.exited != 0) {
      char lanes[16];
      std::snprintf(lanes, sizeof lanes, "0x%08x", w.exited);
      warp_instruction_bug(what, where,
                           std::string("lanes ") + lanes +
                               " of the warp have already exited: all 32 lanes must execute "
                               "a .aligned instruction");
    }
    if (w.arrived != 0 && w.collective == nullptr) {
      warp_instruction_bug(what, where,
                           "other lanes of the warp wait in a shuffle, vote or __syncwarp: "
                           "lanes in divergent code");
    }
    if (w.arrived != 0 && (w.collective != combine || w.collective_site.line() != where.line() ||
                           std::strcmp(w.collective_site.file_name(), where.file_name()) != 0)) {
      warp_instruction_bug(what, where,
                           std::string("other lanes of the warp wait in ") + w.collective_what +
                               " at " + site(w.collective_site) +
                               ": all 32 lanes must execute the same instruction (lanes in "
                               "divergent code)");
    }
    if (s.exchange.size() < s.warps.size()) s.exchange.resize(s.warps.size());
    if (!s.exchange[warp]) s.exchange[warp] = std::make_unique<WarpExchange>();
    x = s.exchange[warp].get();
    generation = w.generation;
    buffer = static_cast<int>(generation & 1);
    if (w.arrived == 0) {
      w.collective = combine;
      w.collective_what = what;
      w.collective_site = where;
      w.mask = 0xffffffffu;  // what thread_exited checks a returning lane against
    }
    std::memcpy(x->in[buffer].lane[lane], in, sizeof x->in[buffer].lane[lane]);
    w.arrived |= 1u << lane;
    if (w.arrived == 0xffffffffu) {
      combine(x->in[buffer], x->out[buffer]);
      w.arrived = 0;
      w.collective = nullptr;
      ++w.generation;
      for (unsigned t = 32 * warp; t < 32 * warp + 32; ++t) {
        Thread& other = *s.thread_slots[t];
        if (other.state == ThreadState::AtWarp) wake(s, other);
      }
    } else {
      f.state = ThreadState::AtWarp;
      f.waiting_at = where;
      f.waiting_for = what;
    }
  }
  wait_until(s, f, [&] { return w.generation != generation; });
  Hidden hidden;
  std::memcpy(out, x->out[buffer].lane[lane], sizeof x->out[buffer].lane[lane]);
}

void* shared_storage(const void* key, std::size_t bytes, std::size_t alignment) {
  Scheduler& s = scheduler();
  running_thread("__shared__");
  Hidden hidden;
  SharedBlock& b = s.shared[key];
  if (!b.memory) {
    void* p = nullptr;
    if (posix_memalign(&p, std::max(alignment, sizeof(void*)), bytes) != 0)
      kernel_bug("cannot allocate %zu bytes of __shared__ memory", bytes);
    b.memory.reset(static_cast<char*>(p));
    b.bytes = bytes;
  }
  if (b.block_serial != s.block_serial) {
    b.block_serial = s.block_serial;
    s.shared_bytes += bytes;
    if (s.shared_bytes > kSharedLimit) {
      kernel_bug("%s: %zu bytes of __shared__ memory, more than the %zu a block may have",
                 block_name(s).c_str(), s.shared_bytes, kSharedLimit);
    }
    std::memset(b.memory.get(), 0xff, bytes);
  }
  return b.memory.get();
}

// --- asynchronous copies (cuda_pipeline.h) --------------------------------------------------

namespace {

// memcpy of 4, 8 or 16 bytes (pipeline_copy checked the size), each size a constant:
// compiled to one load and one store, where a call to memcpy goes through its
// sanitizer interceptor, for every copy of every thread.
[[gnu::always_inline]] inline void copy_small(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 16) {
    std::memcpy(dst, src, 16);
  } else if (bytes == 8) {
    std::memcpy(dst, src, 8);
  } else {
    std::memcpy(dst, src, 4);
  }
}

// Whether `b` is an array of the running block that holds [dst, dst + bytes).
bool holds(const Scheduler& s, const SharedBlock& b, const char* dst, std::size_t bytes) {
  return b.block_serial == s.block_serial && dst >= b.memory.get() &&
         dst + bytes <= b.memory.get() + b.bytes;
}

// What is wrong with a copy that pipeline_copy refused. A function of its own, kept
// out of line, so that the copy's frame stays small: under AddressSanitizer every
// local of it gets redzones poisoned and cleared at every call.
[[noreturn, gnu::cold, gnu::noinline]] void reject_copy(const Scheduler& s, const Thread& t,
                                                        const void* dst, const void* src,
                                                        std::size_t size, std::size_t zfill) {
  const std::string block = block_name(s);
  if (size != 4 && size != 8 && size != 16) {
    kernel_bug("%s, thread %u: __pipeline_memcpy_async of %zu bytes (4, 8 or 16 may be copied)",
               block.c_str(), t.tid, size);
  }
  if (zfill > size) {
    kernel_bug("%s, thread %u: __pipeline_memcpy_async zero-fills %zu of %zu bytes", block.c_str(),
               t.tid, zfill, size);
  }
  if (reinterpret_cast<std::uintptr_t>(dst) % size != 0 ||
      reinterpret_cast<std::uintptr_t>(src) % size != 0) {
    kernel_bug(
        "%s, thread %u: __pipeline_memcpy_async of %zu bytes from %p to %p: both must be "
        "aligned to the size",
        block.c_str(), t.tid, size, src, dst);
  }
  kernel_bug("%s, thread %u: __pipeline_memcpy_async to %p, not this block's __shared__ memory",
             block.c_str(), t.tid, dst);
}

}  // namespace

bool in_block_shared(const void* p, std::size_t bytes) {
  Scheduler& s = scheduler();
  running_thread("a __shared__ memory access");
  Hidden hidden;
  const char* c = static_cast<const char*>(p);
  return std::any_of(s.shared.begin(), s.shared.end(),
                     [&](const auto& entry) { return holds(s, entry.second, c, bytes); });
}

void pipeline_copy(void* dst_shared, const void* src_global, std::size_t size_and_align,
                   std::size_t zfill) {
  Scheduler& s = scheduler();
  Thread& t = running_thread("__pipeline_memcpy_async");
  PendingCopy copy{static_cast<char*>(dst_shared), {}, size_and_align, 0};
  {
    Hidden hidden;
    const std::size_t size = size_and_align;
    bool valid = (size == 4 || size == 8 || size == 16) && zfill <= size &&
                 reinterpret_cast<std::uintptr_t>(dst_shared) % size == 0 &&
                 reinterpret_cast<std::uintptr_t>(src_global) % size == 0;
    // Within one of the running block's __shared__ arrays: the one the thread's last
    // copy went to first (a kernel stages into one or two), else the first of every
    // array this worker has made. Remembering it took a cp.async-heavy test from
    // 200-210 s to 183-186 s under AddressSanitizer, where the scan is instrumented.
    if (valid && (t.copy_target == nullptr || !holds(s, *t.copy_target, copy.dst, size))) {
      const auto hit = std::find_if(s.shared.begin(), s.shared.end(), [&](const auto& entry) {
        return holds(s, entry.second, copy.dst, size);
      });
      t.copy_target = hit == s.shared.end() ? nullptr : &hit->second;
      valid = t.copy_target != nullptr;
    }
    if (!valid) reject_copy(s, t, dst_shared, src_global, size, zfill);
    copy.batch = t.commits;
  }
  // The thread's own accesses: the source is read now, the destination is undefined
  // (NaN) until the wait.
  if (zfill == 0) {
    copy_small(copy.bytes, src_global, size_and_align);
  } else {
    std::memcpy(copy.bytes, src_global, size_and_align - zfill);
    std::memset(copy.bytes + (size_and_align - zfill), 0, zfill);
  }
  static constexpr unsigned char kNaN[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                             0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  copy_small(copy.dst, kNaN, size_and_align);
  Hidden hidden;
  t.pending.push_back(copy);
}

void pipeline_commit() {
  Thread& t = running_thread("__pipeline_commit");
  Hidden hidden;
  ++t.commits;
}

void pipeline_wait_prior(std::size_t prior) {
  Thread& t = running_thread("__pipeline_wait_prior");
  std::vector<PendingCopy>& done = t.landing;
  {
    Hidden hidden;
    // Batches [0, commits - prior) complete; uncommitted copies stay pending. Copies
    // are queued in issue order, so their batches never decrease: the complete ones
    // are a prefix.
    const std::uint64_t complete = t.commits > prior ? t.commits - prior : 0;
    const auto still =
        std::partition_point(t.pending.begin(), t.pending.end(),
                             [&](const PendingCopy& c) { return c.batch < complete; });
    done.assign(t.pending.begin(), still);
    t.pending.erase(t.pending.begin(), still);
  }
  for (const PendingCopy& c : done) copy_small(c.dst, c.bytes, c.size);
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
