// The emulated CUB: DeviceReduce::Sum against the exact sum, the same every run, and
// its argument checks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <cub/device/device_reduce.cuh>

#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include "libraries_test.h"

namespace {

using namespace libraries_test;

float reduce_on_device(const std::vector<float>& values, cudaStream_t stream) {
  float* in = device_copy(values);
  float* out = device_copy(std::vector<float>{std::numeric_limits<float>::quiet_NaN()});
  std::size_t temp_bytes = 0;
  EXPECT_EQ(
      cub::DeviceReduce::Sum(nullptr, temp_bytes, in, out, std::int64_t(values.size()), stream),
      cudaSuccess);
  EXPECT_GT(temp_bytes, 0u);
  void* temp = nullptr;
  EXPECT_EQ(cudaMalloc(&temp, temp_bytes), cudaSuccess);
  EXPECT_EQ(cub::DeviceReduce::Sum(temp, temp_bytes, in, out, std::int64_t(values.size()), stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const float result = host_copy(out, 1)[0];
  cudaFree(temp);
  cudaFree(in);
  cudaFree(out);
  return result;
}

TEST_F(Libraries, CubSumIsCloseToTheExactSumAndTheSameEveryRun) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  EXPECT_EQ(reduce_on_device({}, stream), 0.0f);  // n = 0 writes 0
  EXPECT_EQ(reduce_on_device({2.5f}, stream), 2.5f);
  // Up to 16 items: one run, left to right in float.
  EXPECT_EQ(reduce_on_device({1e8f, 1.0f, -1e8f, 1.0f}, stream), 1.0f);
  for (std::size_t n : {17u, 1000u, 100003u}) {
    const auto values = random_floats(n, unsigned(n), 0.0f, 1.0f);
    double exact = 0;
    for (float v : values) exact += v;
    const float first = reduce_on_device(values, stream);
    EXPECT_NEAR(first, exact, 1e-5 * exact) << n;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(reduce_on_device(values, stream)),
              std::bit_cast<std::uint32_t>(first))
        << n;
  }
  cudaStreamDestroy(stream);
}

TEST_F(Libraries, CubSumChecksItsArguments) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  float* in = device_copy(std::vector<float>{1, 2, 3});
  float* out = device_copy(std::vector<float>{0});
  void* temp = nullptr;
  std::size_t temp_bytes = 0;
  ASSERT_EQ(cub::DeviceReduce::Sum(nullptr, temp_bytes, in, out, 3, stream), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&temp, temp_bytes), cudaSuccess);
  const auto kernels_before = tlemu::counters().kernels;
  std::size_t too_few = temp_bytes - 1;
  EXPECT_EQ(cub::DeviceReduce::Sum(temp, too_few, in, out, 3, stream), cudaErrorInvalidValue);
  // A stream of cuda:1 while cuda:0 is current: refused as a launch would be.
  if (devices() >= 2) {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    cudaStream_t other;
    ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(cub::DeviceReduce::Sum(temp, temp_bytes, in, out, 3, other),
              cudaErrorInvalidResourceHandle);
    cudaStreamDestroy(other);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(tlemu::counters().kernels, kernels_before);
  ASSERT_EQ(cub::DeviceReduce::Sum(temp, temp_bytes, in, out, 3, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(host_copy(out, 1)[0], 6.0f);
  EXPECT_EQ(tlemu::counters().kernels, kernels_before + 1);
  // Host memory as the input: the device faults when the sum runs, as a kernel's
  // stray read would.
  std::vector<float> host{1, 2, 3};
  ASSERT_EQ(cub::DeviceReduce::Sum(temp, temp_bytes, host.data(), out, 3, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorIllegalAddress);
  EXPECT_EQ(tlemu::sticky_error(0), cudaErrorIllegalAddress);
  tlemu::reset();
  cudaFree(temp);
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(stream);
}

}  // namespace
