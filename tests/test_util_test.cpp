// The TOWERLAB_REQUIRE_GPU switch of the test helpers (test_util.h): on the GPU
// machine a missing GPU must fail the suite, not skip its CUDA cases.
#include <gtest/gtest-spi.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "test_util.h"

namespace towerlab::testing {
namespace {

// Sets TOWERLAB_REQUIRE_GPU (or unsets it, for nullptr) for one scope.
class ScopedRequireGpu {
 public:
  explicit ScopedRequireGpu(const char* value) {
    if (const char* old = std::getenv(kName)) old_ = old;
    set(value);
  }
  ~ScopedRequireGpu() { set(old_ ? old_->c_str() : nullptr); }
  ScopedRequireGpu(const ScopedRequireGpu&) = delete;
  ScopedRequireGpu& operator=(const ScopedRequireGpu&) = delete;

 private:
  static void set(const char* value) {
    if (value != nullptr) {
      ::setenv(kName, value, 1);
    } else {
      ::unsetenv(kName);
    }
  }
  static constexpr const char* kName = "TOWERLAB_REQUIRE_GPU";
  std::optional<std::string> old_;
};

// Collects what skip_without_cuda_device() records with the switch at `value`.
void record_with(const char* value, ::testing::TestPartResultArray* results) {
  ScopedRequireGpu scoped(value);
  ::testing::ScopedFakeTestPartResultReporter reporter(
      ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, results);
  skip_without_cuda_device();
}

TEST(RequireGpu, OnlyTheValueOneTurnsItOn) {
  {
    ScopedRequireGpu on("1");
    EXPECT_TRUE(gpu_required());
  }
  for (const char* off : {"0", "", "yes", "10", " 1"}) {
    ScopedRequireGpu scoped(off);
    EXPECT_FALSE(gpu_required()) << "'" << off << "'";
  }
  ScopedRequireGpu unset(nullptr);
  EXPECT_FALSE(gpu_required());
}

TEST(RequireGpu, NoVisibleGpuIsAFailureUnderTheSwitchAndASkipWithoutIt) {
  ::testing::TestPartResultArray required, optional;
  record_with("1", &required);
  record_with(nullptr, &optional);
  if (cuda_device_count() > 0) {
    EXPECT_EQ(required.size(), 0) << "a visible GPU records nothing";
    EXPECT_EQ(optional.size(), 0) << "a visible GPU records nothing";
    return;
  }
  ASSERT_EQ(required.size(), 1);
  EXPECT_TRUE(required.GetTestPartResult(0).fatally_failed());
  EXPECT_NE(std::string(required.GetTestPartResult(0).message()).find("TOWERLAB_REQUIRE_GPU=1"),
            std::string::npos)
      << required.GetTestPartResult(0).message();
  // The control: the same call without the switch skips.
  ASSERT_EQ(optional.size(), 1);
  EXPECT_TRUE(optional.GetTestPartResult(0).skipped());
  EXPECT_FALSE(optional.GetTestPartResult(0).failed());
}

}  // namespace
}  // namespace towerlab::testing
