// Spreading a CPU kernel's loop over the host thread pool (engine/thread_pool.h).
//
//   parallel_rows(rows, values_per_row, body)
//     calls body(first, last) on contiguous ranges that cover [0, rows) exactly
//     once: through parallel_for when the loop touches at least kMinParallelValues
//     values, on the calling thread alone when it is too small to pay for waking
//     the pool's workers (a few microseconds each).
//
// Determinism: a kernel splits only a loop whose rows write disjoint outputs, and
// each row does its own arithmetic in the same order whichever range it lands in.
// The result then depends neither on the number of threads nor on which thread
// runs which range: it is bit for bit the single-threaded result. A reduction is
// split over its outputs (batch-norm statistics and the bias gradient over
// channels), never over the values one output sums.
//
// Towers: CPU towers call kernels from several threads at once. parallel_for runs
// inline on a caller that finds the pool busy, so no tower queues behind another;
// but a tower that finds it free takes the workers while the other towers keep
// running, so T towers on T cores briefly run more threads than cores.
#pragma once

#include <cstdint>

#include "engine/thread_pool.h"

namespace towerlab::cpu {

// Below this many values (about 64 KiB of float32 read or written), a loop runs on
// the calling thread: waking a worker costs about what one core needs to stream it.
inline constexpr std::int64_t kMinParallelValues = 16384;

template <typename Body>
void parallel_rows(std::int64_t rows, std::int64_t values_per_row, const Body& body) {
  if (rows <= 0) return;
  if (rows < 2 || rows * values_per_row < kMinParallelValues) {
    body(std::int64_t{0}, rows);
    return;
  }
  parallel_for(0, rows, body);
}

}  // namespace towerlab::cpu
