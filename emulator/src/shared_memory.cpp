// __shared__ memory on the emulated GPUs, and the asynchronous copies into it
// (cuda_pipeline.h). A __shared__ declaration's storage is kept by the stream's
// worker, keyed by the declaration, and filled with 0xff bytes (NaN as floats) when a
// block first touches it; a block's arrays together may hold kSharedLimit bytes. An
// asynchronous copy reads its source at issue, fills its destination with NaN and
// writes it only when its thread waits for its batch, so a read before the wait (or
// before the barrier after the others' waits) shows in the results.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "block_internal.h"
#include "cuda_pipeline.h"

namespace tlemu::detail {

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

}  // namespace tlemu::detail
