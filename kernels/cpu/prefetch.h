// Software prefetch for the CPU kernels whose loads or stores the hardware prefetcher
// does not see coming: passes over planes in another order than they lie in memory
// (batch norm's channels of every image; the weight gradient's copies, channel outer,
// image inner), and a tile loop that computes from cache between an image's copy-in
// and its stores (the bfloat16 convolution from padded planes), whose next lines are
// asked for while the tiles run. Each use says what it asks for and cites what it
// was measured on (docs/kernels.md, "Measured choices").
#pragma once

#include <cstdint>

namespace towerlab::cpu {

// Asks for the cache lines of [from, from + bytes), to be loaded.
inline void prefetch_bytes(const void* from, std::int64_t bytes) {
  const char* at = static_cast<const char*>(from);
  for (std::int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(at + b);
}

// Asks for the cache lines of [begin, begin + bytes) a share at a time, one share at
// each call of load() or store() over `calls` (at least 1) calls: to load them, or to
// store into them (on x86 prefetchw, which brings a line in the state a store needs).
// Past the range a call asks for nothing.
class SpreadPrefetch {
 public:
  SpreadPrefetch(const void* begin, std::int64_t bytes, std::int64_t calls)
      : at_(static_cast<const char*>(begin)),
        end_(at_ + bytes),
        share_((bytes / 64 + calls) / calls) {}

  void load() {
    for (std::int64_t i = 0; i < share_ && at_ < end_; ++i, at_ += 64) __builtin_prefetch(at_);
  }

#if defined(__x86_64__)
  // The target makes the write form of __builtin_prefetch the prefetchw instruction.
  __attribute__((target("prfchw"))) void store() {
    for (std::int64_t i = 0; i < share_ && at_ < end_; ++i, at_ += 64) __builtin_prefetch(at_, 1);
  }
#else
  void store() {
    for (std::int64_t i = 0; i < share_ && at_ < end_; ++i, at_ += 64) __builtin_prefetch(at_, 1);
  }
#endif

 private:
  const char* at_;
  const char* end_;
  std::int64_t share_;  // lines a call
};

}  // namespace towerlab::cpu
