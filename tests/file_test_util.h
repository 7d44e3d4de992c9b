// Helpers for the file-format tests: a scratch directory that cleans up after
// itself, raw byte files, and a gzip writer that needs no zlib (stored blocks), so
// the tests depend only on the library under test. Header-only: the test
// CMakeLists compiles *_test.cpp files and the two shared helpers only.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace towerlab::testing {

// A fresh directory under the test temp dir, removed (with its contents) on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Names of the entries in the directory, sorted (hidden ones included).
  std::vector<std::string> list() const;

 private:
  std::filesystem::path path_;
};

inline ScratchDir::ScratchDir() {
  std::string pattern =
      (std::filesystem::path(::testing::TempDir()) / "towerlab-io-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + pattern);
  path_ = pattern;
}

inline ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ignored);
  std::filesystem::remove_all(path_, ignored);
}

inline std::vector<std::string> ScratchDir::list() const {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(path_)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

namespace detail {

inline std::uint32_t crc32(const std::string& bytes) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

inline void put_le32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace detail

inline std::string gzip_stored(const std::string& bytes) {
  // RFC 1952 header: magic, deflate, no flags, no mtime, no extra flags, OS unknown.
  std::string out = {'\x1f', '\x8b', '\x08', 0, 0, 0, 0, 0, 0, '\xff'};
  std::size_t pos = 0;
  do {  // RFC 1951 stored blocks: BFINAL/BTYPE=00, LEN, NLEN, then the bytes
    const std::size_t n = std::min<std::size_t>(bytes.size() - pos, 65535);
    const bool last = pos + n == bytes.size();
    out.push_back(last ? 1 : 0);
    out.push_back(static_cast<char>(n & 0xFF));
    out.push_back(static_cast<char>(n >> 8));
    out.push_back(static_cast<char>(~n & 0xFF));
    out.push_back(static_cast<char>((~n >> 8) & 0xFF));
    out.append(bytes, pos, n);
    pos += n;
  } while (pos < bytes.size());
  detail::put_le32(out, detail::crc32(bytes));
  detail::put_le32(out, static_cast<std::uint32_t>(bytes.size()));
  return out;
}

inline int run_command(const std::string& command) {
  const int status = std::system(command.c_str());
  return (status != -1 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
}

inline bool have_python_numpy() {
  return ::access("/usr/bin/python3", X_OK) == 0 &&
         run_command("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

}  // namespace towerlab::testing
