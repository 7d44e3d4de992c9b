#include "engine/allocator.h"

#include <unistd.h>

#include <algorithm>
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
    void* ptr = nullptr;
    return posix_memalign(&ptr, kAlignment, bytes) == 0 ? ptr : nullptr;
  }
  void raw_free(void* ptr) noexcept override { std::free(ptr); }
  std::size_t total_memory() const override {
    return static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
           static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE));
  }
  std::string name() const override { return "cpu"; }
};

#if TOWERLAB_WITH_CUDA
// What an allocation call (`call`, its text) that returned `status` gives: `ptr`,
// nullptr where there is no memory to give, and a CudaError for any other failure,
// which is the device's, not the memory's: a kernel that faulted earlier leaves its
// sticky error, which the allocation returns like every call.
void* allocated(cudaError_t status, void* ptr, const char* call) {
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (status != cudaSuccess) {
    detail::throw_cuda_error(call, cudaGetErrorName(status), detail::current_cuda_device(),
                             __FILE__, __LINE__);
  }
  return ptr;
}

class CudaBackend final : public MemoryBackend {
 public:
  explicit CudaBackend(int index) : index_(index) {}
  ~CudaBackend() override {
    if (event_ != nullptr) TL_CUDA_CHECK_PRINT(cudaEventDestroy(event_));
  }
  void* raw_allocate(std::size_t bytes) override {
    CudaDeviceGuard guard(index_);
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    return allocated(status, ptr, "cudaMalloc(&ptr, bytes)");
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
  void synchronize_stream(void* stream) noexcept override {
    TL_CUDA_CHECK_PRINT(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
  void wait_stream(void* waiter, void* owner) override {
    // One event serves every handover: the wait captures the event as recorded at
    // the call, so recording it again later changes nothing for this waiter. The
    // allocator's lock serializes the calls.
    CudaDeviceGuard guard(index_);
    if (event_ == nullptr) {
      TL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    }
    TL_CUDA_CHECK(cudaEventRecord(event_, static_cast<cudaStream_t>(owner)));
    TL_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), event_, 0));
  }
  std::string name() const override { return "cuda:" + std::to_string(index_); }

 private:
  int index_;
  cudaEvent_t event_ = nullptr;
};

class PinnedBackend final : public MemoryBackend {
 public:
  void* raw_allocate(std::size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
    return allocated(status, ptr, "cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable)");
  }
  void raw_free(void* ptr) noexcept override { TL_CUDA_CHECK_PRINT(cudaFreeHost(ptr)); }
  std::size_t total_memory() const override { return HostBackend().total_memory(); }
  std::string name() const override { return "pinned host"; }
};
#endif

}  // namespace

// A block is a piece of one segment; blocks of a segment form a doubly linked
// list in address order so that a freed block can merge with free neighbours.
// A block in free_blocks_ is never modified in place (the set is ordered by its
// fields): it is erased, changed, then inserted again.
struct Allocator::Block {
  char* ptr = nullptr;
  std::size_t size = 0;
  void* stream = nullptr;  // the owner; kNoStream once its stream was released
  bool free = true;
  Block* prev = nullptr;
  Block* next = nullptr;
};

namespace {

// The owner of blocks that no stream owes work to. Its address is this library's,
// so it can be neither a cudaStream_t nor nullptr (the host's stream).
char no_stream_tag;
void* const kNoStream = &no_stream_tag;

}  // namespace

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

// `block` is free and in no set. Its first `size` bytes are returned; the rest,
// if worth keeping, stays free for its owner.
Allocator::Block* Allocator::split_locked(Block* block, std::size_t size) {
  if (block->size - size >= kAlignment) {
    auto* tail =
        new Block{block->ptr + size, block->size - size, block->stream, true, block, block->next};
    if (block->next != nullptr) block->next->prev = tail;
    block->next = tail;
    block->size = size;
    free_blocks_.insert(tail);
  }
  return block;
}

// `block` is free and in no set; merges it with every adjacent free block of the
// same owner and returns the merged block, in no set.
Allocator::Block* Allocator::merge_with_neighbours_locked(Block* block) {
  auto mergeable = [owner = block->stream](const Block* other) {
    return other != nullptr && other->free && other->stream == owner;
  };
  auto absorb_next = [this](Block* b) {
    Block* next = b->next;
    free_blocks_.erase(next);
    b->size += next->size;
    b->next = next->next;
    if (b->next != nullptr) b->next->prev = b;
    delete next;
  };
  while (mergeable(block->next)) absorb_next(block);
  while (mergeable(block->prev)) {
    block = block->prev;
    free_blocks_.erase(block);
    absorb_next(block);
  }
  return block;
}

Allocator::Block* Allocator::find_free_locked(std::size_t size, void* owner) {
  Block key;
  key.size = size;
  key.stream = owner;
  auto it = free_blocks_.lower_bound(&key);
  if (it == free_blocks_.end() || (*it)->stream != owner) return nullptr;
  Block* block = *it;
  free_blocks_.erase(it);
  return split_locked(block, size);
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
  return split_locked(head, size);
}

Allocator::Block* Allocator::take_from_other_streams_locked(std::size_t size, void* stream) {
  // The shortest window of adjacent free blocks that holds `size`, over every
  // segment: two pointers over each run of free blocks. Moving only this window
  // leaves the other streams the rest of their cache.
  Block* best_first = nullptr;
  Block* best_last = nullptr;
  std::size_t best_total = 0;
  for (Block* head : segments_) {
    Block* first = head;
    std::size_t total = 0;
    for (Block* last = head; last != nullptr; last = last->next) {
      if (!last->free) {
        first = last->next;
        total = 0;
        continue;
      }
      total += last->size;
      while (first != last && total - first->size >= size) {
        total -= first->size;
        first = first->next;
      }
      if (total >= size && (best_first == nullptr || total < best_total)) {
        best_first = first;
        best_last = last;
        best_total = total;
      }
    }
  }
  if (best_first == nullptr) return nullptr;

  // Order first (it may throw; nothing has changed yet), then hand the window over.
  std::vector<void*> owners;
  for (Block* b = best_first;; b = b->next) {
    if (b->stream != stream && b->stream != kNoStream &&
        std::find(owners.begin(), owners.end(), b->stream) == owners.end()) {
      owners.push_back(b->stream);
    }
    if (b == best_last) break;
  }
  for (void* owner : owners) backend_->wait_stream(stream, owner);
  for (Block* b = best_first;; b = b->next) {
    free_blocks_.erase(b);
    b->stream = stream;
    if (b == best_last) break;
  }
  ++stats_.stream_handovers;
  return split_locked(merge_with_neighbours_locked(best_first), size);
}

Allocator::Block* Allocator::take_locked(std::size_t size, void* stream) {
  if (Block* b = find_free_locked(size, stream)) return b;
  if (Block* b = find_free_locked(size, kNoStream)) return b;
  if (Block* b = new_segment_locked(size, stream)) return b;
  if (Block* b = take_from_other_streams_locked(size, stream)) return b;
  if (!options_.allow_growth) return nullptr;
  // At the cap with no contiguous free range large enough: give back the fully
  // free segments (this waits for the device) and try a new one.
  release_cached_locked();
  return new_segment_locked(size, stream);
}

// MemoryOptions::exact_blocks: a segment of exactly `bytes`, never split or shared.
Allocator::Block* Allocator::exact_segment_locked(std::size_t bytes, void* stream) {
  if (stats_.reserved_bytes + bytes > limit_locked()) return nullptr;
  void* ptr = backend_->raw_allocate(bytes);
  if (ptr == nullptr) return nullptr;
  auto* block = new Block{static_cast<char*>(ptr), bytes, stream, true, nullptr, nullptr};
  segments_.push_back(block);
  stats_.reserved_bytes += bytes;
  ++stats_.segment_allocations;
  return block;
}

void* Allocator::allocate(std::size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  const std::size_t size = round_up(bytes, kAlignment);
  std::lock_guard lock(mutex_);
  Block* block =
      options_.exact_blocks ? exact_segment_locked(bytes, stream) : take_locked(size, stream);
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
  if (options_.exact_blocks) {
    // Given back at once (cudaFree waits for the device, so no queued work still uses it).
    segments_.erase(std::find(segments_.begin(), segments_.end(), block));
    stats_.reserved_bytes -= block->size;
    backend_->raw_free(block->ptr);
    delete block;
    return;
  }
  free_blocks_.insert(merge_with_neighbours_locked(block));
}

void Allocator::release_stream(void* stream) noexcept {
  // Outside the lock: the other towers go on allocating while this one waits.
  backend_->synchronize_stream(stream);
  std::lock_guard lock(mutex_);
  for (Block* head : segments_) {
    for (Block* b = head; b != nullptr; b = b->next) {
      if (b->stream != stream) continue;
      if (!b->free) {
        b->stream = kNoStream;  // freed later: no work of a live stream is pending on it
        continue;
      }
      free_blocks_.erase(b);
      b->stream = kNoStream;
      b = merge_with_neighbours_locked(b);
      free_blocks_.insert(b);
    }
  }
}

void Allocator::release_cached_locked() {
  auto fully_free = [](const Block* head) {
    for (const Block* b = head; b != nullptr; b = b->next) {
      if (!b->free) return false;
    }
    return true;
  };
  if (std::none_of(segments_.begin(), segments_.end(), fully_free)) return;
  backend_->synchronize();  // blocks of any stream: wait for all their work
  std::vector<Block*> kept;
  for (Block* head : segments_) {
    if (!fully_free(head)) {
      kept.push_back(head);
      continue;
    }
    for (Block* b = head; b != nullptr; b = b->next) {
      stats_.reserved_bytes -= b->size;
      free_blocks_.erase(b);
    }
    void* ptr = head->ptr;
    for (Block* b = head; b != nullptr;) delete std::exchange(b, b->next);
    backend_->raw_free(ptr);
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
  // A block is given back the way it was made: an exact block alone, a cached one
  // into its segment. Switching between the two under a live block would free it
  // the other way.
  TL_CHECK(options.exact_blocks == options_.exact_blocks || live_blocks_.empty(), InvalidArgument,
           "memory options for " << backend_->name() << ": exact_blocks can change only while "
                                 << "nothing is allocated (" << live_blocks_.size() << " blocks, "
                                 << format_bytes(stats_.in_use_bytes) << " in use)");
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

#if TOWERLAB_WITH_CUDA
// The options a GPU's allocator starts with: the defaults, and exact blocks where
// the environment asks for them (a sanitizer run; the host's allocator keeps its
// cache, which tests of the CPU's steady state rely on).
MemoryOptions initial_cuda_options() {
  MemoryOptions options;
  options.exact_blocks =
      detail::environment_choice("TOWERLAB_EXACT_ALLOCATIONS", {"0", "1"}) == "1";
  return options;
}
#endif

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
  if (!slot) {
    slot = std::make_unique<Allocator>(std::make_unique<CudaBackend>(device.index),
                                       initial_cuda_options());
  }
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

MemoryOptions memory_options(Device device) {
  return device_allocator(device).options();
}

MemoryStats memory_stats(Device device) {
  return device_allocator(device).stats();
}

void release_cached_memory(Device device) {
  device_allocator(device).release_cached();
}

void release_stream(Device device, void* stream) noexcept {
  // Only an allocator that exists can hold the stream's blocks; making one here
  // could throw, and this runs in destructors, at exit too.
  Allocator* allocator = nullptr;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (device.is_cpu()) {
      allocator = r.host.get();
    } else if (auto it = r.cuda.find(device.index); it != r.cuda.end()) {
      allocator = it->second.get();
    }
  }
  if (allocator != nullptr) allocator->release_stream(stream);
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
