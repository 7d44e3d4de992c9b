// Per-device caching allocator.
//
// Every tensor's memory comes from here. Memory obtained from the device (a
// "segment": cudaMalloc, page-locked or plain host memory) is kept and carved into
// blocks; a freed block goes back to the cache, so a steady training step makes no
// cudaMalloc or cudaFree at all. On CUDA the cache is stream-ordered: a block freed
// by work on stream S is handed out again only to allocations on S, which run after
// that work in stream order, so reuse needs no synchronization.
//
// Memory options are the two of seed 003 (TensorFlow's gpu_options):
//   fraction      cap the device at this share of its memory
//                 (per_process_gpu_memory_fraction);
//   allow_growth  true: reserve segments as they are needed; false: reserve the
//                 whole cap at the first allocation, as TensorFlow does by default.
// Running out of memory throws OutOfMemory naming the device, the request and
// what is in use, and leaves the allocator usable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine/device.h"

namespace towerlab {

struct MemoryOptions {
  double fraction = 1.0;        // (0, 1]: share of the device's total memory
  std::size_t limit_bytes = 0;  // optional absolute cap; 0 = none. The smaller cap wins.
  bool allow_growth = true;
};

struct MemoryStats {
  std::size_t in_use_bytes = 0;           // held by live tensors (rounded block sizes)
  std::size_t peak_in_use_bytes = 0;      // highest in_use_bytes since the last reset_peak()
  std::size_t reserved_bytes = 0;         // obtained from the device (segments)
  std::size_t cached_bytes = 0;           // reserved but free: reserved - in use
  std::size_t limit_bytes = 0;            // the cap in force
  std::uint64_t allocations = 0;          // calls to allocate() that returned memory
  std::uint64_t segment_allocations = 0;  // times memory was obtained from the device
};

// Where an Allocator gets its segments from.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual void* raw_allocate(std::size_t bytes) noexcept = 0;  // nullptr when it fails
  virtual void raw_free(void* ptr) noexcept = 0;
  virtual std::size_t total_memory() const = 0;
  // Waits for all work that may still use cached blocks (cudaDeviceSynchronize).
  virtual void synchronize() {}
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
  // Gives every fully free segment back to the device.
  void release_cached();
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
  Block* find_free_locked(std::size_t size, void* stream);
  Block* new_segment_locked(std::size_t size, void* stream);
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

void set_memory_options(Device device, const MemoryOptions& options);
MemoryStats memory_stats(Device device);

// "1.50 GiB", "512 B": for messages.
std::string format_bytes(std::size_t bytes);

}  // namespace towerlab
