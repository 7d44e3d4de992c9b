#include "resume.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>

#include "parallel/collective_checkpoint.h"

using namespace towerlab;

namespace sample {

namespace {

namespace fs = std::filesystem;

// Doubles as the shortest text that reads back as the same bits.
std::string exact(double v) {
  char buffer[32];
  return std::string(buffer, std::to_chars(buffer, buffer + sizeof buffer, v).ptr);
}

template <class T>
T read_key(const std::map<std::string, std::string>& metadata, const std::string& key) {
  const auto it = metadata.find("sample/" + key);
  TL_CHECK(it != metadata.end(), IoError, "no " << key << " in the checkpoint");
  T value{};
  const char* end = it->second.data() + it->second.size();
  const auto [ptr, error] = std::from_chars(it->second.data(), end, value);
  TL_CHECK(error == std::errc() && ptr == end, IoError,
           "bad " << key << " '" << it->second << "' in the checkpoint");
  return value;
}

const std::regex kCheckpointName("step-([0-9]{6,})\\.safetensors");

volatile sig_atomic_t g_stop = 0;
unsigned g_stop_deadline = kStopDeadlineSeconds;  // set before the handler is installed

extern "C" void on_sigterm(int) {
  if (g_stop != 0) {  // the second: end now, as SIGTERM would have
    ::signal(SIGTERM, SIG_DFL);
    ::raise(SIGTERM);
    return;
  }
  g_stop = 1;
  ::alarm(g_stop_deadline);
}

std::string g_pause_target;  // set before the hook is installed, read-only after

void pause_in_save(const std::string& target) {
  if (target != g_pause_target) return;
  std::fprintf(stderr, "fashion_mnist: test hook: pid %d paused in the save of %s\n",
               int(::getpid()), target.c_str());
  std::fflush(stderr);
  for (;;) ::pause();
}

}  // namespace

std::map<std::string, std::string> Position::metadata() const {
  return {{"sample/epoch", std::to_string(epoch)},
          {"sample/epoch_step", std::to_string(epoch_step)},
          {"sample/epoch_loss_sum", exact(epoch_loss_sum)},
          {"sample/epoch_images", std::to_string(epoch_images)},
          {"sample/summaries_bytes", std::to_string(summaries_bytes)},
          {"sample/train_loss", exact(train_loss)},
          {"sample/test_accuracy", exact(test_accuracy)},
          {"sample/global_step", std::to_string(global_step)}};
}

Position Position::from(const std::map<std::string, std::string>& m) {
  Position p;
  p.epoch = read_key<std::int64_t>(m, "epoch");
  p.epoch_step = read_key<std::int64_t>(m, "epoch_step");
  p.epoch_loss_sum = read_key<double>(m, "epoch_loss_sum");
  p.epoch_images = read_key<std::int64_t>(m, "epoch_images");
  p.summaries_bytes = read_key<std::uint64_t>(m, "summaries_bytes");
  p.train_loss = read_key<double>(m, "train_loss");
  p.test_accuracy = read_key<double>(m, "test_accuracy");
  p.global_step = read_key<std::int64_t>(m, "global_step");
  return p;
}

CheckpointDir::CheckpointDir(std::string dir, int keep, ProcessGroup& group)
    : dir_(std::move(dir)), keep_(keep), group_(group) {
  on_rank0(group_, "checkpoint directory " + dir_, [this] {
    std::error_code error;
    fs::create_directory(dir_, error);
    TL_CHECK(!error, IoError,
             "--checkpoint-dir " << dir_ << ": cannot create it: " << error.message());
    // ".step-000012.safetensors.tmp-<pid>-...": a save that a kill interrupted.
    for (const fs::directory_entry& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with(".step-") && name.find(".safetensors.tmp-") != std::string::npos) {
        fs::remove(entry.path(), error);
      }
    }
    return std::string();
  });
}

std::string CheckpointDir::path_of(std::int64_t global_step) const {
  char name[64];
  std::snprintf(name, sizeof name, "step-%06lld.safetensors", static_cast<long long>(global_step));
  return (fs::path(dir_) / name).string();
}

std::optional<CheckpointDir::Restored> CheckpointDir::restore_newest(
    Trainer& trainer, const std::map<std::string, std::string>& expected) {
  // Rank 0's listing, newest first: the ranks may not share a file system.
  const std::string listing = on_rank0(group_, "checkpoint directory " + dir_, [this] {
    std::vector<std::pair<std::int64_t, std::string>> found;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir_)) {
      std::smatch match;
      const std::string name = entry.path().filename().string();
      if (std::regex_match(name, match, kCheckpointName)) {
        found.emplace_back(std::stoll(match[1].str()), entry.path().string());
      }
    }
    std::sort(found.rbegin(), found.rend());
    std::string text;
    for (const auto& [step, path] : found) text += path + "\n";
    return text;
  });
  std::istringstream in(listing);
  std::string skipped;
  for (std::string path; std::getline(in, path);) {
    try {
      const CheckpointInfo info = trainer.restore_state(path, expected);
      return Restored{path, Position::from(info.metadata)};
    } catch (const IoError& e) {
      std::fprintf(stderr, "fashion_mnist: warning: skipping the checkpoint %s: %s\n", path.c_str(),
                   e.what());
      skipped += (skipped.empty() ? "" : ", ") + path;
    }
  }
  TL_CHECK(skipped.empty(), IoError,
           "--checkpoint-dir " << dir_ << ": no usable checkpoint (unreadable: " << skipped
                               << "); remove them to start over");
  return std::nullopt;
}

std::string CheckpointDir::save(Trainer& trainer, const Position& at,
                                const std::map<std::string, std::string>& expected) {
  std::map<std::string, std::string> metadata = at.metadata();
  metadata.insert(expected.begin(), expected.end());  // with the model's name
  const std::string path = path_of(at.global_step);
  trainer.save_state(path, metadata);
  on_rank0(group_, "checkpoint directory " + dir_ + ": old checkpoints", [this] {
    std::vector<fs::path> found;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (std::regex_match(name, kCheckpointName)) found.push_back(entry.path());
    }
    std::sort(found.begin(), found.end());  // zero-padded: oldest first
    for (std::size_t i = 0; i + std::size_t(keep_) < found.size(); ++i) fs::remove(found[i]);
    return std::string();
  });
  return path;
}

void stop_on_sigterm() {
  if (const char* seconds = std::getenv("TOWERLAB_TEST_STOP_DEADLINE_S")) {
    const int value = std::atoi(seconds);
    if (value > 0) g_stop_deadline = unsigned(value);
  }
  struct sigaction action {};
  action.sa_handler = on_sigterm;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
}

bool stop_requested(ProcessGroup& group) {
  double stop = g_stop != 0 ? 1.0 : 0.0;
  if (group.size() > 1) group.allreduce_sum(std::span<double>(&stop, 1), "preemption check");
  return stop > 0.0;
}

void pause_if_asked(std::int64_t global_step, int rank) {
  const char* step = std::getenv("TOWERLAB_TEST_PAUSE_AFTER_STEP");
  if (step == nullptr || std::atoll(step) != global_step || rank != 0) return;
  std::fprintf(stderr, "fashion_mnist: test hook: pid %d paused after step %lld\n", int(::getpid()),
               static_cast<long long>(global_step));
  std::fflush(stderr);
  // Polled: the handler may run on another thread (a tower's), which pause() would miss.
  while (g_stop == 0) ::usleep(10000);
}

void bound_the_exit() {
  ::alarm(kExitSeconds);
}

void kill_if_asked(std::int64_t global_step, int rank) {
  const char* step = std::getenv("TOWERLAB_TEST_KILL_AFTER_STEP");
  const char* at_rank = std::getenv("TOWERLAB_TEST_KILL_RANK");
  if (step != nullptr && std::atoll(step) == global_step &&
      (at_rank == nullptr ? 0 : std::atoi(at_rank)) == rank) {
    std::fflush(stdout);
    ::raise(SIGKILL);
  }
}

void pause_saves_if_asked(const CheckpointDir& dir) {
  const char* step = std::getenv("TOWERLAB_TEST_PAUSE_IN_SAVE");
  if (step == nullptr) return;
  g_pause_target = dir.path_of(std::atoll(step));
  set_atomic_commit_hook(pause_in_save);
}

std::string resume_without() {
  const char* part = std::getenv("TOWERLAB_TEST_RESUME_WITHOUT");
  return part == nullptr ? "" : part;
}

}  // namespace sample
