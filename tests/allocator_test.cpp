// The caching allocator, driven through a counting fake backend so that the
// device's memory size, its failures, every raw allocation and every wait are
// under the test's control. The same Allocator class serves host, pinned and CUDA
// memory. Streams are faked by the addresses of local ints, as a cudaStream_t is
// only a handle to the allocator.
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
    requested_.push_back(bytes);
    return std::aligned_alloc(512, (bytes + 511) / 512 * 512);
  }
  void raw_free(void* ptr) noexcept override {
    ++*raw_frees_;
    std::free(ptr);
  }
  std::size_t total_memory() const override { return total_; }
  void synchronize() override { ++device_syncs_; }
  void synchronize_stream(void* stream) noexcept override { stream_syncs_.push_back(stream); }
  void wait_stream(void* waiter, void* owner) override { waits_.emplace_back(waiter, owner); }
  std::string name() const override { return "fake:0"; }
  bool fail_next_ = false;
  // What the allocator asked for, in order; the allocator calls these under its lock.
  int device_syncs_ = 0;
  std::vector<void*> stream_syncs_;
  std::vector<std::pair<void*, void*>> waits_;  // (waiter, owner)
  std::vector<std::size_t> requested_;          // raw_allocate's sizes

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

TEST_F(AllocatorTest, ExactBlocksAreOneSegmentOfTheRequestedSizeEachAndNeverCached) {
  MemoryOptions options;
  options.exact_blocks = true;
  auto alloc = make(64 * MiB, options);
  void* a = alloc->allocate(1000);
  void* b = alloc->allocate(3);
  EXPECT_EQ(backend_->requested_, (std::vector<std::size_t>{1000, 3}));
  EXPECT_EQ(alloc->stats().reserved_bytes, 1003u);
  alloc->deallocate(a);
  EXPECT_EQ(raw_frees_, 1);  // given back at once, not cached
  void* c = alloc->allocate(1000);
  EXPECT_EQ(raw_allocs_, 3);
  alloc->deallocate(b);
  alloc->deallocate(c);
  EXPECT_EQ(raw_frees_, 3);
  EXPECT_EQ(alloc->stats().reserved_bytes, 0u);
  EXPECT_THROW(alloc->allocate(65 * MiB), OutOfMemory);  // the cap still holds
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

// Four 2 MiB blocks of one 8 MiB segment, owned alternately by s1 and s2, all free:
// 8 MiB free in one contiguous range, but no two neighbours with one owner.
class InterleavedOwnersTest : public AllocatorTest {
 protected:
  void SetUp() override {
    alloc_ = make(64 * MiB, {.fraction = 0.125, .allow_growth = false});
    for (int i = 0; i < 4; ++i) blocks_.push_back(alloc_->allocate(2 * MiB, owner(i)));
    for (void* p : blocks_) alloc_->deallocate(p);
    ASSERT_EQ(raw_allocs_, 1);
    ASSERT_EQ(alloc_->stats().stream_handovers, 3u);  // s2's first block, then s1's, s2's
    backend_->waits_.clear();
  }
  void* owner(int i) { return i % 2 == 0 ? static_cast<void*>(&s1_) : &s2_; }
  std::unique_ptr<Allocator> alloc_;
  std::vector<void*> blocks_;
  int s1_ = 0, s2_ = 0, s3_ = 0;
};

TEST_F(InterleavedOwnersTest, AMissMergesNeighboursOfOtherStreamsInsteadOfRunningOut) {
  void* all = alloc_->allocate(8 * MiB, &s1_);
  EXPECT_EQ(all, blocks_[0]);
  // s1 waits for s2's work (its blocks are in the range), once, and never for the device.
  EXPECT_EQ(backend_->waits_, (std::vector<std::pair<void*, void*>>{{&s1_, &s2_}}));
  EXPECT_EQ(backend_->device_syncs_, 0);
  EXPECT_EQ(alloc_->stats().stream_handovers, 4u);
  alloc_->deallocate(all);
  // Control: the range really is full now that it is in use again.
  void* again = alloc_->allocate(8 * MiB, &s2_);
  EXPECT_THROW_WITH(alloc_->allocate(512, &s1_), OutOfMemory, "allow_growth off");
  alloc_->deallocate(again);
}

TEST_F(InterleavedOwnersTest, AMissMovesOnlyTheBlocksItNeeds) {
  void* p = alloc_->allocate(2 * MiB, &s3_);
  EXPECT_EQ(p, blocks_[0]);  // best fit: one block, the first of the smallest
  EXPECT_EQ(backend_->waits_, (std::vector<std::pair<void*, void*>>{{&s3_, &s1_}}));
  // s1 keeps its other block and s2 both of its own: they are reused with no wait.
  void* q = alloc_->allocate(2 * MiB, &s1_);
  void* r = alloc_->allocate(2 * MiB, &s2_);
  void* t = alloc_->allocate(2 * MiB, &s2_);
  EXPECT_EQ(q, blocks_[2]);
  EXPECT_EQ(r, blocks_[1]);
  EXPECT_EQ(t, blocks_[3]);
  EXPECT_EQ(backend_->waits_.size(), 1u);
  EXPECT_EQ(backend_->device_syncs_, 0);
  for (void* b : {p, q, r, t}) alloc_->deallocate(b);
}

TEST_F(AllocatorTest, AtTheCapOneStreamTakesAnothersCacheAndReleaseFreesTheMixedSegment) {
  auto alloc = make(64 * MiB, {.limit_bytes = 2 * MiB});
  int s1 = 0, s2 = 0;
  void* a = alloc->allocate(MiB, &s1);  // one 2 MiB segment; its other half is s1's
  void* b = alloc->allocate(MiB, &s2);  // no room for a segment: takes that half
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + MiB);
  EXPECT_EQ(backend_->waits_, (std::vector<std::pair<void*, void*>>{{&s2, &s1}}));
  alloc->deallocate(a);
  alloc->deallocate(b);
  // Two free blocks of two owners: the segment is still entirely free.
  alloc->release_cached();
  EXPECT_EQ(alloc->stats().reserved_bytes, 0u);
  EXPECT_EQ(raw_frees_, 1);
  EXPECT_EQ(backend_->device_syncs_, 1);  // giving memory back waits for every stream
}

TEST_F(AllocatorTest, AReleasedStreamsBlocksPassToTheNextStreamWithoutAWait) {
  auto alloc = make(64 * MiB, {.limit_bytes = 2 * MiB});
  int s1 = 0, s2 = 0, s3 = 0;
  void* freed = alloc->allocate(MiB, &s1);
  void* live = alloc->allocate(MiB / 2, &s1);
  alloc->deallocate(freed);
  // Control: before the release, another stream must wait for s1's work.
  void* early = alloc->allocate(MiB, &s2);
  EXPECT_EQ(early, freed);
  EXPECT_EQ(backend_->waits_.size(), 1u);
  alloc->deallocate(early);  // now s2's
  void* s1_again = alloc->allocate(MiB, &s1);
  EXPECT_EQ(s1_again, freed);
  EXPECT_EQ(backend_->waits_.size(), 2u);
  alloc->deallocate(s1_again);

  // What ~Stream does before cudaStreamDestroy: after it, a new stream that gets the
  // same handle, or any other stream, takes s1's blocks with nothing left to wait for.
  alloc->release_stream(&s1);
  EXPECT_EQ(backend_->stream_syncs_, std::vector<void*>{&s1});
  void* reused = alloc->allocate(MiB, &s3);
  EXPECT_EQ(reused, freed);
  EXPECT_EQ(backend_->waits_.size(), 2u);
  // A block still in use at the release belongs to no stream either once freed.
  alloc->deallocate(live);
  void* after = alloc->allocate(MiB / 2, &s2);
  EXPECT_EQ(after, live);
  EXPECT_EQ(backend_->waits_.size(), 2u);
  EXPECT_EQ(backend_->device_syncs_, 0);
  alloc->deallocate(reused);
  alloc->deallocate(after);
  EXPECT_EQ(alloc->stats().in_use_bytes, 0u);
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

// A live block would be given back the other way (an exact block freed into a
// segment, or a piece of a segment freed alone as if it were its own).
TEST_F(AllocatorTest, ExactBlocksChangeOnlyWhileNothingIsAllocated) {
  auto alloc = make(64 * MiB);
  void* a = alloc->allocate(1000);
  EXPECT_THROW_WITH(alloc->set_options({.exact_blocks = true}), InvalidArgument,
                    "exact_blocks can change only while nothing is allocated (1 blocks");
  EXPECT_FALSE(alloc->options().exact_blocks);
  EXPECT_NO_THROW(alloc->set_options({.limit_bytes = 32 * MiB}));  // other options still may
  alloc->deallocate(a);
  alloc->set_options({.exact_blocks = true});
  void* b = alloc->allocate(1000);
  EXPECT_THROW_WITH(alloc->set_options({}), InvalidArgument, "exact_blocks can change only");
  alloc->deallocate(b);
  EXPECT_NO_THROW(alloc->set_options({}));
  EXPECT_EQ(alloc->stats().in_use_bytes, 0u);
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

// Named for the ThreadSanitizer stage, which runs the Concurrency tests.
using AllocatorConcurrencyTest = AllocatorTest;

TEST_F(AllocatorConcurrencyTest, TwoStreamsWithoutGrowthHandBlocksOverSafely) {
  // 4 MiB reserved once; each thread holds at most 8 blocks of at most 64 KiB, so
  // some free range always holds a request, and the two streams keep taking each
  // other's free blocks. A block handed out twice would fail the pattern check.
  auto alloc = make(64 * MiB, {.limit_bytes = 4 * MiB, .allow_growth = false});
  int streams[2] = {0, 0};
  auto worker = [&](int id) {
    std::vector<std::pair<unsigned char*, std::size_t>> held;
    for (int i = 0; i < 3000; ++i) {
      if (held.size() >= 8 || (i * 5 + id) % 3 == 0) {
        if (held.empty()) continue;
        const auto victim = held.begin() + i % static_cast<int>(held.size());
        auto [p, n] = *victim;
        for (std::size_t k = 0; k < n; k += 509) ASSERT_EQ(p[k], static_cast<unsigned char>(id));
        alloc->deallocate(p);
        held.erase(victim);
      } else {
        const std::size_t n = 512 * (1 + static_cast<std::size_t>(i * 7 + id) % 128);
        auto* p = static_cast<unsigned char*>(alloc->allocate(n, &streams[id]));
        std::memset(p, id, n);
        held.emplace_back(p, n);
      }
    }
    for (auto [p, n] : held) alloc->deallocate(p);
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  const MemoryStats s = alloc->stats();
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.segment_allocations, 1u);
  EXPECT_GT(s.stream_handovers, 0u);  // the path under test was taken
  EXPECT_EQ(backend_->device_syncs_, 0);
}

TEST(DeviceAllocator, TensorsDrawFromTheDeviceAllocator) {
  const MemoryStats before = memory_stats(Device::cpu());
  {
    Tensor t = Tensor::empty({1000}, Device::cpu());
    EXPECT_EQ(memory_stats(Device::cpu()).in_use_bytes, before.in_use_bytes + 4096);
  }
  EXPECT_EQ(memory_stats(Device::cpu()).in_use_bytes, before.in_use_bytes);
}

TEST(DeviceAllocator, MemoryOptionsAreOneProcessWideSetting) {
  const MemoryOptions before = memory_options(Device::cpu());
  set_memory_options(Device::cpu(), {.fraction = 0.5, .limit_bytes = std::size_t{1} << 30});
  // What every tensor on the device allocates under.
  EXPECT_EQ(device_allocator(Device::cpu()).options().limit_bytes, std::size_t{1} << 30);
  EXPECT_EQ(memory_options(Device::cpu()).fraction, 0.5);
  EXPECT_THROW_WITH(set_memory_options(Device::cpu(), {.fraction = 0.0}), InvalidArgument,
                    "fraction must be in (0, 1], got 0");
  EXPECT_EQ(memory_options(Device::cpu()).limit_bytes, std::size_t{1} << 30);  // unchanged
  set_memory_options(Device::cpu(), before);
  EXPECT_EQ(memory_options(Device::cpu()).limit_bytes, before.limit_bytes);
}

TEST(DeviceAllocator, FormatBytesIsReadable) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3u << 30), "3.00 GiB");
}

}  // namespace
}  // namespace towerlab::testing
