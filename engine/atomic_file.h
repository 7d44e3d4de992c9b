// Files that appear whole or not at all, and positional reads that report every
// failure. Checkpoints use both; anything else that must never leave a torn file
// behind (a config, a log of results) can use AtomicFile too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace towerlab {

// Writes a file atomically:
//
//   AtomicFile file("runs/model.safetensors");  // creates a temporary file beside it
//   file.write(header.data(), header.size());    // as often as needed
//   file.commit();                               // fsync, rename over the target, fsync the dir
//
// The temporary file is ".<name>.tmp-<pid>-<n>-<random>" in the target's directory
// (the same file system, so the rename is atomic), created with O_EXCL so that two
// writers never share one. If commit() is not reached (an exception, an early
// return) the destructor removes it and the target is untouched. Errors throw
// IoError naming the target, the step that failed and strerror: "cannot save
// runs/model.safetensors: write failed: No space left on device".
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t bytes);
  void commit();
  // For a log: renames what was written so far over the target now and keeps the
  // file open, so that later writes append to the target (each visible as soon as
  // it is written). A run that fails before its first publish() leaves the old
  // target untouched.
  void publish();
  bool published() const { return committed_; }

  const std::string& temp_path() const { return temp_path_; }

 private:
  [[noreturn]] void fail(const std::string& step, int error);
  // Renames the temporary file over the target and syncs the directory.
  void rename_over_target();

  std::string path_;
  std::string dir_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// For fault-injection tests: called by commit() with the target's path once the
// data is synced, before the rename publishes it (where a crash must leave the old
// target and its directory intact). One hook for the process; nullptr removes it.
void set_atomic_commit_hook(void (*hook)(const std::string& target));

// A file opened for reading with its size; read_at() reads exactly `bytes` or throws
// IoError. Error messages start with `what` ("safetensors file runs/model.safetensors").
class ReadOnlyFile {
 public:
  ReadOnlyFile(const std::string& path, std::string what);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  std::uint64_t size() const { return size_; }
  void read_at(std::uint64_t offset, void* data, std::size_t bytes) const;

 private:
  std::string what_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// strerror(error) without strerror's shared buffer.
std::string os_error_text(int error);

}  // namespace towerlab
