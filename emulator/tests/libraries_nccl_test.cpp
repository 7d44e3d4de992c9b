// The emulated NCCL: communicators, the all-reduce and its two halves
// (reduce-scatter, all-gather) with ranks as threads of this binary, each on an
// emulated device of its own; their bits, errors, timeouts and misuse.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "libraries_test.h"

namespace {

using namespace libraries_test;

// Runs fn(rank) on one thread per rank and joins them.
void run_threads(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// What one rank saw.
struct RankResult {
  ncclResult_t init = ncclInternalError, call = ncclInternalError, async = ncclInternalError;
  std::string last;
  std::vector<float> values;
  cudaError_t sync = cudaErrorUnknown;
};

std::vector<float> rank_values(int rank, std::size_t n) {
  return random_floats(n, 100 + unsigned(rank), -10.0f, 10.0f);
}

// Every rank (a thread on cuda:rank) all-reduces `counts[rank]` floats of
// rank_values(rank) and reports; ranks with count < 0 join but make no call.
std::vector<RankResult> all_reduce_on_threads(int ranks, const std::vector<long>& counts,
                                              bool in_place) {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<RankResult> results(static_cast<std::size_t>(ranks));
  // A rank that makes no call keeps its communicator until the others are done:
  // destroying it would tell them at once that it is gone.
  const int callers =
      int(std::count_if(counts.begin(), counts.end(), [](long c) { return c >= 0; }));
  std::atomic<int> finished{0};
  run_threads(ranks, [&](int rank) {
    RankResult& out = results[std::size_t(rank)];
    EXPECT_EQ(cudaSetDevice(rank), cudaSuccess);
    cudaStream_t stream;
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    const long count = counts[std::size_t(rank)];
    const auto values = rank_values(rank, std::size_t(std::max(count, 1L)));
    float* send = nullptr;
    float* recv = nullptr;
    EXPECT_EQ(cudaMalloc(&send, values.size() * 4), cudaSuccess);
    // Staged through the stream, so the all-reduce on another rank's worker reads
    // what this rank's worker wrote: ordered by the collective alone.
    Pinned<float> staged(values);
    EXPECT_EQ(cudaMemcpyAsync(send, staged.p, values.size() * 4, cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    if (in_place) {
      recv = send;
    } else {
      EXPECT_EQ(cudaMalloc(&recv, values.size() * 4), cudaSuccess);
      EXPECT_EQ(cudaMemsetAsync(recv, 0, values.size() * 4, stream), cudaSuccess);
    }
    ncclComm_t comm = nullptr;
    out.init = ncclCommInitRank(&comm, ranks, id, rank);
    if (out.init != ncclSuccess) return;
    out.call =
        count < 0 ? ncclSuccess
                  : ncclAllReduce(send, recv, std::size_t(count), ncclFloat, ncclSum, comm, stream);
    out.sync = cudaStreamSynchronize(stream);
    if (count >= 0) {
      ++finished;
    } else {
      while (finished < callers) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    out.values = host_copy(recv, values.size());
    EXPECT_EQ(ncclCommGetAsyncError(comm, &out.async), ncclSuccess);
    out.last = ncclGetLastError(comm);
    if (out.async == ncclSuccess) {
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    } else {
      EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    }
    cudaFree(send);
    if (!in_place) cudaFree(recv);
    cudaStreamDestroy(stream);
  });
  return results;
}

#define NEED_DEVICES(n)                                                                         \
  do {                                                                                          \
    if (devices() < (n)) GTEST_SKIP() << "needs " << (n) << " emulated devices (one per rank)"; \
  } while (0)

TEST_F(Libraries, AllReduceGivesEveryRankTheSameBitsInRankOrder) {
  NEED_DEVICES(2);  // and 3 and 4 ranks where there are devices for them
  for (int ranks : {2, 3, 4}) {
    if (devices() < ranks) continue;
    for (bool in_place : {false, true}) {
      const std::size_t n = 1001;
      const auto results =
          all_reduce_on_threads(ranks, std::vector<long>(std::size_t(ranks), long(n)), in_place);
      // The sum in rank order, in float: what every rank must hold, bit for bit.
      std::vector<float> expected = rank_values(0, n);
      for (int r = 1; r < ranks; ++r) {
        const auto v = rank_values(r, n);
        for (std::size_t i = 0; i < n; ++i) expected[i] += v[i];
      }
      for (int r = 0; r < ranks; ++r) {
        const RankResult& got = results[std::size_t(r)];
        EXPECT_EQ(got.init, ncclSuccess) << ranks << " ranks, rank " << r;
        EXPECT_EQ(got.call, ncclSuccess);
        EXPECT_EQ(got.sync, cudaSuccess);
        EXPECT_EQ(got.async, ncclSuccess) << got.last;
        EXPECT_TRUE(same_bits(got.values, expected)) << ranks << " ranks, rank " << r;
      }
    }
  }
}

TEST_F(Libraries, AllReduceWithMismatchedCountsFailsOnEveryRank) {
  NEED_DEVICES(2);
  const auto results = all_reduce_on_threads(2, {12, 10}, false);
  for (int r = 0; r < 2; ++r) {
    const RankResult& got = results[std::size_t(r)];
    EXPECT_EQ(got.call, ncclSuccess);
    EXPECT_EQ(got.sync, cudaSuccess);  // no sticky CUDA error
    EXPECT_EQ(got.async, ncclInvalidUsage);
    EXPECT_NE(got.last.find("rank 1 called ncclAllReduce with count 10, rank 0 with count 12"),
              std::string::npos)
        << got.last;
    for (float x : got.values) EXPECT_EQ(x, 0.0f);  // nothing written
  }
  EXPECT_EQ(tlemu::sticky_error(0), cudaSuccess);
  EXPECT_EQ(tlemu::sticky_error(1), cudaSuccess);
}

TEST_F(Libraries, AllReduceReportsARankThatNeverArrives) {
  NEED_DEVICES(2);
  const int ranks = std::min(devices(), 3);  // the last makes no call
  tlemu::set_nccl_timeout(std::chrono::milliseconds(300));
  std::vector<long> counts(static_cast<std::size_t>(ranks), 50);
  counts.back() = -1;
  const auto start = Clock::now();
  const auto results = all_reduce_on_threads(ranks, counts, false);
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 30.0);
  const std::string missing = "rank " + std::to_string(ranks - 1) + " did not arrive within 0.3 s";
  const std::string waiting = ranks == 3 ? "ranks 0 and 1 waited" : "rank 0 waited";
  for (int r = 0; r + 1 < ranks; ++r) {
    const RankResult& got = results[std::size_t(r)];
    EXPECT_EQ(got.sync, cudaSuccess);
    EXPECT_EQ(got.async, ncclSystemError);
    EXPECT_NE(got.last.find(missing), std::string::npos) << got.last;
    EXPECT_NE(got.last.find(waiting), std::string::npos) << got.last;
    for (float x : got.values) EXPECT_EQ(x, 0.0f);
  }
  EXPECT_EQ(results.back().async, ncclSuccess);
  for (int d = 0; d < ranks; ++d) EXPECT_EQ(tlemu::sticky_error(d), cudaSuccess);
}

TEST_F(Libraries, ALateRankFindsTheCollectiveFailedInsteadOfHanging) {
  NEED_DEVICES(2);
  tlemu::set_nccl_timeout(std::chrono::milliseconds(200));
  ncclComm_t comms[2];
  ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess);
  std::vector<float*> buffers(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    buffers[std::size_t(r)] = device_copy(std::vector<float>(8, float(r + 1)));
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  // Rank 0 alone, then rank 1 after rank 0 gave up (one thread, no group: the
  // emulator's queued calls do not block the host).
  ASSERT_EQ(ncclAllReduce(buffers[0], buffers[0], 8, ncclFloat, ncclSum, comms[0], nullptr),
            ncclSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ncclResult_t async;
  ASSERT_EQ(ncclCommGetAsyncError(comms[0], &async), ncclSuccess);
  EXPECT_EQ(async, ncclSystemError);
  EXPECT_EQ(ncclAllReduce(buffers[0], buffers[0], 8, ncclFloat, ncclSum, comms[0], nullptr),
            ncclSystemError);  // a failed communicator refuses further calls
  ASSERT_EQ(ncclAllReduce(buffers[1], buffers[1], 8, ncclFloat, ncclSum, comms[1], nullptr),
            ncclSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(ncclCommGetAsyncError(comms[1], &async), ncclSuccess);
  EXPECT_EQ(async, ncclSystemError);
  EXPECT_EQ(host_copy(buffers[1], 8), std::vector<float>(8, 2.0f));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ncclCommAbort(comms[r]), ncclSuccess);
    cudaFree(buffers[std::size_t(r)]);
  }
}

TEST_F(Libraries, AbortReleasesARankWaitingForTheOthers) {
  NEED_DEVICES(2);
  ncclComm_t comms[2];
  ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess);  // the 60 s default timeout
  float* buffer = device_copy(std::vector<float>(4, 1.0f));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const auto start = Clock::now();
  ASSERT_EQ(ncclAllReduce(buffer, buffer, 4, ncclFloat, ncclSum, comms[0], stream), ncclSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);  // waiting for rank 1
  ASSERT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // Rank 1 is not told, as on hardware: its call waits for rank 0 until the timeout.
  tlemu::set_nccl_timeout(std::chrono::milliseconds(300));
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  float* other = device_copy(std::vector<float>(4, 1.0f));
  ASSERT_EQ(ncclAllReduce(other, other, 4, ncclFloat, ncclSum, comms[1], nullptr), ncclSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  tlemu::set_nccl_timeout(std::chrono::seconds(60));
  ncclResult_t async;
  ASSERT_EQ(ncclCommGetAsyncError(comms[1], &async), ncclSuccess);
  EXPECT_EQ(async, ncclSystemError);
  EXPECT_NE(std::string(ncclGetLastError(comms[1])).find("rank 0 did not arrive"),
            std::string::npos)
      << ncclGetLastError(comms[1]);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 20.0);
  EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
  EXPECT_EQ(ncclCommGetAsyncError(comms[0], &async), ncclInvalidArgument);  // gone
  cudaFree(other);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaFree(buffer);
  cudaStreamDestroy(stream);
}

// towerlab's NcclCommunicator: non-blocking communicators, ncclInProgress polled
// through ncclCommGetAsyncError, a group of in-place all-reduces, finalize, destroy.
TEST_F(Libraries, NonBlockingCommunicatorsAsTowerlabUsesThem) {
  NEED_DEVICES(2);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::vector<float>> a(2), b(2);
  auto poll = [](ncclComm_t comm) {
    ncclResult_t state = ncclInProgress;
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (state == ncclInProgress && Clock::now() < until) {
      EXPECT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
      std::this_thread::yield();
    }
    return state;
  };
  run_threads(2, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "towerlab";
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
    ASSERT_TRUE(r == ncclSuccess || r == ncclInProgress) << ncclGetErrorString(r);
    ASSERT_EQ(poll(comm), ncclSuccess);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    float* x = device_copy(std::vector<float>{float(rank), 1.5f, -2.0f});
    float* y = device_copy(std::vector<float>{0.25f * float(rank + 1)});
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(x, x, 3, ncclFloat, ncclSum, comm, stream), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(y, y, 0, ncclFloat, ncclSum, comm, stream), ncclSuccess);  // empty
    EXPECT_EQ(ncclAllReduce(y, y, 1, ncclFloat, ncclSum, comm, stream), ncclSuccess);
    const ncclResult_t end = ncclGroupEnd();
    EXPECT_TRUE(end == ncclSuccess || end == ncclInProgress);
    EXPECT_EQ(poll(comm), ncclSuccess);
    cudaEvent_t done;
    ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(done, stream), cudaSuccess);
    while (cudaEventQuery(done) == cudaErrorNotReady) std::this_thread::yield();
    EXPECT_EQ(poll(comm), ncclSuccess);
    a[std::size_t(rank)] = host_copy(x, 3);
    b[std::size_t(rank)] = host_copy(y, 1);
    ncclResult_t state = ncclCommFinalize(comm);
    if (state == ncclInProgress) state = poll(comm);
    EXPECT_EQ(state, ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    cudaEventDestroy(done);
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(stream);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(a[std::size_t(r)], (std::vector<float>{1.0f, 3.0f, -4.0f}));
    EXPECT_EQ(b[std::size_t(r)], (std::vector<float>{0.75f}));
  }
}

// towerlab's NcclAllReduce: ncclCommInitAll, one thread, a group over the devices.
TEST_F(Libraries, InitAllAndAGroupFromOneThread) {
  NEED_DEVICES(2);
  const int n = std::min(devices(), 4);
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
  std::vector<int> devlist(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devlist[std::size_t(i)] = n - 1 - i;  // rank i on cuda:n-1-i
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devlist.data()), ncclSuccess);
  std::vector<float*> buffers(static_cast<std::size_t>(n));
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    int device = -1, rank = -1, count = 0;
    ASSERT_EQ(ncclCommCuDevice(comms[std::size_t(i)], &device), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(comms[std::size_t(i)], &rank), ncclSuccess);
    ASSERT_EQ(ncclCommCount(comms[std::size_t(i)], &count), ncclSuccess);
    EXPECT_EQ(device, n - 1 - i);
    EXPECT_EQ(rank, i);
    EXPECT_EQ(count, n);
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&streams[std::size_t(i)]), cudaSuccess);
    buffers[std::size_t(i)] = device_copy(std::vector<float>{float(i), 1.0f, float(1 << i)});
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(ncclAllReduce(buffers[std::size_t(i)], buffers[std::size_t(i)], 3, ncclFloat,
                              ncclSum, comms[std::size_t(i)], streams[std::size_t(i)]),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  }
  float expected[3] = {0, 0, 0};
  for (int i = 0; i < n; ++i)
    expected[0] += float(i), expected[1] += 1, expected[2] += float(1 << i);
  for (float& e : expected) e *= float(n * n);  // three rounds: the sum times n, twice more
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(cudaStreamSynchronize(streams[std::size_t(i)]), cudaSuccess);
    EXPECT_EQ(host_copy(buffers[std::size_t(i)], 3), (std::vector<float>(expected, expected + 3)))
        << i;
  }
  // The default stream means the communicator's device's, whatever is current.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(ncclAllReduce(buffers[std::size_t(i)], buffers[std::size_t(i)], 1, ncclFloat, ncclMax,
                            comms[std::size_t(i)], nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(cudaSetDevice(n - 1 - i), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(host_copy(buffers[std::size_t(i)], 1)[0], expected[0]);
    ncclResult_t async;
    ASSERT_EQ(ncclCommGetAsyncError(comms[std::size_t(i)], &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comms[std::size_t(i)]), ncclSuccess);
    cudaFree(buffers[std::size_t(i)]);
    cudaStreamDestroy(streams[std::size_t(i)]);
  }
}

// The rank-order combination NCCL's emulation promises, on the host.
template <typename T>
std::vector<T> combined(const std::vector<std::vector<T>>& ranks, ncclRedOp_t op) {
  std::vector<T> out = ranks[0];
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      const T a = out[i], b = ranks[r][i];
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        if (op == ncclSum || op == ncclAvg) out[i] = T(U(U(a) + U(b)));
        if (op == ncclProd) out[i] = T(U(U(a) * U(b)));
      } else {
        if (op == ncclSum || op == ncclAvg) out[i] = a + b;
        if (op == ncclProd) out[i] = a * b;
      }
      if (op == ncclMax) out[i] = std::max(a, b);
      if (op == ncclMin) out[i] = std::min(a, b);
    }
  }
  if (op == ncclAvg) {
    for (T& x : out) x = T(x / T(ranks.size()));
  }
  return out;
}

TEST_F(Libraries, AllReduceOperationsAndTypes) {
  NEED_DEVICES(2);
  const int n = std::min(devices(), 3);
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  std::vector<std::vector<std::int32_t>> ints = {
      {1, -5, 7, 2147483647}, {2, 9, -3, 1}, {4, 0, 5, 0}};
  std::vector<std::vector<double>> doubles = {{0.5, -1.0}, {0.25, 4.0}, {2.0, 1.0}};
  ints.resize(std::size_t(n));
  doubles.resize(std::size_t(n));
  // Spot checks of the reference itself: int32 wraps, as on the device; the
  // integer average truncates.
  EXPECT_EQ(combined(ints, ncclSum)[3], -2147483647 - 1);
  EXPECT_EQ(combined(ints, ncclMin)[1], -5);
  if (n == 3) {
    EXPECT_EQ(combined(ints, ncclProd), (std::vector<std::int32_t>{8, 0, -105, 0}));
    EXPECT_EQ(combined(ints, ncclAvg), (std::vector<std::int32_t>{2, 1, 3, -715827882}));
    EXPECT_EQ(combined(doubles, ncclMax), (std::vector<double>{2.0, 4.0}));
  }
  for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
    std::vector<std::int32_t*> di(std::size_t(n), nullptr);
    std::vector<double*> dd(std::size_t(n), nullptr);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      di[std::size_t(r)] = device_copy(ints[std::size_t(r)]);
      dd[std::size_t(r)] = device_copy(doubles[std::size_t(r)]);
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(ncclAllReduce(di[std::size_t(r)], di[std::size_t(r)], 4, ncclInt32, op,
                              comms[std::size_t(r)], nullptr),
                ncclSuccess);
      ASSERT_EQ(ncclAllReduce(dd[std::size_t(r)], dd[std::size_t(r)], 2, ncclDouble, op,
                              comms[std::size_t(r)], nullptr),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(host_copy(di[std::size_t(r)], 4), combined(ints, op)) << "op " << op;
      EXPECT_EQ(host_copy(dd[std::size_t(r)], 2), combined(doubles, op)) << "op " << op;
      cudaFree(di[std::size_t(r)]);
      cudaFree(dd[std::size_t(r)]);
    }
  }
  for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST_F(Libraries, AllReduceRefusesBadArguments) {
  NEED_DEVICES(2);
  ncclComm_t comms[2];
  ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess);
  float* on0 = device_copy(std::vector<float>(4, 1.0f));
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  float* on1 = device_copy(std::vector<float>(4, 1.0f));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::vector<float> host(4, 1.0f);
  EXPECT_EQ(ncclAllReduce(host.data(), on0, 4, ncclFloat, ncclSum, comms[0], nullptr),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comms[0])).find("sendbuff is "), std::string::npos)
      << ncclGetLastError(comms[0]);
  EXPECT_EQ(ncclAllReduce(on1, on1, 4, ncclFloat, ncclSum, comms[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(on0, on0, 5, ncclFloat, ncclSum, comms[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(on0, on0, 4, ncclHalf, ncclSum, comms[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(on0, on0, 4, static_cast<ncclDataType_t>(42), ncclSum, comms[0], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(on0, on0, 4, ncclFloat, static_cast<ncclRedOp_t>(9), comms[0], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(on0, on0, 4, ncclFloat, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  cudaStream_t stream1;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&stream1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(on0, on0, 4, ncclFloat, ncclSum, comms[0], stream1), ncclInvalidArgument);
  // A bad call inside a group fails the group: nothing of it is queued.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(on0, on0, 4, ncclFloat, ncclSum, comms[0], nullptr), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 4, ncclFloat, ncclSum, comms[1], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // no group open
  // Count 0 queues nothing, on one rank alone.
  EXPECT_EQ(ncclAllReduce(on0, on0, 0, ncclFloat, ncclSum, comms[0], nullptr), ncclSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Nothing was queued above: a real collective still works, and gives 2.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(on0, on0, 4, ncclFloat, ncclSum, comms[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(on1, on1, 4, ncclFloat, ncclSum, comms[1], stream1), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(host_copy(on0, 4), std::vector<float>(4, 2.0f));
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream1), cudaSuccess);
  EXPECT_EQ(host_copy(on1, 4), std::vector<float>(4, 2.0f));
  cudaFree(on1);
  cudaStreamDestroy(stream1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaFree(on0);
  for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
}

// --- the all-reduce's two halves ------------------------------------------------------------

// n communicators (rank r on cuda:r), made by ncclCommInitAll and destroyed (or, after
// a failure, aborted) at the end.
struct Clique {
  std::vector<ncclComm_t> comms;
  explicit Clique(int n) : comms(std::size_t(n)) {
    EXPECT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  }
  ~Clique() {
    for (ncclComm_t c : comms) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(c, &async);
      if (async == ncclSuccess) {
        EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
      } else {
        EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
      }
    }
  }
  ncclComm_t operator[](int r) const { return comms[std::size_t(r)]; }
  int size() const { return int(comms.size()); }
  // Waits for every device; then the async error of each rank.
  std::vector<ncclResult_t> finish() const {
    std::vector<ncclResult_t> out;
    for (int r = 0; r < size(); ++r) {
      EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ncclResult_t async = ncclInternalError;
      EXPECT_EQ(ncclCommGetAsyncError(comms[std::size_t(r)], &async), ncclSuccess);
      out.push_back(async);
    }
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    return out;
  }
};

// Elements [begin, begin + n) of v.
std::vector<float> block_of(const std::vector<float>& v, std::size_t begin, std::size_t n) {
  return {v.begin() + std::ptrdiff_t(begin), v.begin() + std::ptrdiff_t(begin + n)};
}

TEST_F(Libraries, ReduceScatterAndAllGatherAreTheAllReducesHalvesInRankOrder) {
  NEED_DEVICES(2);               // and 3 and 4 ranks where there are devices for them
  const std::size_t count = 37;  // per rank's block: odd, so no block is aligned to 8
  for (int ranks : {2, 3, 4}) {
    if (devices() < ranks) continue;
    const std::size_t n = std::size_t(ranks) * count;
    std::vector<std::vector<float>> sent;
    for (int r = 0; r < ranks; ++r) sent.push_back(rank_values(r, n));
    const std::vector<float> expected = combined(sent, ncclSum);  // rank order: 0, 1, ...
    if (ranks >= 3) {
      // Control: the same sums started at rank 1 (as a ring may start a block) differ
      // somewhere, so the bit comparisons below could fail.
      std::vector<std::vector<float>> rotated(sent.begin() + 1, sent.end());
      rotated.push_back(sent[0]);
      EXPECT_FALSE(same_bits(combined(rotated, ncclSum), expected)) << ranks << " ranks";
    }
    for (bool in_place : {false, true}) {
      Clique clique(ranks);
      // Out of place: send [n], recv [count], gathered [n]. In place: one buffer [n],
      // the rank's block its reduce-scatter's receive and its all-gather's send.
      const auto n_ranks = std::size_t(ranks);
      std::vector<float*> send(n_ranks), recv(n_ranks), gathered(n_ranks), reduced(n_ranks);
      for (int r = 0; r < ranks; ++r) {
        const std::size_t i = std::size_t(r);
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        send[i] = device_copy(sent[i]);
        recv[i] = in_place ? send[i] + i * count : device_copy(std::vector<float>(count, -7.0f));
        gathered[i] = in_place ? send[i] : device_copy(std::vector<float>(n, -7.0f));
        reduced[i] = device_copy(sent[i]);  // for the all-reduce beside them
      }
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < ranks; ++r) {
        const std::size_t i = std::size_t(r);
        ASSERT_EQ(
            ncclReduceScatter(send[i], recv[i], count, ncclFloat, ncclSum, clique[r], nullptr),
            ncclSuccess);
      }
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
      for (int r = 0; r < ranks; ++r) {
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        EXPECT_TRUE(same_bits(host_copy(recv[std::size_t(r)], count),
                              block_of(expected, std::size_t(r) * count, count)))
            << ranks << " ranks, rank " << r << (in_place ? ", in place" : "");
      }
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < ranks; ++r) {
        const std::size_t i = std::size_t(r);
        ASSERT_EQ(ncclAllGather(recv[i], gathered[i], count, ncclFloat, clique[r], nullptr),
                  ncclSuccess);
        ASSERT_EQ(ncclAllReduce(reduced[i], reduced[i], n, ncclFloat, ncclSum, clique[r], nullptr),
                  ncclSuccess);
      }
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
      for (ncclResult_t async : clique.finish()) EXPECT_EQ(async, ncclSuccess);
      for (int r = 0; r < ranks; ++r) {
        const std::size_t i = std::size_t(r);
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        const std::vector<float> all = host_copy(gathered[i], n);
        EXPECT_TRUE(same_bits(all, expected)) << ranks << " ranks, rank " << r;
        EXPECT_TRUE(same_bits(all, host_copy(reduced[i], n))) << "the all-reduce's bits";
        cudaFree(send[i]);
        cudaFree(reduced[i]);
        if (!in_place) cudaFree(recv[i]), cudaFree(gathered[i]);
      }
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    }
  }
}

// 16-bit values are gathered bit for bit (the all-gather copies; their reductions are
// refused: HalvesRefuseBuffersOfTheWrongSizeOrOverlap). Each rank's block is 8
// bfloat16 or float16 values, held here in 4 floats' bytes.
TEST_F(Libraries, AllGatherCopiesSixteenBitValues) {
  NEED_DEVICES(2);
  for (ncclDataType_t type : {ncclBfloat16, ncclHalf}) {
    Clique clique(2);
    std::vector<std::vector<float>> sent{rank_values(0, 4), rank_values(1, 4)};
    std::vector<float*> send(2), gathered(2);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      send[std::size_t(r)] = device_copy(sent[std::size_t(r)]);
      gathered[std::size_t(r)] = device_copy(std::vector<float>(8, -7.0f));
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(ncclAllGather(send[std::size_t(r)], gathered[std::size_t(r)], 8, type, clique[r],
                              nullptr),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (ncclResult_t async : clique.finish()) EXPECT_EQ(async, ncclSuccess);
    std::vector<float> expected = sent[0];
    expected.insert(expected.end(), sent[1].begin(), sent[1].end());
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      EXPECT_TRUE(same_bits(host_copy(gathered[std::size_t(r)], 8), expected)) << "rank " << r;
      cudaFree(send[std::size_t(r)]);
      cudaFree(gathered[std::size_t(r)]);
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
}

// Rank 0 and rank 1 each queue their own call; both must see `message`, and rank 1's
// receive buffer (filled with -7) must be unchanged.
void expect_mismatch(const std::function<ncclResult_t(int, float*, float*, ncclComm_t)>& call,
                     const std::string& message) {
  Clique clique(2);
  std::vector<float*> send(2), recv(2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
    send[std::size_t(r)] = device_copy(rank_values(r, 16));
    recv[std::size_t(r)] = device_copy(std::vector<float>(16, -7.0f));
  }
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(call(r, send[std::size_t(r)], recv[std::size_t(r)], clique[r]), ncclSuccess);
  }
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  for (ncclResult_t async : clique.finish()) EXPECT_EQ(async, ncclInvalidUsage);
  for (int r = 0; r < 2; ++r) {
    const std::string last = ncclGetLastError(clique[r]);
    EXPECT_NE(last.find(message), std::string::npos) << "rank " << r << ": " << last;
    EXPECT_EQ(tlemu::sticky_error(r), cudaSuccess);
    EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
    EXPECT_EQ(host_copy(recv[std::size_t(r)], 16), std::vector<float>(16, -7.0f));
    cudaFree(send[std::size_t(r)]);
    cudaFree(recv[std::size_t(r)]);
  }
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST_F(Libraries, MismatchedHalvesFailOnEveryRankNamingTheCallsAndRanks) {
  NEED_DEVICES(2);
  expect_mismatch(
      [](int r, float* send, float* recv, ncclComm_t c) {
        return ncclReduceScatter(send, recv, r == 0 ? 8 : 6, ncclFloat, ncclSum, c, nullptr);
      },
      "rank 1 called ncclReduceScatter with count 6, rank 0 with count 8");
  expect_mismatch(
      [](int r, float* send, float* recv, ncclComm_t c) {
        return ncclReduceScatter(send, recv, 8, ncclFloat, r == 0 ? ncclSum : ncclMax, c, nullptr);
      },
      "rank 1 called ncclReduceScatter with op ncclMax, rank 0 with op ncclSum");
  expect_mismatch(
      [](int r, float* send, float* recv, ncclComm_t c) {
        return ncclAllGather(send, recv, 8, r == 0 ? ncclFloat : ncclInt32, c, nullptr);
      },
      "rank 1 called ncclAllGather with datatype ncclInt32, rank 0 with datatype ncclFloat32");
  expect_mismatch(
      [](int r, float* send, float* recv, ncclComm_t c) {
        return r == 0 ? ncclReduceScatter(send, recv, 8, ncclFloat, ncclSum, c, nullptr)
                      : ncclAllGather(send, recv, 8, ncclFloat, c, nullptr);
      },
      "rank 1 called ncclAllGather (count 8, ncclFloat32), rank 0 called ncclReduceScatter "
      "(count 8, ncclFloat32, ncclSum)");
  expect_mismatch(
      [](int r, float* send, float* recv, ncclComm_t c) {
        return r == 0 ? ncclAllReduce(send, recv, 16, ncclFloat, ncclSum, c, nullptr)
                      : ncclReduceScatter(send, recv, 8, ncclFloat, ncclSum, c, nullptr);
      },
      "rank 1 called ncclReduceScatter (count 8, ncclFloat32, ncclSum), rank 0 called "
      "ncclAllReduce (count 16, ncclFloat32, ncclSum)");
}

TEST_F(Libraries, HalvesRefuseBuffersOfTheWrongSizeOrOverlap) {
  NEED_DEVICES(2);
  Clique clique(2);
  float* big = device_copy(std::vector<float>(16, 1.0f));  // on cuda:0, rank 0's device
  float* small = device_copy(std::vector<float>(8, 1.0f));
  const auto refused = [&](ncclResult_t r, const std::string& message) {
    EXPECT_EQ(r, ncclInvalidArgument);
    const std::string last = ncclGetLastError(clique[0]);
    EXPECT_NE(last.find(message), std::string::npos) << last;
  };
  // The reduce-scatter sends nranks blocks; the all-gather receives them.
  refused(ncclReduceScatter(small, big, 8, ncclFloat, ncclSum, clique[0], nullptr),
          "ncclReduceScatter (rank 0 on cuda:0): sendbuff (64 bytes) runs past the end");
  refused(ncclAllGather(big, small, 8, ncclFloat, clique[0], nullptr),
          "ncclAllGather (rank 0 on cuda:0): recvbuff (64 bytes) runs past the end");
  // In place is the rank's own block only: rank 0's is the first.
  refused(ncclReduceScatter(big, big + 4, 8, ncclFloat, ncclSum, clique[0], nullptr),
          "sendbuff and recvbuff overlap, but not in place (in place, recvbuff is sendbuff + "
          "rank * count elements)");
  refused(ncclAllGather(big + 8, big, 8, ncclFloat, clique[0], nullptr),
          "sendbuff and recvbuff overlap, but not in place (in place, sendbuff is recvbuff + "
          "rank * count elements)");
  refused(ncclReduceScatter(big, big, 8, ncclHalf, ncclSum, clique[0], nullptr),
          "ncclFloat16 is a valid NCCL datatype whose reductions the emulated NCCL does not "
          "implement");
  // Nothing was queued: the in-place forms still meet and give the sums.
  float* on1 = nullptr;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  on1 = device_copy(std::vector<float>(16, 2.0f));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclReduceScatter(big, big, 8, ncclFloat, ncclSum, clique[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclReduceScatter(on1, on1 + 8, 8, ncclFloat, ncclSum, clique[1], nullptr),
            ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (ncclResult_t async : clique.finish()) EXPECT_EQ(async, ncclSuccess);
  EXPECT_EQ(host_copy(big, 8), std::vector<float>(8, 3.0f));
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(host_copy(on1 + 8, 8), std::vector<float>(8, 3.0f));
  cudaFree(on1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaFree(big);
  cudaFree(small);
}

TEST_F(Libraries, InitRankWaitsForTheOthersOnlyUntilTheTimeout) {
  NEED_DEVICES(2);
  tlemu::set_nccl_timeout(std::chrono::milliseconds(200));
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclSystemError);  // rank 1 never comes
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 1 did not join within 0.2 s"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  // Non-blocking: ncclInProgress, then the error through ncclCommGetAsyncError.
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ASSERT_EQ(ncclCommInitRankConfig(&comm, 3, id, 2, &config), ncclInProgress);
  ncclResult_t state;
  ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress);
  float* buffer = device_copy(std::vector<float>(1, 0.0f));
  EXPECT_EQ(ncclAllReduce(buffer, buffer, 1, ncclFloat, ncclSum, comm, nullptr),
            ncclInvalidArgument);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSystemError);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("ranks 0 and 1 did not join"),
            std::string::npos)
      << ncclGetLastError(comm);
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  cudaFree(buffer);
}

TEST_F(Libraries, InitRankRefusesMisuse) {
  NEED_DEVICES(2);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm;
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(nullptr, 2, id, 0), ncclInvalidArgument);
  ncclUniqueId zeros{};
  EXPECT_EQ(ncclCommInitRank(&comm, 1, zeros, 0), ncclInvalidArgument);
  ncclConfig_t unset{};
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &unset), ncclInvalidArgument);
  // Two ranks on one device: both fail, as NCCL's "Duplicate GPU detected".
  std::vector<ncclResult_t> results(2);
  std::vector<std::string> messages(2);
  run_threads(2, [&](int rank) {
    cudaSetDevice(0);
    ncclComm_t c = nullptr;
    results[std::size_t(rank)] = ncclCommInitRank(&c, 2, id, rank);
    messages[std::size_t(rank)] = ncclGetLastError(nullptr);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[std::size_t(r)], ncclInvalidUsage);
    EXPECT_NE(messages[std::size_t(r)].find("are both on cuda:0 (Duplicate GPU detected)"),
              std::string::npos)
        << messages[std::size_t(r)];
  }
  ncclComm_t comms[2];
  const int same[2] = {1, 1};
  EXPECT_EQ(ncclCommInitAll(comms, 2, same), ncclInvalidUsage);
  const int bad[2] = {0, 99};
  EXPECT_EQ(ncclCommInitAll(comms, 2, bad), ncclInvalidArgument);
  // Ranks that disagree on the rank count.
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  run_threads(2, [&](int rank) {
    cudaSetDevice(rank);
    ncclComm_t c = nullptr;
    results[std::size_t(rank)] = ncclCommInitRank(&c, 2 + rank, id, rank);
    messages[std::size_t(rank)] = ncclGetLastError(nullptr);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[std::size_t(r)], ncclInvalidUsage);
    EXPECT_NE(messages[std::size_t(r)].find("rank 1 called ncclCommInitRank with nranks 3, rank 0 "
                                            "with nranks 2"),
              std::string::npos)
        << messages[std::size_t(r)];
  }
  // An id makes one communicator.
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  ncclComm_t again;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(ncclCommInitRank(&again, 1, id, 0), ncclInvalidUsage);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclInvalidArgument);
}

TEST_F(Libraries, AUniqueIdFromAnotherProcessIsRefused) {
  ncclUniqueId mine;
  ASSERT_EQ(ncclGetUniqueId(&mine), ncclSuccess);  // the parent's state exists before the fork
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ncclUniqueId id;
    const bool ok = ncclGetUniqueId(&id) == ncclSuccess &&
                    write(pipe_fds[1], &id, sizeof id) == static_cast<ssize_t>(sizeof id);
    _exit(ok ? 0 : 1);
  }
  ncclUniqueId theirs;
  ASSERT_EQ(read(pipe_fds[0], &theirs, sizeof theirs), static_cast<ssize_t>(sizeof theirs));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 1, theirs, 0), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("must be threads of one process"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(comm, nullptr);
  // A one-rank communicator from this process's id works, and keeps its bits.
  ASSERT_EQ(ncclCommInitRank(&comm, 1, mine, 0), ncclSuccess);
  float* x = device_copy(std::vector<float>{1.25f, -3.0f});
  ASSERT_EQ(ncclAllReduce(x, x, 2, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(host_copy(x, 2), (std::vector<float>{1.25f, -3.0f}));
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaFree(x);
}

TEST_F(Libraries, NcclNamesItsResults) {
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidUsage), "invalid usage");
  EXPECT_STREQ(ncclGetErrorString(ncclInProgress), "NCCL operation in progress");
  int version = 0;
  EXPECT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
}

}  // namespace
