// What the emulated GPUs' block parts share (internal to emulator/src): the stream
// worker's scheduler, the running block's threads, warps and __shared__ arrays, and
// the way a thread waits. block.cpp runs a launch's blocks on fibers (the switches,
// the block's threads and __syncthreads); warp.cpp is the warps' meeting point
// (shuffles, votes, __syncwarp, warp_collective); shared_memory.cpp holds a block's
// __shared__ arrays and the asynchronous copies into them. block.cpp's opening
// comment says how the threads take turns and what ThreadSanitizer is told.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/detail/fcontext.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "internal.h"

#ifdef TLEMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif
#ifdef TLEMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace tlemu::detail {

constexpr std::size_t kStackBytes = std::size_t{256} << 10;  // sanitizers' frames are large
constexpr std::size_t kSharedLimit = std::size_t{48} << 10;  // static __shared__ per block

// A kernel's misuse of the device (printed with "emulated GPU: ", exit status 86), and
// a source file's name without its folders, for such messages.
[[noreturn]] __attribute__((format(printf, 1, 2))) void kernel_bug(const char* format, ...);
const char* short_name(const char* file);

// TSan's contexts (block.cpp): one per CUDA thread, no-ops without TSan.
void* new_tsan_context();
void destroy_tsan_context(void* context);

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

// The calling worker's scheduler.
Scheduler& scheduler();
// "kernel K on cuda:D, block (x,y,z)", for messages.
std::string block_name(const Scheduler& s);

// Makes `context` the one TSan charges what runs next to. A macro, not a function:
// TSan pairs every function's entry and exit within one context, and a call that
// switched contexts would return into the other one.
#ifdef TLEMU_TSAN
#define TLEMU_BECOME(context) __tsan_switch_to_fiber((context), __tsan_switch_to_fiber_no_sync)
#else
#define TLEMU_BECOME(context) (void)(context)
#endif

// A thread's wait, in an unnamed namespace as it was when the block was one file:
// each file keeps its own copies, of internal linkage, which the compiler inlines
// where they are called (it would not inline a function of external linkage there,
// and the other files could only call it).
namespace {

// The running thread's coordinates, after it (re)gains its worker.
inline void take_coordinates(const Thread& t) {
  Hidden hidden;
  threadIdx = t.index;
}

// From fiber f back to the worker; returns when the worker resumes f. Called as the
// context the fiber is in (its thread's, or its own between threads).
inline void suspend(Scheduler& s, [[maybe_unused]] Fiber& f) {
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

// Makes the thread runnable again (its fiber resumes it).
inline void wake(Scheduler& s, Thread& t) {
  t.state = ThreadState::Running;
  s.ready.push_back(t.fiber);
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

}  // namespace

// The CUDA thread the calling fiber runs; outside a kernel, a kernel_bug naming `what`.
Thread& running_thread(const char* what);

}  // namespace tlemu::detail
