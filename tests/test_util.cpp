#include "test_util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#if TOWERLAB_EMULATED_CUDA
#include "tlemu/emulator.h"
#endif

namespace towerlab::testing {

namespace {

constexpr const char* kNoGpuUnderRequire =
    "TOWERLAB_REQUIRE_GPU=1 but no CUDA device is visible: the CUDA cases cannot run";

// Fails the whole suite before its first test when a GPU is required and none is
// visible. It covers the tests that skip on their own without a device, not only
// the BackendTest instances. Registered before main (gtest_main) runs the tests.
class RequireGpuEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (gpu_required() && cuda_device_count() == 0) FAIL() << kNoGpuUnderRequire;
  }
};

::testing::Environment* const kRequireGpu =
    ::testing::AddGlobalTestEnvironment(new RequireGpuEnvironment);

}  // namespace

bool gpu_required() {
  const char* value = std::getenv("TOWERLAB_REQUIRE_GPU");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

void skip_without_cuda_device() {
  if (cuda_device_count() > 0) return;
  if (gpu_required()) FAIL() << kNoGpuUnderRequire;
  GTEST_SKIP() << "no CUDA device visible: CUDA case skipped (it runs where a GPU is)";
}

void BackendTest::SetUp() {
  if (GetParam().is_cuda()) {
    skip_without_cuda_device();
    if (IsSkipped() || HasFatalFailure()) return;
  }
  stream_ = std::make_unique<Stream>(GetParam());
}

std::string backend_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cpu() ? "cpu" : "cuda" + std::to_string(info.param.index);
}

std::vector<float> random_values(std::size_t n, unsigned seed, float low, float high) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

::testing::AssertionResult all_close(const std::vector<float>& actual,
                                     const std::vector<float>& expected, double atol, double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  std::ostringstream bad;
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const bool ok =
        std::abs(a - e) <= atol + rtol * std::abs(e) || (std::isnan(a) && std::isnan(e));
    if (!ok && ++mismatches <= 5) bad << "\n  [" << i << "] " << a << " vs expected " << e;
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << actual.size() << " elements differ:" << bad.str();
}

void hold_back(const Stream& stream) {
  if (stream.device().is_cpu()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return;
  }
#if TOWERLAB_EMULATED_CUDA
  // The GEMMs below would take the emulated GPUs minutes.
  tlemu::delay_stream(static_cast<cudaStream_t>(stream.native_handle()),
                      std::chrono::milliseconds(200));
#else
  const std::int64_t n = 4096;
  Tensor a = Tensor::zeros({n, n}, stream);
  Tensor c = Tensor::empty({n, n}, stream);
  for (int i = 0; i < 8; ++i) matmul(c, a, a, false, false, 1.0f, 0.0f, stream);
#endif
}

}  // namespace towerlab::testing
