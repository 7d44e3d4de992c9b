// The emulated CUDA runtime against what CUDA documents: devices, errors (returned
// and sticky), memory and its checks, copies, streams and events and the ordering
// they do and do not give, kernels (barriers, warps, shared memory, launch
// configurations) and the fault injection the towerlab tests use. Written in CUDA
// syntax, so the launches go through the same rewrite as towerlab's kernels.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "tlemu/emulator.h"

namespace {

using namespace std::chrono_literals;

// Every test starts from clean devices: no sticky error, no pending fault.
class Emulator : public ::testing::Test {
 protected:
  void SetUp() override {
    tlemu::reset();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  void TearDown() override { tlemu::reset(); }
};

__global__ void iota_kernel(int n, float* y, float start) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = start + static_cast<float>(i);
}

__global__ void add_kernel(int n, float* y, const float* x) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] += x[i];
}

// One block: out[0] = sum of x, through warp shuffles and shared memory.
template <int kBlock>
__global__ void block_sum_kernel(int n, const float* x, float* out) {
  __shared__ float warp_sums[kBlock / 32];
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += kBlock) v += x[i];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kBlock / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x == 0) *out = v;
  }
}

std::vector<float> to_host(const float* device_ptr, int n) {
  std::vector<float> host(static_cast<std::size_t>(n));
  EXPECT_EQ(cudaMemcpy(host.data(), device_ptr, sizeof(float) * n, cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

float* device_floats(int n) {
  float* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, sizeof(float) * n), cudaSuccess);
  return p;
}

// --- devices and errors ------------------------------------------------------------------

TEST_F(Emulator, DevicesHaveAnH100sPropertiesAndSayTheyAreEmulated) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, tlemu::config().devices);
  EXPECT_GE(count, 1);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, count - 1), cudaSuccess);
  EXPECT_NE(std::strstr(prop.name, "emulated"), nullptr) << prop.name;
  EXPECT_EQ(prop.multiProcessorCount, tlemu::config().multiprocessors);
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_EQ(prop.major, 9);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  EXPECT_EQ(sms, prop.multiProcessorCount);
}

TEST_F(Emulator, ABadCallReturnsItsErrorAndKeepsItUntilGetLastError) {
  int count = 0;
  cudaGetDeviceCount(&count);
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared: it was not sticky
  EXPECT_STREQ(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress");
}

TEST_F(Emulator, TheCurrentDeviceBelongsToEachHostThread) {
  int count = 0;
  cudaGetDeviceCount(&count);
  if (count < 2) GTEST_SKIP() << "needs two emulated devices (TOWERLAB_EMULATED_GPUS >= 2)";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  int other = -1;
  std::thread([&] { cudaGetDevice(&other); }).join();
  EXPECT_EQ(other, 0);
  int mine = -1;
  cudaGetDevice(&mine);
  EXPECT_EQ(mine, 1);
}

// --- memory ------------------------------------------------------------------------------

TEST_F(Emulator, AllocationsCountAgainstTheDevicesMemoryCap) {
  std::size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  EXPECT_EQ(total, tlemu::config().memory_bytes);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  std::size_t free_after = 0;
  cudaMemGetInfo(&free_after, &total);
  EXPECT_EQ(free_before - free_after, std::size_t{1} << 20);

  tlemu::set_memory_limit(0, (std::size_t{1} << 20) + 1000);
  void* q = nullptr;
  EXPECT_EQ(cudaMalloc(&q, 2000), cudaErrorMemoryAllocation);
  EXPECT_EQ(q, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaMalloc(&q, 1000), cudaSuccess);  // what fits still does
  EXPECT_EQ(cudaFree(q), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(Emulator, AnInjectedAllocationFailureHitsExactlyTheNthAllocation) {
  tlemu::fail_allocation(2, 0);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  EXPECT_EQ(cudaMalloc(&a, 64), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&b, 64), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaMalloc(&c, 64), cudaSuccess);
  cudaGetLastError();
  cudaFree(a);
  cudaFree(c);
}

TEST_F(Emulator, AnInjectedRunOfAllocationFailuresHitsTheNthAndTheOnesRightAfterIt) {
  tlemu::fail_allocation(2, 1, 3);
  void* p[6] = {};
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  const cudaError_t expected[6] = {cudaSuccess,
                                   cudaErrorMemoryAllocation,
                                   cudaErrorMemoryAllocation,
                                   cudaErrorMemoryAllocation,
                                   cudaSuccess,
                                   cudaSuccess};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(cudaMalloc(&p[i], 64), expected[i]) << "allocation " << i;
  cudaGetLastError();
  for (void* q : p) cudaFree(q);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* other = nullptr;  // device 0 was never named
  EXPECT_EQ(cudaMalloc(&other, 64), cudaSuccess);
  cudaFree(other);
}

TEST_F(Emulator, CopiesAreCheckedAgainstTheAllocationsTheyTouch) {
  float* d = device_floats(10);
  std::vector<float> h(20, 1.0f);
  EXPECT_EQ(cudaMemcpy(d, h.data(), sizeof(float) * 10, cudaMemcpyHostToDevice), cudaSuccess);
  // One float too many: past the allocation's end.
  EXPECT_EQ(cudaMemcpy(d, h.data(), sizeof(float) * 11, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  // The kind contradicts the pointers.
  EXPECT_EQ(cudaMemcpy(d, h.data(), sizeof(float) * 10, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  // Interior pointers are not allocations.
  EXPECT_EQ(cudaFree(d + 1), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFree(d), cudaSuccess);
  // Freed memory is not copied from.
  EXPECT_EQ(cudaMemcpy(h.data(), d, sizeof(float) * 10, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_F(Emulator, APageableSourceIsReadBeforeTheAsyncCopyReturns) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  tlemu::delay_stream(s, 50ms);
  float* d = device_floats(4);
  std::vector<float> h = {1, 2, 3, 4};
  ASSERT_EQ(cudaMemcpyAsync(d, h.data(), sizeof(float) * 4, cudaMemcpyHostToDevice, s),
            cudaSuccess);
  h.assign(4, -1.0f);  // CUDA staged the old values: the copy must not see these
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(to_host(d, 4), (std::vector<float>{1, 2, 3, 4}));
  cudaFree(d);
  cudaStreamDestroy(s);
}

// --- streams and events ------------------------------------------------------------------

TEST_F(Emulator, AnEventOrdersAConsumerStreamAfterAProducerStream) {
  cudaStream_t producer, consumer;
  cudaEvent_t ready;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  const int n = 1000;
  float* x = device_floats(n);
  float* sum = device_floats(1);
  tlemu::delay_stream(producer, 30ms);  // the consumer would overtake it without the event
  iota_kernel<<<4, 128, 0, producer>>>(n, x, 1.0f);
  ASSERT_EQ(cudaEventRecord(ready, producer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer, ready, 0), cudaSuccess);
  block_sum_kernel<256><<<1, 256, 0, consumer>>>(n, x, sum);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  EXPECT_EQ(to_host(sum, 1)[0], n * (n + 1) / 2.0f);
  cudaFree(x);
  cudaFree(sum);
  cudaEventDestroy(ready);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

TEST_F(Emulator, AnEventIsNotReadyUntilItsStreamReachesIt) {
  cudaStream_t s;
  cudaEvent_t start, end;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(start), cudaSuccess);  // never recorded: nothing to wait for
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  tlemu::delay_stream(s, 40ms);
  ASSERT_EQ(cudaEventRecord(end, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(end), cudaErrorNotReady);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(end), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 35.0f);
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaStreamDestroy(s);
}

TEST_F(Emulator, TheLegacyDefaultStreamWaitsForBlockingStreamsButNotForNonBlockingOnes) {
  cudaStream_t blocking, non_blocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t marker;
  ASSERT_EQ(cudaEventCreate(&marker), cudaSuccess);

  tlemu::delay_stream(blocking, 40ms);
  ASSERT_EQ(cudaEventRecord(marker, blocking), cudaSuccess);
  // A synchronous copy runs on the legacy stream, after the blocking stream's work.
  float* d = device_floats(1);
  const float one = 1.0f;
  ASSERT_EQ(cudaMemcpy(d, &one, sizeof one, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(marker), cudaSuccess);

  tlemu::delay_stream(non_blocking, 60ms);
  ASSERT_EQ(cudaEventRecord(marker, non_blocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, &one, sizeof one, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(marker), cudaErrorNotReady);  // nothing waited for it
  ASSERT_EQ(cudaEventSynchronize(marker), cudaSuccess);
  cudaFree(d);
  cudaEventDestroy(marker);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(non_blocking);
}

TEST_F(Emulator, KernelsOnTwoStreamsKeepTheirOwnSharedMemory) {
  // Many blocks on two streams at once: each block's __shared__ array is its own.
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  const int n = 3000;
  float *x = device_floats(n), *y = device_floats(n), *sx = device_floats(1),
        *sy = device_floats(1);
  iota_kernel<<<3, 256, 0, a>>>(n, x, 0.0f);
  iota_kernel<<<3, 256, 0, b>>>(n, y, 1.0f);
  for (int i = 0; i < 20; ++i) {
    block_sum_kernel<128><<<1, 128, 0, a>>>(n, x, sx);
    block_sum_kernel<128><<<1, 128, 0, b>>>(n, y, sy);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(to_host(sx, 1)[0], n * (n - 1) / 2.0f);
  EXPECT_EQ(to_host(sy, 1)[0], n * (n + 1) / 2.0f);
  for (float* p : {x, y, sx, sy}) cudaFree(p);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// --- kernels -----------------------------------------------------------------------------

// Threads past n return before the barrier; the rest must not wait for them.
__global__ void early_exit_kernel(int n, float* y) {
  __shared__ float tile[64];
  const int t = threadIdx.x;
  if (t >= n) return;
  tile[t] = static_cast<float>(t);
  __syncthreads();
  y[t] = tile[n - 1 - t];
}

TEST_F(Emulator, ThreadsThatReturnedNoLongerCountAtTheBarrier) {
  float* y = device_floats(40);
  early_exit_kernel<<<1, 64>>>(40, y);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> h = to_host(y, 40);
  for (int t = 0; t < 40; ++t) EXPECT_EQ(h[t], 39 - t);
  cudaFree(y);
}

__global__ void shared_starts_undefined_kernel(float* y) {
  __shared__ float tile[32];
  if (threadIdx.x == 0) y[blockIdx.x] = tile[blockIdx.x];  // read before any write
  __syncthreads();
  tile[threadIdx.x] = 1.0f;
}

TEST_F(Emulator, SharedMemoryStartsEachBlockAsNaN) {
  float* y = device_floats(2);
  shared_starts_undefined_kernel<<<2, 32>>>(y);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> h = to_host(y, 2);
  EXPECT_TRUE(std::isnan(h[0]));
  EXPECT_TRUE(std::isnan(h[1])) << "the second block saw the first block's shared memory";
  cudaFree(y);
}

// --- asynchronous copies (cuda_pipeline.h) ----------------------------------------------

// A three-stage pipeline as a GEMM uses it: chunk c of x (32 threads x 4 floats,
// 16-byte copies) goes to buffer c % 3 two chunks ahead of its use, and each thread
// reads what its neighbour copied (so the barrier after the wait is needed too).
__global__ void pipelined_copy_kernel(const float* x, float* y, int chunks) {
  __shared__ __align__(16) float buffer[3][128];
  const int t = threadIdx.x;
  for (int c = 0; c < 2; ++c) {
    if (c < chunks) __pipeline_memcpy_async(&buffer[c][t * 4], x + c * 128 + t * 4, 16);
    __pipeline_commit();
  }
  for (int c = 0; c < chunks; ++c) {
    __pipeline_wait_prior(1);
    __syncthreads();
    if (c + 2 < chunks)
      __pipeline_memcpy_async(&buffer[(c + 2) % 3][t * 4], x + (c + 2) * 128 + t * 4, 16);
    __pipeline_commit();
    const int from = (t + 1) % 32;
    for (int e = 0; e < 4; ++e) y[c * 128 + t * 4 + e] = buffer[c % 3][from * 4 + e];
  }
}

TEST_F(Emulator, PipelinedAsyncCopiesArriveByTheirWait) {
  constexpr int kChunks = 7;
  std::vector<float> h(kChunks * 128);
  std::iota(h.begin(), h.end(), 1.0f);
  float* x = device_floats(kChunks * 128);
  float* y = device_floats(kChunks * 128);
  ASSERT_EQ(cudaMemcpy(x, h.data(), sizeof(float) * h.size(), cudaMemcpyHostToDevice), cudaSuccess);
  pipelined_copy_kernel<<<1, 32>>>(x, y, kChunks);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> out = to_host(y, kChunks * 128);
  for (int c = 0; c < kChunks; ++c) {
    for (int i = 0; i < 128; ++i)
      ASSERT_EQ(out[c * 128 + i], h[c * 128 + (i + 4) % 128]) << "chunk " << c << " float " << i;
  }
  cudaFree(x);
  cudaFree(y);
}

// y[0..3]: a 16-byte copy zero-filling its last 8; y[4]: a 4-byte copy of nothing.
__global__ void zero_fill_kernel(const float* x, float* y) {
  __shared__ __align__(16) float s[8];
  __pipeline_memcpy_async(&s[0], x, 16, 8);
  __pipeline_memcpy_async(&s[4], x, 4, 4);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  for (int e = 0; e < 5; ++e) y[e] = s[e];
}

TEST_F(Emulator, AnAsyncCopyZeroFillsItsTail) {
  const float h[4] = {1, 2, 3, 4};
  float* x = device_floats(4);
  float* y = device_floats(5);
  ASSERT_EQ(cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
  zero_fill_kernel<<<1, 1>>>(x, y);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(to_host(y, 5), (std::vector<float>{1, 2, 0, 0, 0}));
  cudaFree(x);
  cudaFree(y);
}

// y[0]: the destination before any wait; y[1], y[2]: batches 0 and 1 after waiting
// for all but the newest; y[3]: batch 1 after waiting for all; y[4]: an uncommitted
// copy after waiting for all.
__global__ void read_before_wait_kernel(const float* x, float* y) {
  __shared__ float s[3];
  __pipeline_memcpy_async(&s[0], x, 4);
  __pipeline_commit();
  y[0] = s[0];
  __pipeline_memcpy_async(&s[1], x + 1, 4);
  __pipeline_commit();
  __pipeline_wait_prior(1);
  y[1] = s[0];
  y[2] = s[1];
  __pipeline_memcpy_async(&s[2], x + 2, 4);
  __pipeline_wait_prior(0);
  y[3] = s[1];
  y[4] = s[2];
}

TEST_F(Emulator, AnAsyncCopysDestinationIsNaNUntilItsBatchIsWaitedFor) {
  const float h[3] = {5, 6, 7};
  float* x = device_floats(3);
  float* y = device_floats(5);
  ASSERT_EQ(cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
  read_before_wait_kernel<<<1, 1>>>(x, y);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> out = to_host(y, 5);
  EXPECT_TRUE(std::isnan(out[0])) << "read before its wait";
  EXPECT_EQ(out[1], 5.0f);
  EXPECT_TRUE(std::isnan(out[2])) << "the newest batch completed by wait_prior(1)";
  EXPECT_EQ(out[3], 6.0f);
  EXPECT_TRUE(std::isnan(out[4])) << "an uncommitted copy completed by a wait";
  cudaFree(x);
  cudaFree(y);
}

__global__ void warp_ops_kernel(int* out) {
  const int lane = threadIdx.x % 32;
  out[0 * 64 + threadIdx.x] = __shfl_sync(0xffffffffu, lane * 10, 3);
  out[1 * 64 + threadIdx.x] = __shfl_down_sync(0xffffffffu, lane, 4, 16);
  out[2 * 64 + threadIdx.x] = __shfl_up_sync(0xffffffffu, lane, 1);
  out[3 * 64 + threadIdx.x] = __shfl_xor_sync(0xffffffffu, lane, 8, 16);
  out[4 * 64 + threadIdx.x] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
  out[5 * 64 + threadIdx.x] =
      __any_sync(0xffffffffu, lane == 31) + 2 * __all_sync(0xffffffffu, lane < 31);
}

TEST_F(Emulator, ShufflesAndVotesFollowCudasLaneRules) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(int) * 6 * 64), cudaSuccess);
  warp_ops_kernel<<<1, 64>>>(d);
  std::vector<int> h(6 * 64);
  ASSERT_EQ(cudaMemcpy(h.data(), d, sizeof(int) * h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  unsigned ballot = 0;
  for (int lane = 0; lane < 32; lane += 3) ballot |= 1u << lane;
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    EXPECT_EQ(h[0 * 64 + t], 30);
    EXPECT_EQ(h[1 * 64 + t], lane % 16 + 4 < 16 ? lane + 4 : lane);  // past the group: own value
    EXPECT_EQ(h[2 * 64 + t], lane >= 1 ? lane - 1 : lane);
    EXPECT_EQ(h[3 * 64 + t], lane ^ 8);
    EXPECT_EQ(static_cast<unsigned>(h[4 * 64 + t]), ballot);
    EXPECT_EQ(h[5 * 64 + t], 1);
  }
  cudaFree(d);
}

TEST_F(Emulator, ABadLaunchConfigurationIsTheNextLastError) {
  float* y = device_floats(1);
  iota_kernel<<<1, 2048>>>(1, y, 0.0f);  // more than 1024 threads
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  iota_kernel<<<0, 32>>>(1, y, 0.0f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // not sticky: the device is fine
  cudaFree(y);
}

TEST_F(Emulator, ALaunchOnAnotherDevicesStreamIsRefused) {
  int count = 0;
  cudaGetDeviceCount(&count);
  if (count < 2) GTEST_SKIP() << "needs two emulated devices";
  cudaStream_t s1;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  float* y = device_floats(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  iota_kernel<<<1, 32, 0, s1>>>(1, y, 0.0f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  cudaStreamDestroy(s1);
  cudaFree(y);
}

// --- illegal addresses and peer access ------------------------------------------------

TEST_F(Emulator, AKernelGivenAnotherDevicesMemoryWithoutPeerAccessFaultsStickily) {
  int count = 0;
  cudaGetDeviceCount(&count);
  if (count < 2) GTEST_SKIP() << "needs two emulated devices";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  float* on1 = device_floats(8);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  iota_kernel<<<1, 32>>>(8, on1, 0.0f);  // the launch is fine; the kernel faults when it runs
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  // Sticky: every later call on cuda:0 reports it; cuda:1 is unharmed.
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 4), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(tlemu::sticky_error(1), cudaSuccess);

  tlemu::reset();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
  cudaGetLastError();
  iota_kernel<<<1, 32>>>(8, on1, 5.0f);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(to_host(on1, 8)[7], 12.0f);
  cudaFree(on1);
}

TEST_F(Emulator, RefusedPeerAccessLeavesPeerCopiesWorking) {
  int count = 0;
  cudaGetDeviceCount(&count);
  if (count < 2) GTEST_SKIP() << "needs two emulated devices";
  tlemu::set_peer_access_allowed(false);
  int can = 1;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
  EXPECT_EQ(can, 0);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessUnsupported);
  cudaGetLastError();
  float* on0 = device_floats(4);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  float* on1 = device_floats(4);
  iota_kernel<<<1, 32>>>(4, on1, 3.0f);
  ASSERT_EQ(cudaMemcpyPeerAsync(on0, 0, on1, 1, sizeof(float) * 4, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(to_host(on0, 4), (std::vector<float>{3, 4, 5, 6}));
  // Naming the wrong device for a pointer is an argument error.
  EXPECT_EQ(cudaMemcpyPeerAsync(on0, 1, on1, 1, sizeof(float) * 4, 0), cudaErrorInvalidValue);
  cudaGetLastError();
  cudaFree(on1);
  cudaSetDevice(0);
  cudaFree(on0);
}

TEST_F(Emulator, AKernelGivenHostOrFreedMemoryFaults) {
  std::vector<float> host(8);
  iota_kernel<<<1, 32>>>(8, host.data(), 0.0f);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  tlemu::reset();
  cudaSetDevice(0);
  float* freed = device_floats(8);
  cudaFree(freed);
  iota_kernel<<<1, 32>>>(8, freed, 0.0f);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
}

TEST_F(Emulator, PinnedHostMemoryIsReachableFromKernels) {
  float* pinned = nullptr;
  ASSERT_EQ(
      cudaHostAlloc(reinterpret_cast<void**>(&pinned), sizeof(float) * 8, cudaHostAllocPortable),
      cudaSuccess);
  iota_kernel<<<1, 32>>>(8, pinned, 1.0f);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(pinned[7], 8.0f);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_F(Emulator, AnInjectedKernelFaultIsStickyAndLaterKernelsDoNotRun) {
  float* y = device_floats(4);
  ASSERT_EQ(cudaMemset(y, 0, sizeof(float) * 4), cudaSuccess);
  tlemu::fault_kernel(2, 0);
  iota_kernel<<<1, 32>>>(4, y, 1.0f);  // runs
  iota_kernel<<<1, 32>>>(4, y, 2.0f);  // faults
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  EXPECT_EQ(tlemu::sticky_error(0), cudaErrorIllegalAddress);
  tlemu::reset();
  cudaSetDevice(0);
  EXPECT_EQ(to_host(y, 4)[3], 4.0f);  // the first kernel's values
  cudaFree(y);
}

TEST_F(Emulator, CountersSayWhatRan) {
  const tlemu::Counters before = tlemu::counters();
  float* y = device_floats(100);
  iota_kernel<<<2, 64>>>(100, y, 0.0f);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const tlemu::Counters after = tlemu::counters();
  EXPECT_EQ(after.kernels - before.kernels, 1u);
  EXPECT_EQ(after.blocks - before.blocks, 2u);
  EXPECT_EQ(after.threads - before.threads, 128u);
  cudaFree(y);
}

}  // namespace
