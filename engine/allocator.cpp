#include "engine/allocator.h"

#include <unistd.h>

#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <utility>

#include "engine/error.h"

#if TOWERLAB_WITH_CUDA
#include "engine/cuda_check.h"
#endif

namespace towerlab {

namespace {

constexpr std::size_t kAlignment = 512;               // block granularity; also the alignment
constexpr std::size_t kSegmentGranularity = 2 << 20;  // segments are multiples of 2 MiB

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

class HostBackend final : public MemoryBackend {
 public:
  void* raw_allocate(std::size_t bytes) noexcept override {
    return std::aligned_alloc(kAlignment, round_up(bytes, kAlignment));
  }
  void raw_free(void* ptr) noexcept override { std::free(ptr); }
  std::size_t total_memory() const override {
    return static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
           static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE));
  }
  std::string name() const override { return "cpu"; }
};

#if TOWERLAB_WITH_CUDA
class CudaBackend final : public MemoryBackend {
 public:
  explicit CudaBackend(int index) : index_(index) {}
  void* raw_allocate(std::size_t bytes) noexcept override {
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return nullptr;
    cudaSetDevice(index_);
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      ptr = nullptr;
    }
    cudaSetDevice(previous);
    return ptr;
  }
  void raw_free(void* ptr) noexcept override { TL_CUDA_CHECK_PRINT(cudaFree(ptr)); }
  std::size_t total_memory() const override {
    CudaDeviceGuard guard(index_);
    std::size_t free_bytes = 0, total = 0;
    TL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return total;
  }
  void synchronize() override {
    CudaDeviceGuard guard(index_);
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::string name() const override { return "cuda:" + std::to_string(index_); }

 private:
  int index_;
};

class PinnedBackend final : public MemoryBackend {
 public:
  void* raw_allocate(std::size_t bytes) noexcept override {
    void* ptr = nullptr;
    if (cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return ptr;
  }
  void raw_free(void* ptr) noexcept override { TL_CUDA_CHECK_PRINT(cudaFreeHost(ptr)); }
  std::size_t total_memory() const override { return HostBackend().total_memory(); }
  std::string name() const override { return "pinned host"; }
};
#endif

}  // namespace

// A block is a piece of one segment; blocks of a segment form a doubly linked
// list in address order so that a freed block can merge with free neighbours.
struct Allocator::Block {
  char* ptr = nullptr;
  std::size_t size = 0;
  void* stream = nullptr;
  bool free = true;
  Block* prev = nullptr;
  Block* next = nullptr;
};

bool Allocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return std::less<void*>()(a->stream, b->stream);
  if (a->size != b->size) return a->size < b->size;
  return std::less<char*>()(a->ptr, b->ptr);
}

Allocator::Allocator(std::unique_ptr<MemoryBackend> backend, MemoryOptions options)
    : backend_(std::move(backend)) {
  set_options(options);
}

Allocator::~Allocator() {
  std::lock_guard lock(mutex_);
  for (Block* head : segments_) {
    backend_->raw_free(head->ptr);
    for (Block* b = head; b != nullptr;) delete std::exchange(b, b->next);
  }
}

std::size_t Allocator::limit_locked() const {
  auto cap =
      static_cast<std::size_t>(options_.fraction * static_cast<double>(backend_->total_memory()));
  if (options_.limit_bytes != 0 && options_.limit_bytes < cap) cap = options_.limit_bytes;
  return cap;
}

Allocator::Block* Allocator::find_free_locked(std::size_t size, void* stream) {
  Block key;
  key.size = size;
  key.stream = stream;
  auto it = free_blocks_.lower_bound(&key);
  if (it == free_blocks_.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  free_blocks_.erase(it);
  if (block->size - size >= kAlignment) {
    // Split: the tail stays free for later requests on the same stream.
    auto* tail = new Block{block->ptr + size, block->size - size, stream, true, block, block->next};
    if (block->next != nullptr) block->next->prev = tail;
    block->next = tail;
    block->size = size;
    free_blocks_.insert(tail);
  }
  return block;
}

Allocator::Block* Allocator::new_segment_locked(std::size_t size, void* stream) {
  const std::size_t limit = limit_locked();
  std::size_t segment = round_up(size, kSegmentGranularity);
  if (!options_.allow_growth) {
    // TensorFlow's default: the whole cap is reserved once, then only carved.
    if (!segments_.empty()) return nullptr;
    segment = limit;
  }
  if (segment < size || stats_.reserved_bytes + segment > limit) {
    if (options_.allow_growth && stats_.reserved_bytes + size <= limit) {
      segment = size;  // the 2 MiB rounding must not be what breaks the cap
    } else {
      return nullptr;
    }
  }
  void* ptr = backend_->raw_allocate(segment);
  if (ptr == nullptr) return nullptr;
  auto* head = new Block{static_cast<char*>(ptr), segment, stream, true, nullptr, nullptr};
  segments_.push_back(head);
  stats_.reserved_bytes += segment;
  ++stats_.segment_allocations;
  free_blocks_.insert(head);
  return head;
}

void* Allocator::allocate(std::size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  const std::size_t size = round_up(bytes, kAlignment);
  std::lock_guard lock(mutex_);
  Block* block = find_free_locked(size, stream);
  if (block == nullptr && new_segment_locked(size, stream) != nullptr) {
    block = find_free_locked(size, stream);
  }
  if (block == nullptr && options_.allow_growth) {
    // Out of room: give back what is cached (blocks free on other streams too,
    // once the device is idle) and try once more before reporting.
    release_cached_locked();
    if (new_segment_locked(size, stream) != nullptr) block = find_free_locked(size, stream);
  }
  if (block == nullptr && !options_.allow_growth && !segments_.empty()) {
    // One reserved segment: after a synchronize, blocks freed on any stream may be reused.
    backend_->synchronize();
    std::vector<Block*> retag(free_blocks_.begin(), free_blocks_.end());
    free_blocks_.clear();
    for (Block* b : retag) {
      b->stream = stream;
      free_blocks_.insert(b);
    }
    block = find_free_locked(size, stream);
  }
  if (block == nullptr) throw_oom_locked(bytes);

  block->free = false;
  block->stream = stream;
  live_blocks_[block->ptr] = block;
  stats_.in_use_bytes += block->size;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  ++stats_.allocations;
  return block->ptr;
}

void Allocator::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_blocks_.find(ptr);
  if (it == live_blocks_.end()) return;  // not ours: ignoring beats corrupting the cache
  Block* block = it->second;
  live_blocks_.erase(it);
  stats_.in_use_bytes -= block->size;
  block->free = true;

  auto mergeable = [block](const Block* other) {
    return other != nullptr && other->free && other->stream == block->stream;
  };
  if (mergeable(block->next)) {
    Block* next = block->next;
    free_blocks_.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (block->next != nullptr) block->next->prev = block;
    delete next;
  }
  if (mergeable(block->prev)) {
    Block* prev = block->prev;
    free_blocks_.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next != nullptr) prev->next->prev = prev;
    delete block;
    block = prev;
  }
  free_blocks_.insert(block);
}

void Allocator::release_cached_locked() {
  bool any = false;
  for (Block* head : segments_) any = any || (head->free && head->next == nullptr);
  if (!any) return;
  backend_->synchronize();
  std::vector<Block*> kept;
  for (Block* head : segments_) {
    if (head->free && head->next == nullptr) {
      free_blocks_.erase(head);
      stats_.reserved_bytes -= head->size;
      backend_->raw_free(head->ptr);
      delete head;
    } else {
      kept.push_back(head);
    }
  }
  segments_ = std::move(kept);
}

void Allocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void Allocator::throw_oom_locked(std::size_t requested) const {
  const std::size_t limit = limit_locked();
  std::ostringstream os;
  os << "out of memory on " << backend_->name() << ": cannot allocate " << format_bytes(requested)
     << " (in use " << format_bytes(stats_.in_use_bytes) << ", reserved "
     << format_bytes(stats_.reserved_bytes) << ", limit " << format_bytes(limit);
  if (options_.fraction < 1.0) os << " = fraction " << options_.fraction << " of the device";
  if (!options_.allow_growth) os << ", allow_growth off";
  os << "); free tensors or raise MemoryOptions::fraction / limit_bytes";
  throw OutOfMemory(os.str());
}

MemoryStats Allocator::stats() const {
  std::lock_guard lock(mutex_);
  MemoryStats s = stats_;
  s.cached_bytes = s.reserved_bytes - s.in_use_bytes;
  s.limit_bytes = limit_locked();
  return s;
}

void Allocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

void Allocator::set_options(const MemoryOptions& options) {
  TL_CHECK(options.fraction > 0.0 && options.fraction <= 1.0, InvalidArgument,
           "memory options for " << backend_->name() << ": fraction must be in (0, 1], got "
                                 << options.fraction);
  std::lock_guard lock(mutex_);
  release_cached_locked();
  MemoryOptions old = std::exchange(options_, options);
  if (limit_locked() < stats_.reserved_bytes) {
    options_ = old;
    TL_THROW(InvalidArgument, "memory options for "
                                  << backend_->name() << ": the new limit is below the "
                                  << format_bytes(stats_.reserved_bytes) << " in use");
  }
}

MemoryOptions Allocator::options() const {
  std::lock_guard lock(mutex_);
  return options_;
}

namespace {

struct Registry {
  std::mutex mutex;
  std::map<int, std::unique_ptr<Allocator>> cuda;
  std::unique_ptr<Allocator> host;
  std::unique_ptr<Allocator> pinned;
};

// Never destroyed: CUDA memory cannot be freed safely once the runtime has begun
// to shut down at exit, and the process gives everything back anyway.
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

}  // namespace

Allocator& device_allocator(Device device) {
  check_available(device);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (device.is_cpu()) {
    if (!r.host) r.host = std::make_unique<Allocator>(std::make_unique<HostBackend>());
    return *r.host;
  }
#if TOWERLAB_WITH_CUDA
  auto& slot = r.cuda[device.index];
  if (!slot) slot = std::make_unique<Allocator>(std::make_unique<CudaBackend>(device.index));
  return *slot;
#else
  TL_THROW(NotSupported, "no CUDA backend in this build");  // unreachable: check_available threw
#endif
}

Allocator& pinned_allocator() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (!r.pinned) {
#if TOWERLAB_WITH_CUDA
    if (cuda_device_count() > 0) {
      r.pinned = std::make_unique<Allocator>(std::make_unique<PinnedBackend>());
      return *r.pinned;
    }
#endif
    r.pinned = std::make_unique<Allocator>(std::make_unique<HostBackend>());
  }
  return *r.pinned;
}

void set_memory_options(Device device, const MemoryOptions& options) {
  device_allocator(device).set_options(options);
}

MemoryStats memory_stats(Device device) {
  return device_allocator(device).stats();
}

std::string format_bytes(std::size_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  std::ostringstream os;
  if (unit == 0) {
    os << bytes << " B";
  } else {
    os << std::fixed << std::setprecision(2) << value << " " << units[unit];
  }
  return os.str();
}

}  // namespace towerlab
