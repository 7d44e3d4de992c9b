// Replays every input of fuzz/corpus/<target>/ and fuzz/regressions/<target>/
// through the fuzz targets (fuzz/targets.h) in the ordinary builds: a crash that a
// fuzzer once found stays fixed, and the seed corpus keeps parsing as it did.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/targets.h"

namespace towerlab {
namespace {

namespace fs = std::filesystem;

// The repository's fuzz/ folder, so that the binary finds it wherever it runs (a
// copy of the build on another machine too): $TOWERLAB_FUZZ_DIR when set, else the
// source tree it was built from, else the first fuzz/ with a corpus/ in a folder
// above the binary. Empty when none is found.
fs::path fuzz_dir() {
  if (const char* dir = std::getenv("TOWERLAB_FUZZ_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  if (fs::is_directory(fs::path(TOWERLAB_SOURCE_FUZZ_DIR) / "corpus")) {
    return TOWERLAB_SOURCE_FUZZ_DIR;
  }
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  for (fs::path dir = exe.parent_path(); !error && dir.has_relative_path();
       dir = dir.parent_path()) {
    if (fs::is_directory(dir / "fuzz" / "corpus")) return dir / "fuzz";
  }
  return {};
}

std::vector<fs::path> inputs_of(const std::string& target) {
  std::vector<fs::path> files;
  const fs::path root = fuzz_dir();
  if (root.empty()) return files;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = root / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
  }
  return files;
}

std::vector<std::uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class FuzzCorpus : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzCorpus, EveryInputKeepsTheParsersPromises) {
  const fuzz::Target target = fuzz::target_by_name(GetParam());
  ASSERT_NE(target, nullptr);
  const std::vector<fs::path> files = inputs_of(GetParam());
  ASSERT_GE(files.size(), 3u) << "the seed corpus of " << GetParam() << " is missing in '"
                              << fuzz_dir().string()
                              << "' (set TOWERLAB_FUZZ_DIR to the repository's fuzz/)";
  for (const fs::path& file : files) {
    const std::vector<std::uint8_t> bytes = read_bytes(file);
    EXPECT_NO_THROW(target(bytes.data(), bytes.size())) << file;
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpus,
                         ::testing::Values("safetensors", "idx", "config", "device"));

TEST(FuzzTargets, DocumentedErrorsAreOutcomesNotFindings) {
  // A bad device string is a DeviceError, a garbage file an IoError, a bad config
  // an exit code: the targets accept each as the parser's documented answer.
  for (const std::string text : {"cuda:3", "tpu:0", ",,", "cpu:7"}) {
    EXPECT_NO_THROW(fuzz::device(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()))
        << text;
  }
  const std::string garbage = "\xff\xff\xff\xff\xff\xff\xff\xff{";
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(garbage.data());
  EXPECT_NO_THROW(fuzz::safetensors(bytes, garbage.size()));
  EXPECT_NO_THROW(fuzz::idx(bytes, garbage.size()));
  EXPECT_NO_THROW(fuzz::config(bytes, garbage.size()));
  EXPECT_EQ(fuzz::target_by_name("nonsense"), nullptr);
}

}  // namespace
}  // namespace towerlab
