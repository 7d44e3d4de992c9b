// Process-wide settings (engine/settings.h): the conv2d algorithm is one of them,
// and an unknown value of a TOWERLAB_* environment variable warns once, naming the
// variable, instead of being ignored silently.
#include <cstdlib>
#include <string>

#include "engine/settings.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// How many times `needle` occurs in `text`.
int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(Settings, AnUnknownEnvironmentValueWarnsOnceAndReadsAsUnset) {
  const char* variable = "TOWERLAB_SETTINGS_TEST_UNKNOWN";
  ::setenv(variable, "fastest", 1);
  ::testing::internal::CaptureStderr();
  const auto first = detail::environment_choice(variable, {"slow", "fast"});
  const auto second = detail::environment_choice(variable, {"slow", "fast"});
  const std::string printed = ::testing::internal::GetCapturedStderr();
  ::unsetenv(variable);
  EXPECT_FALSE(first.has_value());
  EXPECT_FALSE(second.has_value());
  EXPECT_EQ(occurrences(printed, "TOWERLAB_SETTINGS_TEST_UNKNOWN"), 1) << printed;
  EXPECT_NE(printed.find("towerlab: TOWERLAB_SETTINGS_TEST_UNKNOWN=fastest is not one of slow, "
                         "fast; the default is used"),
            std::string::npos)
      << printed;
}

TEST(Settings, AKnownEnvironmentValueIsReturnedWithoutAWarning) {
  const char* variable = "TOWERLAB_SETTINGS_TEST_KNOWN";
  ::testing::internal::CaptureStderr();
  ::unsetenv(variable);
  const auto unset = detail::environment_choice(variable, {"slow", "fast"});
  ::setenv(variable, "", 1);  // VAR= in a shell: unset, not unknown
  const auto empty = detail::environment_choice(variable, {"slow", "fast"});
  ::setenv(variable, "fast", 1);
  const auto known = detail::environment_choice(variable, {"slow", "fast"});
  const std::string printed = ::testing::internal::GetCapturedStderr();
  ::unsetenv(variable);
  EXPECT_FALSE(unset.has_value());
  EXPECT_FALSE(empty.has_value());
  EXPECT_EQ(known, "fast");
  EXPECT_EQ(printed, "");
}

TEST(Settings, TheConv2dAlgorithmIsAProcessWideSetting) {
  const Conv2dAlgorithm before = conv2d_algorithm();
  set_conv2d_algorithm(Conv2dAlgorithm::Im2col);
  EXPECT_EQ(conv2d_algorithm(), Conv2dAlgorithm::Im2col);
  set_conv2d_algorithm(Conv2dAlgorithm::Winograd);
  EXPECT_EQ(conv2d_algorithm(), Conv2dAlgorithm::Winograd);
  set_conv2d_algorithm(before);
  EXPECT_EQ(conv2d_algorithm(), before);
}

// The library's own variables are read once per process, when the setting is
// first used: each case runs in a fresh process (gtest's threadsafe death-test
// style re-executes the binary), which exits 0 when the setting fell back to its
// default. The warning is matched on that process's stderr.
class SettingsEnvironment : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(SettingsEnvironment, AMisspelledConv2dAlgorithmWarnsAndKeepsAuto) {
  EXPECT_EXIT(
      {
        ::setenv("TOWERLAB_CONV2D_ALGORITHM", "winogard", 1);
        std::exit(conv2d_algorithm() == Conv2dAlgorithm::Auto ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "towerlab: TOWERLAB_CONV2D_ALGORITHM=winogard is not one of auto, im2col, winograd; the "
      "default is used");
}

TEST_F(SettingsEnvironment, AKnownConv2dAlgorithmIsTaken) {
  EXPECT_EXIT(
      {
        ::setenv("TOWERLAB_CONV2D_ALGORITHM", "im2col", 1);
        std::exit(conv2d_algorithm() == Conv2dAlgorithm::Im2col ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(SettingsEnvironment, AnUnknownGemmIsaWarnsAndKeepsTheAutomaticChoice) {
  EXPECT_EXIT(
      {
        ::setenv("TOWERLAB_GEMM_ISA", "avx1024", 1);
        const GemmIsa chosen = gemm_isa();
        set_gemm_isa(GemmIsa::Auto);  // the automatic choice
        std::exit(chosen == gemm_isa() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "towerlab: TOWERLAB_GEMM_ISA=avx1024 is not one of portable, avx2, avx512; the default "
      "is used");
}

TEST_F(SettingsEnvironment, AnIsaThisCpuLacksWarns) {
  GemmIsa missing = GemmIsa::Auto;
  for (GemmIsa isa : {GemmIsa::Avx512, GemmIsa::Avx2}) {
    if (!gemm_isa_supported(isa)) missing = isa;
  }
  if (missing == GemmIsa::Auto) GTEST_SKIP() << "this CPU has every GEMM ISA";
  const char* name = missing == GemmIsa::Avx512 ? "avx512" : "avx2";
  EXPECT_EXIT(
      {
        ::setenv("TOWERLAB_GEMM_ISA", name, 1);
        std::exit(gemm_isa() != missing ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      std::string("towerlab: TOWERLAB_GEMM_ISA=") + name + " is not supported by this CPU");
}

TEST_F(SettingsEnvironment, TheBf16GemmKernelIsTakenFromTheEnvironment) {
  EXPECT_EXIT(
      {
        ::setenv("TOWERLAB_BF16_GEMM", "widen", 1);
        std::exit(bf16_gemm_kernel() == Bf16GemmKernel::Widen && !bf16_gemm_runs_vdpbf16ps() ? 0
                                                                                             : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        ::setenv("TOWERLAB_BF16_GEMM", "vdpbf16", 1);
        std::exit(bf16_gemm_kernel() == Bf16GemmKernel::Auto ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "towerlab: TOWERLAB_BF16_GEMM=vdpbf16 is not one of auto, widen, avx512bf16; the default "
      "is used");
  // avx512bf16: taken where the CPU has it (and then runs whatever the float32 ISA),
  // refused with a warning where it does not.
  if (bf16_gemm_kernel_supported(Bf16GemmKernel::Avx512Bf16)) {
    EXPECT_EXIT(
        {
          ::setenv("TOWERLAB_BF16_GEMM", "avx512bf16", 1);
          std::exit(bf16_gemm_kernel() == Bf16GemmKernel::Avx512Bf16 && bf16_gemm_runs_vdpbf16ps()
                        ? 0
                        : 1);
        },
        ::testing::ExitedWithCode(0), "");
  } else {
    EXPECT_EXIT(
        {
          ::setenv("TOWERLAB_BF16_GEMM", "avx512bf16", 1);
          std::exit(bf16_gemm_kernel() == Bf16GemmKernel::Auto ? 0 : 1);
        },
        ::testing::ExitedWithCode(0),
        "towerlab: TOWERLAB_BF16_GEMM=avx512bf16 is not supported by this CPU");
  }
}

}  // namespace
}  // namespace towerlab::testing
