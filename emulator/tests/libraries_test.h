// What the emulated libraries' tests share (libraries_cublas_test.cpp,
// libraries_cub_test.cpp, libraries_nccl_test.cpp, libraries_nccl_communicator_test.cpp):
// four emulated devices, random values, copies through pinned host memory, ranks as
// threads, and the fixture that resets the emulator around each test.
//
// By hand (the emulator's sources and these files, nothing of towerlab), from the root:
//   g++ -std=c++20 -O1 -g -fsanitize=thread -Iemulator/include emulator/src/*.cpp
//       emulator/tests/libraries_*_test.cpp -lgtest -lgtest_main -lpthread
// and the same with -fsanitize=address,undefined.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "tlemu/emulator.h"

namespace libraries_test {

// Four devices unless the environment says otherwise: read by the first CUDA call,
// which comes after every static initializer.
inline const bool kFourDevices = [] {
  setenv("TOWERLAB_EMULATED_GPUS", "4", 0);
  return true;
}();

using Clock = std::chrono::steady_clock;

inline int devices() {
  int n = 0;
  EXPECT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  return n;
}

inline std::vector<float> random_floats(std::size_t n, unsigned seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Copies go through pinned host memory: the emulator's cudaMemcpy refuses pageable
// host memory at an address that once held a device block (see the report that came
// with this file), which the host allocator hands out again after cudaFree.
template <typename T>
struct Pinned {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Pinned(std::size_t count) : n(count) {
    void* raw = nullptr;
    EXPECT_EQ(cudaMallocHost(&raw, std::max<std::size_t>(n, 1) * sizeof(T)), cudaSuccess);
    p = static_cast<T*>(raw);
  }
  explicit Pinned(const std::vector<T>& v) : Pinned(v.size()) {
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
  }
  ~Pinned() { cudaFreeHost(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  std::vector<T> vector() const { return std::vector<T>(p, p + n); }
};

// dst (device memory) := host, on the current device's legacy stream; returns once done.
template <typename T>
void upload(T* dst, const std::vector<T>& host) {
  if (host.empty()) return;
  Pinned<T> staged(host);
  EXPECT_EQ(cudaMemcpy(dst, staged.p, host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
}

template <typename T>
T* device_copy(const std::vector<T>& host, std::size_t min_elements = 1) {
  void* p = nullptr;
  const std::size_t bytes = std::max(host.size(), min_elements) * sizeof(T);
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  upload(static_cast<T*>(p), host);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> host_copy(const T* p, std::size_t n) {
  if (n == 0) return {};
  Pinned<T> staged(n);
  EXPECT_EQ(cudaMemcpy(staged.p, p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return staged.vector();
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// Runs fn(rank) on one thread per rank and joins them.
inline void run_threads(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Skips the test where fewer than n emulated devices exist (one a rank).
#define NEED_DEVICES(n)                                                      \
  do {                                                                       \
    if (libraries_test::devices() < (n))                                     \
      GTEST_SKIP() << "needs " << (n) << " emulated devices (one per rank)"; \
  } while (0)

class Libraries : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    tlemu::reset();
  }
  void TearDown() override {
    tlemu::reset();
    tlemu::set_nccl_timeout(std::chrono::seconds(60));
    cudaSetDevice(0);
  }
};

}  // namespace libraries_test
