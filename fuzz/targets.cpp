#include "fuzz/targets.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iostream>
#include <system_error>
#include <vector>

#include "engine/device.h"
#include "engine/error.h"
#include "engine/idx.h"
#include "engine/safetensors.h"
#include "samples/fashion_mnist/options.h"

namespace towerlab::fuzz {

namespace {

// The fuzzer's bytes behind a path, without touching the disk: an anonymous
// in-memory file (memfd) seen through /proc/self/fd, which the parsers open and
// read like any other file.
class MemoryFile {
 public:
  MemoryFile(const std::uint8_t* data, std::size_t size)
      : fd_(::memfd_create("towerlab-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "memfd_create");
    for (std::size_t done = 0; done < size;) {
      const ::ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) {
        ::close(fd_);
        throw std::system_error(errno, std::generic_category(), "write to memfd");
      }
      done += static_cast<std::size_t>(n);
    }
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

void require(bool promise_kept, const std::string& promise) {
  if (!promise_kept) throw BrokenPromise(promise);
}

}  // namespace

void safetensors(const std::uint8_t* data, std::size_t size) {
  const MemoryFile file(data, size);
  try {
    const SafetensorsHeader header = read_safetensors_header(file.path());
    require(header.data_offset + header.data_size == size,
            "the header and the data section cover the whole file");
    const auto tensors = load_safetensors(file.path(), Device::cpu()).tensors;
    require(tensors.size() == header.entries.size(), "one tensor per header entry");
    for (const SafetensorsEntry& e : header.entries) {
      const Tensor& t = tensors.at(e.name);
      require(t.shape() == e.shape && t.dtype() == e.dtype,
              "tensor '" + e.name + "' has the shape and dtype of its entry");
      require(std::uint64_t(t.numel()) * dtype_size(e.dtype) == e.data_end - e.data_begin,
              "tensor '" + e.name + "' fills its byte range");
    }
    // The model check runs on whatever the header holds.
    (void)checkpoint_mismatch(file.path(), {{"conv1/weight", Shape{32, 1, 3, 3}}}, header.entries);
  } catch (const IoError&) {
  }
}

void idx(const std::uint8_t* data, std::size_t size) {
  const MemoryFile file(data, size);
  try {
    const IdxArray array = read_idx(file.path());
    // A zero dimension makes the product 0 however large the others are (found by
    // this fuzzer: the harness itself overflowed multiplying them in order).
    std::uint64_t count = 1;
    bool overflow = false;
    for (const std::int64_t d : array.dims) {
      require(d >= 0, "dimensions are not negative");
      overflow = overflow || __builtin_mul_overflow(count, std::uint64_t(d), &count);
    }
    const bool empty = std::find(array.dims.begin(), array.dims.end(), 0) != array.dims.end();
    require(empty ? array.data.empty() : !overflow && count == array.data.size(),
            "the data holds product(dims) values");
  } catch (const IoError&) {
  }
}

void config(const std::uint8_t* data, std::size_t size) {
  const MemoryFile file(data, size);
  std::string path = file.path();
  std::string program = "fashion_mnist", flag = "--config";
  char* argv[] = {program.data(), flag.data(), path.data(), nullptr};
  // The parser prints its complaints; a fuzzer runs millions of them.
  std::streambuf* err = std::cerr.rdbuf(nullptr);
  std::streambuf* out = std::cout.rdbuf(nullptr);
  sample::Options options;
  std::optional<int> code;
  try {
    code = sample::parse_options(3, argv, options);
  } catch (...) {
    std::cerr.rdbuf(err);
    std::cout.rdbuf(out);
    throw;
  }
  std::cerr.rdbuf(err);
  std::cout.rdbuf(out);
  if (!code) {  // accepted: the values are in range
    require(options.epochs > 0 && options.batch > 0 && options.lr > 0 && options.steps >= 0,
            "an accepted config has values in range");
  }
}

void device(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const Device d = Device::parse(text);
    require(Device::parse(d.str()) == d, "a parsed device parses back from its str()");
  } catch (const DeviceError&) {
  }
  try {
    const std::vector<Device> list = parse_device_list(text);
    require(!list.empty(), "a parsed device list is not empty");
  } catch (const DeviceError&) {
  }
}

Target target_by_name(std::string_view name) {
  if (name == "safetensors") return &safetensors;
  if (name == "idx") return &idx;
  if (name == "config") return &config;
  if (name == "device") return &device;
  return nullptr;
}

}  // namespace towerlab::fuzz
