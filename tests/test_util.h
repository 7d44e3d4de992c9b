// Shared test helpers: the backend fixture that runs one test body on every
// device kind, tolerance comparisons, and an error-message assertion.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "towerlab.h"

namespace towerlab::testing {

// The host's default stream, which most CPU tests run on.
inline const Stream& cpu() {
  return default_stream(Device::cpu());
}

// Puts back the CPU kernels' ISA selection (set_gemm_isa) when it goes out of scope,
// for the tests that compare the bits of several ISAs.
struct RestoreGemmIsa {
  GemmIsa saved = gemm_isa();
  ~RestoreGemmIsa() { set_gemm_isa(saved); }
};

// A batch for the small CNNs of the trainer tests: n normal [1,8,8] images from
// `seed` and labels (i * label_stride + seed) % 3, on the CPU.
inline std::vector<Tensor> small_image_batch(std::int64_t n, unsigned seed, int label_stride) {
  Tensor images = Tensor::empty({n, 1, 8, 8}, cpu());
  random_normal(images, seed, 0, 0.0f, 1.0f, cpu());
  std::vector<float> labels;
  for (std::int64_t i = 0; i < n; ++i) labels.push_back(float((i * label_stride + seed) % 3));
  return {images, Tensor::from_host<float>(labels, {n}, cpu())};
}

// Where the CUDA cases run: on the emulated GPUs (emulator/), and whether under
// ThreadSanitizer. A test sized for a real GPU (long kernels so that streams
// overlap) is sized down there, where one thread of a kernel is a host function call
// and streams are host threads that overlap anyway.
#if TOWERLAB_EMULATED_CUDA
inline constexpr bool kEmulatedGpus = true;
#else
inline constexpr bool kEmulatedGpus = false;
#endif
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// Holds back the work submitted to `stream` after this call: on a GPU, large matrix
// products (tens of milliseconds); on the emulated GPUs, a pause queued on the
// stream (200 ms); on the CPU, a sleep of the calling thread, which is the host
// stream. The CPU backend finishes work as it is submitted, so there the delay is
// over before anything else is issued and a missing wait cannot show: tests built
// on it can fail on a GPU (emulated or real) only.
void hold_back(const Stream& stream);

// True when TOWERLAB_REQUIRE_GPU is "1" (scripts/gpu.py sets it on the GPU machine):
// then no visible GPU fails the suite instead of skipping its CUDA cases, because
// there a skipped CUDA case would read as a pass. Any other value, or none, is off.
bool gpu_required();

// Where no GPU is visible, records a skip of the running test, or a fatal failure
// under gpu_required(); records nothing where one is. The caller returns when
// IsSkipped() or HasFatalFailure() (gtest's macros return from this function only).
void skip_without_cuda_device();

// A test parameterized by device: the body runs on "cpu" and on "cuda:0"; the
// CUDA instance skips with a message where no GPU is visible (fails under
// gpu_required()).
// A fixture that puts the thread pool back to its size when a test ends, whatever
// the test set (set_num_threads).
class RestoresThreadCount : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = num_threads(); }
  void TearDown() override { set_num_threads(saved_); }

 private:
  int saved_ = 1;
};

class BackendTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override;
  Device device() const { return GetParam(); }
  Stream& stream() { return *stream_; }

  Tensor make(const std::vector<float>& values, const Shape& shape) {
    return Tensor::from_host<float>(values, shape, stream());
  }
  std::vector<float> host(const Tensor& t) { return t.to_host<float>(stream()); }

 private:
  std::unique_ptr<Stream> stream_;
};

std::string backend_name(const ::testing::TestParamInfo<Device>& info);

#define TL_INSTANTIATE_BACKENDS(Fixture)                                         \
  INSTANTIATE_TEST_SUITE_P(                                                      \
      Backends, Fixture,                                                         \
      ::testing::Values(::towerlab::Device::cpu(), ::towerlab::Device::cuda(0)), \
      ::towerlab::testing::backend_name)

// Uniform values in [low, high) from a fixed seed (std::mt19937, independent of
// the engine's own generator under test).
std::vector<float> random_values(std::size_t n, unsigned seed, float low = -1.0f,
                                 float high = 1.0f);

// |actual - expected| <= atol + rtol * |expected| for every element, reporting the
// first few mismatches with their index.
::testing::AssertionResult all_close(const std::vector<float>& actual,
                                     const std::vector<float>& expected, double atol = 1e-6,
                                     double rtol = 1e-5);

// The bit patterns of float values: what "the same bits" compares.
inline std::vector<std::uint32_t> bits(const std::vector<float>& values) {
  std::vector<std::uint32_t> out(values.size());
  if (!values.empty()) std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
  return out;
}

// The largest |a[i] - b[i]| (and a failure when the sizes differ).
inline double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
  }
  return worst;
}

}  // namespace towerlab::testing

// Asserts that `statement` throws `ErrorType` whose what() contains `substring`.
#define EXPECT_THROW_WITH(statement, ErrorType, substring)                                     \
  do {                                                                                         \
    try {                                                                                      \
      statement;                                                                               \
      ADD_FAILURE() << "expected " #ErrorType " from: " #statement;                            \
    } catch (const ErrorType& tl_error_) {                                                     \
      EXPECT_NE(std::string(tl_error_.what()).find(substring), std::string::npos)              \
          << "message was: " << tl_error_.what();                                              \
    } catch (const std::exception& tl_other_) {                                                \
      ADD_FAILURE() << "expected " #ErrorType ", got another exception: " << tl_other_.what(); \
    }                                                                                          \
  } while (0)
