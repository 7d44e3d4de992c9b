#include "engine/device.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <sstream>
#include <thread>

#include "engine/error.h"

#if TOWERLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace towerlab {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad_device_string(std::string_view text, std::string_view why) {
  TL_THROW(DeviceError, "cannot parse device '" << text << "': " << why
                                                << " (expected cpu, cuda:N, /cpu:0 or /gpu:N)");
}

}  // namespace

Device Device::parse(std::string_view text) {
  const std::string s = lower(trim(text));
  std::string_view rest = s;
  if (rest.starts_with("/device:")) {
    rest.remove_prefix(8);
  } else if (rest.starts_with("/")) {
    rest.remove_prefix(1);
  }

  DeviceType type;
  if (rest.starts_with("cpu")) {
    type = DeviceType::CPU;
    rest.remove_prefix(3);
  } else if (rest.starts_with("cuda")) {
    type = DeviceType::CUDA;
    rest.remove_prefix(4);
  } else if (rest.starts_with("gpu")) {
    type = DeviceType::CUDA;
    rest.remove_prefix(3);
  } else {
    bad_device_string(text, "unknown device type");
  }

  int index = 0;
  if (!rest.empty()) {
    if (rest.front() != ':') bad_device_string(text, "expected ':' after the device type");
    rest.remove_prefix(1);
    if (rest.empty()) bad_device_string(text, "missing device index after ':'");
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), index);
    if (ec != std::errc() || end != rest.data() + rest.size() || index < 0) {
      bad_device_string(text, "the device index must be a non-negative integer");
    }
  }
  if (type == DeviceType::CPU && index != 0) {
    bad_device_string(text, "there is one CPU device, cpu:0 (use a repeated 'cpu' for towers)");
  }
  return {type, index};
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::vector<Device> parse_device_list(std::string_view text) {
  std::vector<Device> devices;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = trim(text.substr(start, comma - start));
    TL_CHECK(
        !item.empty(), DeviceError,
        "device list '" << text << "' has an empty entry (expected e.g. cpu,cpu or cuda:0,cuda:1)");
    devices.push_back(Device::parse(item));
    start = comma + 1;
  }
  return devices;
}

namespace {

// cudaGetDeviceCount's answer, asked once: it cannot change while the process
// runs, and asking when no driver is installed is slow. `error` keeps why the
// count is 0 when the runtime failed (no driver, no device, a driver too old).
struct CudaDeviceCount {
  int count = 0;
  std::string error;
};

const CudaDeviceCount& cuda_devices() {
  static const CudaDeviceCount answer = [] {
    CudaDeviceCount a;
#if TOWERLAB_WITH_CUDA
    const cudaError_t err = cudaGetDeviceCount(&a.count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      a.count = 0;
      a.error = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    }
#endif
    return a;
  }();
  return answer;
}

}  // namespace

int cuda_device_count() {
  return cuda_devices().count;
}

std::string cuda_device_count_error() {
  return cuda_devices().error;
}

std::vector<Device> available_devices() {
  std::vector<Device> devices{Device::cpu()};
  for (int i = 0; i < cuda_device_count(); ++i) devices.push_back(Device::cuda(i));
  return devices;
}

void check_available(const Device& device) {
  if (device.is_cpu()) return;
  if (device.index < cuda_device_count()) return;
  std::ostringstream present;
  const auto devices = available_devices();
  for (std::size_t i = 0; i < devices.size(); ++i) present << (i ? ", " : "") << devices[i].str();
  std::string why;
#if TOWERLAB_WITH_CUDA
  if (cuda_device_count() == 0) why = " (no CUDA device is visible to this process)";
#else
  why = " (this build of towerlab has no CUDA backend)";
#endif
  TL_THROW(DeviceError,
           device.str() << " is not available" << why << "; devices present: " << present.str());
}

std::string describe(const Device& device) {
  std::ostringstream os;
  os << device.str();
  if (device.is_cpu()) {
    os << " (" << std::max(1u, std::thread::hardware_concurrency()) << " hardware threads)";
    return os.str();
  }
#if TOWERLAB_WITH_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index) == cudaSuccess) {
    os << " (" << prop.name << ", " << (prop.totalGlobalMem >> 30) << " GiB, sm_" << prop.major
       << prop.minor << ")";
  } else {
    (void)cudaGetLastError();
  }
#endif
  return os.str();
}

}  // namespace towerlab
