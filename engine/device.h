// Devices: "cpu" and "cuda:N". TensorFlow's device strings ("/cpu:0", "/gpu:1",
// "/device:GPU:1") parse too. A Device is a plain value; it
// says nothing about whether the hardware exists until check_available() asks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace towerlab {

enum class DeviceType : std::uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // always 0 for the CPU; the CUDA ordinal otherwise

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index) { return {DeviceType::CUDA, index}; }

  // Parses "cpu", "cpu:0", "cuda", "cuda:N", "gpu:N", "/cpu:0", "/gpu:N",
  // "/device:GPU:N" (case-insensitive). Throws DeviceError naming the string
  // and the accepted forms. Does not check that the device exists.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu" or "cuda:N"

  friend bool operator==(const Device&, const Device&) = default;
};

// Parses a comma-separated list ("cpu,cpu", "cuda:0, cuda:1"); repeats are kept,
// since a repeated device is how virtual devices are asked for.
std::vector<Device> parse_device_list(std::string_view text);

// Number of CUDA devices this process can use: 0 when the build has no CUDA
// backend, when there is no driver, or when no GPU is visible.
int cuda_device_count();

// Why cuda_device_count() is 0 when the CUDA runtime refused to count: the error
// cudaGetDeviceCount returned, by name and text ("cudaErrorNoDevice: no
// CUDA-capable device is detected"). Empty when it succeeded (with any count) and
// in a build without the CUDA backend.
std::string cuda_device_count_error();

// The devices present: "cpu" first, then every CUDA device.
std::vector<Device> available_devices();

// Throws DeviceError when `device` is not present, listing those that are:
// "cuda:3 is not available; devices present: cpu, cuda:0".
void check_available(const Device& device);

// A human-readable description: "cpu (2 threads)", "cuda:0 (NVIDIA H100, 80 GiB, sm_90)".
std::string describe(const Device& device);

}  // namespace towerlab
