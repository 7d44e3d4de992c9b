// The caching allocator, driven through a counting fake backend so that the
// device's memory size, its failures and every raw allocation are under the
// test's control. The same Allocator class serves host, pinned and CUDA memory.
#include <algorithm>
#include <cstring>
#include <thread>

#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr std::size_t MiB = 1 << 20;

// Host memory posing as a device of `total` bytes that can be told to fail.
class FakeBackend final : public MemoryBackend {
 public:
  explicit FakeBackend(std::size_t total, int* raw_allocs, int* raw_frees)
      : total_(total), raw_allocs_(raw_allocs), raw_frees_(raw_frees) {}
  void* raw_allocate(std::size_t bytes) noexcept override {
    if (fail_next_) {
      fail_next_ = false;
      return nullptr;
    }
    ++*raw_allocs_;
    return std::aligned_alloc(512, (bytes + 511) / 512 * 512);
  }
  void raw_free(void* ptr) noexcept override {
    ++*raw_frees_;
    std::free(ptr);
  }
  std::size_t total_memory() const override { return total_; }
  std::string name() const override { return "fake:0"; }
  bool fail_next_ = false;

 private:
  std::size_t total_;
  int* raw_allocs_;
  int* raw_frees_;
};

class AllocatorTest : public ::testing::Test {
 protected:
  std::unique_ptr<Allocator> make(std::size_t total, MemoryOptions options = {}) {
    auto backend = std::make_unique<FakeBackend>(total, &raw_allocs_, &raw_frees_);
    backend_ = backend.get();
    return std::make_unique<Allocator>(std::move(backend), options);
  }
  int raw_allocs_ = 0;
  int raw_frees_ = 0;
  FakeBackend* backend_ = nullptr;
};

TEST_F(AllocatorTest, SteadyStateReusesBlocksWithoutRawAllocations) {
  auto alloc = make(1024 * MiB);
  void* first = alloc->allocate(1000);
  alloc->deallocate(first);
  const int after_warmup = raw_allocs_;
  for (int step = 0; step < 100; ++step) {
    void* a = alloc->allocate(1000);
    void* b = alloc->allocate(300 * 1024);
    EXPECT_EQ(a, first);
    alloc->deallocate(b);
    alloc->deallocate(a);
  }
  EXPECT_EQ(raw_allocs_, after_warmup);
  EXPECT_EQ(alloc->stats().in_use_bytes, 0u);
}

TEST_F(AllocatorTest, ZeroBytesIsNullAndFreeingNullIsHarmless) {
  auto alloc = make(64 * MiB);
  EXPECT_EQ(alloc->allocate(0), nullptr);
  alloc->deallocate(nullptr);
  int not_ours = 0;
  alloc->deallocate(&not_ours);  // ignored, not a crash
  EXPECT_EQ(alloc->stats().allocations, 0u);
}

TEST_F(AllocatorTest, BlocksAreAlignedAndDisjoint) {
  auto alloc = make(64 * MiB);
  std::vector<char*> blocks;
  for (std::size_t bytes : {1u, 7u, 513u, 4096u, 100000u, 3u}) {
    auto* p = static_cast<char*>(alloc->allocate(bytes));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
    std::memset(p, 0xAB, bytes);  // ASan flags any overlap with another block's bookkeeping
    blocks.push_back(p);
  }
  std::sort(blocks.begin(), blocks.end());
  EXPECT_EQ(std::adjacent_find(blocks.begin(), blocks.end()), blocks.end());
  for (char* p : blocks) alloc->deallocate(p);
}

TEST_F(AllocatorTest, FreedNeighboursMergeIntoOneBlock) {
  auto alloc = make(64 * MiB);
  void* a = alloc->allocate(MiB / 2);
  void* b = alloc->allocate(MiB / 2);
  void* c = alloc->allocate(MiB / 2);
  void* d = alloc->allocate(MiB / 2);  // fills the first 2 MiB segment
  EXPECT_EQ(raw_allocs_, 1);
  alloc->deallocate(b);
  alloc->deallocate(a);
  alloc->deallocate(c);
  // a, b and c merged back: 1.5 MiB fits without a new segment.
  void* big = alloc->allocate(3 * MiB / 2);
  EXPECT_EQ(big, a);
  EXPECT_EQ(raw_allocs_, 1);
  alloc->deallocate(big);
  alloc->deallocate(d);
}

TEST_F(AllocatorTest, StatisticsTrackUseAndPeak) {
  auto alloc = make(64 * MiB);
  void* a = alloc->allocate(1024);
  void* b = alloc->allocate(4096);
  MemoryStats s = alloc->stats();
  EXPECT_EQ(s.in_use_bytes, 1024u + 4096u);
  EXPECT_EQ(s.reserved_bytes, 2 * MiB);
  EXPECT_EQ(s.cached_bytes, 2 * MiB - 5120);
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.segment_allocations, 1u);
  alloc->deallocate(b);
  s = alloc->stats();
  EXPECT_EQ(s.in_use_bytes, 1024u);
  EXPECT_EQ(s.peak_in_use_bytes, 5120u);
  alloc->reset_peak();
  EXPECT_EQ(alloc->stats().peak_in_use_bytes, 1024u);
  alloc->deallocate(a);
  alloc->release_cached();
  EXPECT_EQ(alloc->stats().reserved_bytes, 0u);
  EXPECT_EQ(raw_frees_, 1);
}

TEST_F(AllocatorTest, FractionCapsTheDeviceAndOomLeavesAllocatorUsable) {
  auto alloc = make(100 * MiB, {.fraction = 0.25});
  EXPECT_EQ(alloc->stats().limit_bytes, 25 * MiB);
  void* a = alloc->allocate(20 * MiB);
  EXPECT_THROW_WITH(alloc->allocate(10 * MiB), OutOfMemory,
                    "out of memory on fake:0: cannot allocate 10.00 MiB (in use 20.00 MiB");
  EXPECT_THROW_WITH(alloc->allocate(10 * MiB), OutOfMemory, "limit 25.00 MiB = fraction 0.25");
  // Still usable: what fits, fits.
  void* b = alloc->allocate(4 * MiB);
  EXPECT_NE(b, nullptr);
  alloc->deallocate(a);
  void* c = alloc->allocate(20 * MiB);
  EXPECT_NE(c, nullptr);
  alloc->deallocate(b);
  alloc->deallocate(c);
}

TEST_F(AllocatorTest, AbsoluteLimitWinsWhenSmaller) {
  auto alloc = make(100 * MiB, {.fraction = 0.5, .limit_bytes = 8 * MiB});
  EXPECT_EQ(alloc->stats().limit_bytes, 8 * MiB);
  EXPECT_THROW_WITH(alloc->allocate(9 * MiB), OutOfMemory, "limit 8.00 MiB");
}

TEST_F(AllocatorTest, WithoutGrowthTheWholeCapIsReservedOnce) {
  auto alloc = make(64 * MiB, {.fraction = 0.5, .allow_growth = false});
  void* a = alloc->allocate(1000);
  EXPECT_EQ(alloc->stats().reserved_bytes, 32 * MiB);
  std::vector<void*> blocks{a};
  for (int i = 0; i < 30; ++i) blocks.push_back(alloc->allocate(MiB));
  EXPECT_EQ(raw_allocs_, 1);
  EXPECT_THROW_WITH(alloc->allocate(2 * MiB), OutOfMemory, "allow_growth off");
  for (void* p : blocks) alloc->deallocate(p);
  EXPECT_NE(alloc->allocate(31 * MiB), nullptr);
}

TEST_F(AllocatorTest, DeviceFailureBelowTheCapReleasesCacheThenRetries) {
  auto alloc = make(64 * MiB);
  void* a = alloc->allocate(3 * MiB);
  alloc->deallocate(a);  // 4 MiB cached
  backend_->fail_next_ = true;
  void* b = alloc->allocate(6 * MiB);  // first raw try fails; cache released; retried
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(raw_frees_, 1);
  alloc->deallocate(b);
}

TEST_F(AllocatorTest, BlocksFreedOnOneStreamAreNotHandedToAnother) {
  auto alloc = make(64 * MiB);
  int s1 = 0, s2 = 0;  // stand-ins for two cudaStream_t handles
  void* a = alloc->allocate(1024, &s1);
  alloc->deallocate(a);
  void* b = alloc->allocate(1024, &s2);
  EXPECT_NE(a, b);  // s1's block may still be in use by s1's queued work
  void* c = alloc->allocate(1024, &s1);
  EXPECT_EQ(a, c);  // same stream: safe to reuse at once
  alloc->deallocate(b);
  alloc->deallocate(c);
}

TEST_F(AllocatorTest, OptionsAreValidated) {
  auto alloc = make(64 * MiB);
  EXPECT_THROW_WITH(alloc->set_options({.fraction = 0.0}), InvalidArgument,
                    "fraction must be in (0, 1]");
  EXPECT_THROW_WITH(alloc->set_options({.fraction = 1.5}), InvalidArgument, "got 1.5");
  void* a = alloc->allocate(10 * MiB);
  EXPECT_THROW_WITH(alloc->set_options({.limit_bytes = 4 * MiB}), InvalidArgument,
                    "the new limit is below");
  EXPECT_EQ(alloc->options().limit_bytes, 0u);  // unchanged after the refusal
  alloc->deallocate(a);
  alloc->set_options({.limit_bytes = 4 * MiB});
  EXPECT_EQ(alloc->stats().limit_bytes, 4 * MiB);
}

TEST_F(AllocatorTest, ConcurrentTowersShareOneAllocatorSafely) {
  auto alloc = make(512 * MiB);
  auto worker = [&](int seed) {
    std::vector<void*> held;
    for (int i = 0; i < 2000; ++i) {
      if (held.size() > 8 || (i + seed) % 3 == 0) {
        if (!held.empty()) {
          alloc->deallocate(held.back());
          held.pop_back();
        }
      } else {
        auto* p = static_cast<char*>(alloc->allocate(512 * (1 + (i * 7 + seed) % 50)));
        p[0] = static_cast<char>(seed);
        held.push_back(p);
      }
    }
    for (void* p : held) alloc->deallocate(p);
  };
  std::thread t1(worker, 1), t2(worker, 2);
  t1.join();
  t2.join();
  EXPECT_EQ(alloc->stats().in_use_bytes, 0u);
}

TEST(DeviceAllocator, TensorsDrawFromTheDeviceAllocator) {
  const MemoryStats before = memory_stats(Device::cpu());
  {
    Tensor t = Tensor::empty({1000}, Device::cpu());
    EXPECT_EQ(memory_stats(Device::cpu()).in_use_bytes, before.in_use_bytes + 4096);
  }
  EXPECT_EQ(memory_stats(Device::cpu()).in_use_bytes, before.in_use_bytes);
}

TEST(DeviceAllocator, FormatBytesIsReadable) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3u << 30), "3.00 GiB");
}

}  // namespace
}  // namespace towerlab::testing
