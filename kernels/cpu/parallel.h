// Spreading a CPU kernel's loop over the host thread pool (engine/thread_pool.h).
//
//   parallel_rows(rows, values_per_row, body)
//     calls body(first, last) on contiguous ranges that cover [0, rows) exactly
//     once: on the calling thread alone when the loop touches fewer than
//     kMinParallelValues values (waking a worker costs about what one core needs to
//     stream them), otherwise on the pool's threads, which claim blocks of about
//     kBlockValues values one at a time. A thread that the OS delays (another
//     process on its core) then takes fewer blocks instead of holding up the loop,
//     and a block that no worker has claimed yet is run by the caller.
//
// Determinism: a kernel splits only a loop whose rows write disjoint outputs, and
// each row does its own arithmetic in the same order whichever range it lands in.
// The result then depends neither on the number of threads nor on which thread
// runs which range: it is bit for bit the single-threaded result. A reduction is
// split over its outputs (batch-norm statistics and the bias gradient over
// channels), never over the values one output sums.
//
// Towers: CPU towers call kernels from several threads at once. Each tower thread
// holds a ThreadShare (engine/thread_pool.h), so a loop uses that tower's share of
// the threads: T towers on P cores run P threads in all, and a tower whose share
// is one thread runs its loops inline until the towers that finished first lend it
// their cores (ThreadShareGroup).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "engine/thread_pool.h"

namespace towerlab::cpu {

// Below this many values (about 64 KiB of float32 read or written), a loop runs on
// the calling thread.
inline constexpr std::int64_t kMinParallelValues = 16384;
// The size of the blocks threads claim: small enough to even out a delayed thread,
// large enough that one atomic add per block costs nothing.
inline constexpr std::int64_t kBlockValues = 8192;

template <typename Body>
void parallel_rows(std::int64_t rows, std::int64_t values_per_row, const Body& body) {
  if (rows <= 0) return;
  const int threads = thread_share();
  if (rows < 2 || threads < 2 || rows * values_per_row < kMinParallelValues) {
    body(std::int64_t{0}, rows);
    return;
  }
  const std::int64_t block = std::max<std::int64_t>(1, kBlockValues / values_per_row);  // rows
  const std::int64_t blocks = (rows + block - 1) / block;
  std::atomic<std::int64_t> next{0};
  parallel_for(0, std::min<std::int64_t>(threads, blocks), [&](std::int64_t, std::int64_t) {
    for (std::int64_t b = next.fetch_add(1); b < blocks; b = next.fetch_add(1)) {
      body(b * block, std::min(rows, (b + 1) * block));
    }
  });
}

}  // namespace towerlab::cpu
