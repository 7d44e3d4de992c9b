#include "engine/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <sstream>
#include <system_error>
#include <utility>

#include "engine/clock.h"
#include "engine/error.h"

namespace towerlab {

std::string os_error_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

namespace {

// Unique within the process (the counter) and across processes (the pid); the
// clock bits only make a stale name from an earlier process with the same pid
// unlikely, and O_EXCL makes a collision harmless anyway.
std::string temp_name_for(const std::string& file_name) {
  static std::atomic<std::uint64_t> counter{0};
  const auto ticks = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
  std::ostringstream os;
  os << '.' << file_name << ".tmp-" << ::getpid() << '-' << counter.fetch_add(1) << '-' << std::hex
     << ((ticks * 0x9E3779B97F4A7C15ull) >> 40);
  return os.str();
}

std::atomic<void (*)(const std::string&)> g_commit_hook{nullptr};

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const std::filesystem::path target(path_);
  const std::string file_name = target.filename().string();
  if (file_name.empty() || file_name == "." || file_name == "..") {
    TL_THROW(IoError, "cannot save " << path_ << ": the path names a directory, not a file");
  }
  dir_ = target.has_parent_path() ? target.parent_path().string() : std::string(".");
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp_path_ = (std::filesystem::path(dir_) / temp_name_for(file_name)).string();
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    if (errno != EEXIST) break;
  }
  const int error = errno;
  temp_path_.clear();  // nothing was created, nothing to remove
  TL_THROW(IoError, "cannot save " << path_ << ": cannot create a temporary file in " << dir_
                                   << ": " << os_error_text(error));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void AtomicFile::fail(const std::string& step, int error) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
  temp_path_.clear();
  TL_THROW(IoError, "cannot save " << path_ << ": " << step << " failed: " << os_error_text(error));
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  TL_CHECK(fd_ >= 0, IoError, "cannot save " << path_ << ": the file is closed");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write", errno);
    if (n == 0) fail("write", EIO);  // no progress and no error: do not spin
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void set_atomic_commit_hook(void (*hook)(const std::string& target)) {
  g_commit_hook.store(hook);
}

void AtomicFile::commit() {
  TL_CHECK(fd_ >= 0 && !committed_, IoError, "cannot save " << path_ << ": the file is closed");
  // The data must be on disk before the rename makes it visible under the real
  // name; otherwise a power cut can leave a renamed file with missing blocks.
  if (::fsync(fd_) != 0) fail("fsync", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail("close", errno);
  if (auto hook = g_commit_hook.load()) hook(path_);
  rename_over_target();
}

void AtomicFile::publish() {
  TL_CHECK(fd_ >= 0 && !committed_, IoError,
           "cannot save " << path_ << ": the file is closed or already published");
  if (::fsync(fd_) != 0) fail("fsync", errno);
  rename_over_target();
}

void AtomicFile::rename_over_target() {
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("rename", errno);
  committed_ = true;
  // The rename itself lives in the directory; sync it so that it survives a crash.
  // Some file systems cannot fsync a directory (EINVAL): the rename is still atomic.
  const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) fail("opening the directory " + dir_, errno);
  const int status = ::fsync(dir_fd);
  const int error = errno;
  ::close(dir_fd);
  if (status != 0 && error != EINVAL) fail("fsync of the directory " + dir_, error);
}

ReadOnlyFile::ReadOnlyFile(const std::string& path, std::string what) : what_(std::move(what)) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) TL_THROW(IoError, what_ << ": cannot open: " << os_error_text(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    const int error = errno;
    ::close(fd_);
    TL_THROW(IoError, what_ << ": cannot stat: " << os_error_text(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd_);
    TL_THROW(IoError, what_ << ": not a regular file");
  }
  size_ = static_cast<std::uint64_t>(info.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read_at(std::uint64_t offset, void* data, std::size_t bytes) const {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) TL_THROW(IoError, what_ << ": read failed: " << os_error_text(errno));
    // The size was checked against fstat: a short read means the file shrank under us.
    if (n == 0) TL_THROW(IoError, what_ << ": the file ended early (was it truncated?)");
    p += n;
    offset += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
}

}  // namespace towerlab
