// Per-device caching allocator.
//
// Every tensor's memory comes from here. Memory obtained from the device (a
// "segment": cudaMalloc, page-locked or plain host memory) is kept and carved into
// blocks; a freed block goes back to the cache, so a steady training step makes no
// cudaMalloc or cudaFree at all.
//
// Stream order. A block belongs to the stream it was allocated for (the
// cudaStream_t; on the host every stream is nullptr, since host work has finished
// when the call that submitted it returns), and stays its owner once freed: the
// work that used it was submitted to that stream before the free. (Work on another
// stream that uses it must be ordered before the free by the caller.) An
// allocation on stream S is served, cheapest first, by:
//   1. a free block owned by S: S's later work runs after the work that freed it,
//      so reuse needs no synchronization;
//   2. a free block no stream owes work to (see release_stream);
//   3. a new segment, within the cap;
//   4. free blocks of other streams: the shortest run of adjacent free blocks that
//      holds the request, whoever owns them. S is made to wait for the work its
//      owners have submitted so far (an event on the device: no host wait, no
//      device-wide synchronize), then the run is S's and merges into one block.
//      The wait covers all of that work, not only the blocks' last use; a steady
//      step is served by step 1 and does not pay it;
//   5. with allow_growth, every fully free segment is given back (after waiting
//      for the device) and a new segment is tried once more.
// Adjacent free blocks with one owner are always merged, so OutOfMemory means that
// no segment holds a large enough contiguous free range and the cap allows no new
// one. A stream's handle may be reused once it is destroyed: Stream's destructor
// calls release_stream(), which waits for the stream's work and hands its blocks,
// free and in use, to no stream.
//
// Memory options (engine/settings.h) are TensorFlow 1.x's two tf.GPUOptions:
//   fraction      cap the device at this share of its memory
//                 (per_process_gpu_memory_fraction);
//   allow_growth  true: reserve segments as they are needed; false: reserve the
//                 whole cap at the first allocation, as TensorFlow does by default.
// Running out of memory throws OutOfMemory naming the device, the request and
// what is in use, and leaves the allocator usable. Every member is thread-safe:
// the towers of one device allocate from their own threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "device.h"
#include "settings.h"  // MemoryOptions

namespace towerlab {

struct MemoryStats {
  std::size_t in_use_bytes = 0;           // held by live tensors (rounded block sizes)
  std::size_t peak_in_use_bytes = 0;      // highest in_use_bytes since the last reset_peak()
  std::size_t reserved_bytes = 0;         // obtained from the device (segments)
  std::size_t cached_bytes = 0;           // reserved but free: reserved - in use
  std::size_t limit_bytes = 0;            // the cap in force
  std::uint64_t allocations = 0;          // calls to allocate() that returned memory
  std::uint64_t segment_allocations = 0;  // times memory was obtained from the device
  std::uint64_t stream_handovers = 0;     // allocations served by other streams' free blocks
};

// Where an Allocator gets its segments from.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  // nullptr when the memory is not there; a CudaError for a device's other failures
  // (a sticky error from a kernel that faulted, which must not read as out of memory).
  virtual void* raw_allocate(std::size_t bytes) = 0;
  virtual void raw_free(void* ptr) noexcept = 0;
  virtual std::size_t total_memory() const = 0;
  // Waits for all work that may still use cached blocks (cudaDeviceSynchronize).
  virtual void synchronize() {}
  // Blocks until the work submitted to `stream` so far has finished.
  virtual void synchronize_stream(void* stream) noexcept { (void)stream; }
  // Work submitted to `waiter` from now on runs after the work submitted to `owner`
  // so far (an event recorded on `owner` that `waiter` waits on; the host goes on).
  virtual void wait_stream(void* waiter, void* owner) {
    (void)waiter;
    (void)owner;
  }
  virtual std::string name() const = 0;  // "cpu", "cuda:0", "pinned host"
};

class Allocator {
 public:
  Allocator(std::unique_ptr<MemoryBackend> backend, MemoryOptions options = {});
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // At least `bytes` bytes aligned to 256, for work ordered on `stream` (the
  // cudaStream_t, or nullptr on the host). Zero bytes gives nullptr.
  void* allocate(std::size_t bytes, void* stream = nullptr);
  // Returns memory from allocate(); nullptr is ignored. Never throws.
  void deallocate(void* ptr) noexcept;

  MemoryStats stats() const;
  void reset_peak();
  // Gives every fully free segment back to the device, whichever streams freed its
  // blocks (waits for the device first).
  void release_cached();
  // `stream` is about to be destroyed: waits for its work, then hands the blocks it
  // owns (free ones and those still in use) to no stream, so that a stream created
  // later with the same handle inherits nothing. Never throws.
  void release_stream(void* stream) noexcept;
  // Applies new options. Cached segments are released first; throws
  // InvalidArgument if the new cap is below what is in use.
  void set_options(const MemoryOptions& options);
  MemoryOptions options() const;
  std::string name() const { return backend_->name(); }

 private:
  struct Block;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };

  std::size_t limit_locked() const;
  Block* take_locked(std::size_t size, void* stream);
  Block* find_free_locked(std::size_t size, void* owner);
  Block* new_segment_locked(std::size_t size, void* stream);
  Block* exact_segment_locked(std::size_t bytes, void* stream);
  Block* take_from_other_streams_locked(std::size_t size, void* stream);
  Block* split_locked(Block* block, std::size_t size);
  Block* merge_with_neighbours_locked(Block* block);
  void release_cached_locked();
  [[noreturn]] void throw_oom_locked(std::size_t requested) const;

  std::unique_ptr<MemoryBackend> backend_;
  MemoryOptions options_;
  mutable std::mutex mutex_;
  std::set<Block*, BlockOrder> free_blocks_;
  std::map<void*, Block*> live_blocks_;
  std::vector<Block*> segments_;  // the first block of each segment
  MemoryStats stats_;
};

// The allocator of a device's memory (host memory for "cpu"). Throws DeviceError
// if the device is not present.
Allocator& device_allocator(Device device);
// Page-locked host memory for staging transfers (plain host memory without CUDA).
Allocator& pinned_allocator();

// set_memory_options and memory_options: engine/settings.h.
MemoryStats memory_stats(Device device);
// Gives the device's fully free cached segments back (PyTorch's empty_cache): for
// another process, or before a measurement that must not count earlier work's cache.
void release_cached_memory(Device device);
// Allocator::release_stream for the allocator of `device`, if one was made; for
// Stream's destructor. Never throws.
void release_stream(Device device, void* stream) noexcept;

// "1.50 GiB", "512 B": for messages.
std::string format_bytes(std::size_t bytes);

}  // namespace towerlab
