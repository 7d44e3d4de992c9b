// The host thread pool: one small persistent pool per process that CPU kernels
// use to spread a loop over the cores (the GEMM first of all).
//
//   parallel_for(begin, end, body)
//     calls body(chunk_begin, chunk_end) on disjoint, contiguous chunks that cover
//     [begin, end) exactly once, at most one chunk per thread, and returns when all
//     have finished. The calling thread runs a chunk itself. An exception thrown by
//     a chunk is rethrown in the caller (the first one, if several throw) after
//     every chunk has finished.
//
// It runs the whole range inline, on the calling thread, when:
//   - the range has fewer than two items, or the pool has one thread;
//   - it is called from inside a chunk (nested parallel_for), so a kernel that
//     calls another parallel kernel never waits on itself;
//   - another thread is using the pool at that moment. CPU towers call kernels
//     from several threads at once; they are already parallel, and running inline
//     instead of queueing means no caller ever waits on another (no deadlock).
//
// Threads: std::thread::hardware_concurrency() by default (the caller plus that
// many minus one workers), or what set_num_threads() asked for.
#pragma once

#include <cstdint>
#include <functional>

#include "engine/settings.h"

namespace towerlab {

void parallel_for(std::int64_t begin, std::int64_t end,
                  const std::function<void(std::int64_t, std::int64_t)>& body);

// num_threads() and set_num_threads(n), the pool's size: engine/settings.h.

}  // namespace towerlab
