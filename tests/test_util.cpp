#include "test_util.h"

#include <cmath>
#include <random>
#include <sstream>

namespace towerlab::testing {

void BackendTest::SetUp() {
  if (GetParam().is_cuda() && cuda_device_count() == 0) {
    GTEST_SKIP() << "no CUDA device visible: CUDA case skipped (it runs where a GPU is)";
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

}  // namespace towerlab::testing
