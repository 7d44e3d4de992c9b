// The emulated NCCL's communicators, from creation to destruction: by rank on
// threads of this binary (blocking and non-blocking, and the timeout of a rank that
// never joins), all from one thread (ncclCommInitAll), finalized, destroyed and
// aborted; misuse, a unique id from another process, and the results' names. The
// collectives are libraries_nccl_test.cpp's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "libraries_test.h"

namespace {

using namespace libraries_test;

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
