// Checkpoints are written atomically: a failed save (no directory, no permission, a
// full disk, a target that is a directory) throws IoError and leaves the old file
// whole and no temporary file behind; a writer killed with SIGKILL at any moment
// leaves the old checkpoint or the complete new one.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "engine/safetensors.h"
#include "file_test_util.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

Tensor filled(std::int64_t n, float value) {
  Tensor t = Tensor::empty({n}, Device::cpu());
  std::fill_n(t.data<float>(), n, value);
  return t;
}

// Fixture: a directory holding a good checkpoint "model.safetensors" (w = [1,2,3]).
class AtomicSave : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("model.safetensors");
    save_safetensors(path_, {{"w", make({1, 2, 3})}}, {{"version", "old"}});
  }
  static Tensor make(const std::vector<float>& v) {
    return Tensor::from_host<float>(v, {static_cast<std::int64_t>(v.size())},
                                    default_stream(Device::cpu()));
  }
  void expect_old_file_intact() {
    const auto header = read_safetensors_header(path_);
    EXPECT_EQ(header.metadata.at("version"), "old");
    EXPECT_EQ(load_safetensors(path_, Device::cpu()).tensors.at("w").to_host<float>(),
              (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(dir_.list(), std::vector<std::string>{"model.safetensors"})
        << "no temporary file may be left behind";
  }
  ScratchDir dir_;
  std::string path_;
};

TEST_F(AtomicSave, ReplacesTheOldFileAndLeavesNoTemporary) {
  save_safetensors(path_, {{"w", make({4, 5})}}, {{"version", "new"}});
  EXPECT_EQ(read_safetensors_header(path_).metadata.at("version"), "new");
  EXPECT_EQ(load_safetensors(path_, Device::cpu()).tensors.at("w").to_host<float>(),
            (std::vector<float>{4, 5}));
  EXPECT_EQ(dir_.list(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(AtomicSave, FailsCleanlyWhenTheDirectoryIsMissing) {
  const std::string target = dir_.file("no/such/dir/model.safetensors");
  EXPECT_THROW_WITH(save_safetensors(target, {{"w", make({9})}}), IoError,
                    "cannot save " + target + ": cannot create a temporary file in " +
                        dir_.file("no/such/dir") + ": No such file or directory");
  expect_old_file_intact();
}

TEST_F(AtomicSave, FailsCleanlyWhenAParentIsAFile) {
  const std::string target = path_ + "/inner.safetensors";
  EXPECT_THROW_WITH(save_safetensors(target, {{"w", make({9})}}), IoError, "Not a directory");
  expect_old_file_intact();
}

TEST_F(AtomicSave, FailsCleanlyWhenTheTargetIsADirectory) {
  const std::string target = dir_.file("sub");
  ASSERT_EQ(::mkdir(target.c_str(), 0755), 0);
  EXPECT_THROW_WITH(save_safetensors(target, {{"w", make({9})}}), IoError,
                    "cannot save " + target + ": rename failed: Is a directory");
  ::rmdir(target.c_str());
  expect_old_file_intact();
}

TEST_F(AtomicSave, FailsCleanlyInAReadOnlyDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root, which ignores directory permissions";
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0555), 0);
  EXPECT_THROW_WITH(save_safetensors(path_, {{"w", make({9})}}), IoError, "Permission denied");
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  expect_old_file_intact();
}

// A full disk seen from the writer: a file-size limit makes write() fail part-way with
// EFBIG, the same path as ENOSPC (a short write, then an error). Works as root too.
TEST_F(AtomicSave, FailsCleanlyWhenAWriteFailsPartWay) {
  struct LimitGuard {
    rlimit saved{};
    void (*saved_handler)(int) = nullptr;
    LimitGuard() {
      ::getrlimit(RLIMIT_FSIZE, &saved);
      saved_handler = ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of a signal
      rlimit small = saved;
      small.rlim_cur = 1 << 20;
      ::setrlimit(RLIMIT_FSIZE, &small);
    }
    ~LimitGuard() {
      ::setrlimit(RLIMIT_FSIZE, &saved);
      ::signal(SIGXFSZ, saved_handler);
    }
  };
  Tensor big = filled(1 << 20, 7.0f);  // 4 MB, over the 1 MB limit
  {
    LimitGuard limit;
    EXPECT_THROW_WITH(save_safetensors(path_, {{"w", big}}), IoError,
                      "cannot save " + path_ + ": write failed: File too large");
  }
  expect_old_file_intact();
}

// SIGKILL a process that keeps saving 64 MB checkpoints over one path, at several
// moments; whatever it was doing, the path holds a whole checkpoint that loads.
TEST(AtomicSaveKill, LeavesTheOldOrTheNewCheckpointWhole) {
  ScratchDir dir;
  const std::string path = dir.file("model.safetensors");
  constexpr std::int64_t kFloats = std::int64_t{16} << 20;  // 64 MB
  // Made before the fork: the child only writes (no allocation, no stream creation).
  const Tensor ones = filled(kFloats, 1.0f), twos = filled(kFloats, 2.0f);
  save_safetensors(path, {{"w", ones}}, {{"fill", "1"}});

  int killed_with_temp_file = 0;
  for (int round = 0; round < 4; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      for (int i = 0;; ++i) {
        try {
          const bool two = (i + round) % 2 == 0;
          save_safetensors(path, {{"w", two ? twos : ones}}, {{"fill", two ? "2" : "1"}});
        } catch (...) {
          ::_exit(3);
        }
      }
    }
    // Let it start writing (a temporary file appears), then a little longer each round.
    for (int wait = 0; wait < 10000 && dir.list().size() < 2; ++wait) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(3 + 40 * round));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the writer died on its own (status " << status << ")";

    const auto header = read_safetensors_header(path);
    const std::string fill = header.metadata.at("fill");
    const float expected = fill == "2" ? 2.0f : 1.0f;
    const std::vector<float> values =
        load_safetensors(path, Device::cpu()).tensors.at("w").to_host<float>();
    ASSERT_EQ(values.size(), static_cast<std::size_t>(kFloats));
    EXPECT_EQ(std::count(values.begin(), values.end(), expected), kFloats)
        << "round " << round << ": a checkpoint marked fill=" << fill << " holds other values";

    // Leftovers are hidden temporaries that no "*.safetensors" glob would pick up.
    for (const std::string& name : dir.list()) {
      if (name == "model.safetensors") continue;
      ++killed_with_temp_file;
      EXPECT_EQ(name.rfind(".model.safetensors.tmp-", 0), 0u) << name;
      EXPECT_NE(std::filesystem::path(name).extension(), ".safetensors") << name;
      std::filesystem::remove(dir.path() / name);
    }
  }
  std::cout << "[          ] " << killed_with_temp_file
            << " of 4 kills landed while a temporary file existed\n";
}

}  // namespace
}  // namespace towerlab::testing
