// What an op family's <Op>VsTorch.WritesCases test shares: tests/ops_vs_torch_test.py
// (ctest ops_vs_torch) runs those cases with TOWERLAB_OPS_VS_TORCH_DIR set, reads
// the safetensors file each writes there (inputs and towerlab's results, named
// "<backend>_<dtype>/<what>"), computes PyTorch's results from the same inputs and
// compares. Run without the variable, a case writes to a scratch directory and
// reads the file back. Header-only, as file_test_util.h.
//
//   std::vector<std::pair<std::string, Tensor>> out;
//   for (const TorchCaseBackend& b : torch_case_backends()) {
//     const Tensor x = b.make(x_values, {5, 17});
//     out.emplace_back(b.prefix + "x", x);
//     ...
//   }
//   write_torch_cases("softmax.safetensors", out);
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "file_test_util.h"
#include "test_util.h"

namespace towerlab::testing {

// One backend and dtype of the comparison.
struct TorchCaseBackend {
  Device device;
  DType dtype;
  std::string prefix;  // "cpu_float32/", "cpu_float64/", "cuda_float32/"

  const Stream& stream() const { return default_stream(device); }
  // `values` as a tensor of this backend's dtype on its device (rounded once from float).
  Tensor make(const std::vector<float>& values, const Shape& shape) const {
    return Tensor::from_host<float>(values, shape, cpu()).to(dtype, cpu()).to(device, stream());
  }
};

// The CPU in float32 and float64, and cuda:0 in float32 where a GPU (real or
// emulated) is visible.
inline std::vector<TorchCaseBackend> torch_case_backends() {
  std::vector<std::pair<Device, DType>> cases = {{Device::cpu(), DType::Float32},
                                                 {Device::cpu(), DType::Float64}};
  if (cuda_device_count() > 0) cases.emplace_back(Device::cuda(0), DType::Float32);
  std::vector<TorchCaseBackend> backends;
  for (const auto& [device, dtype] : cases) {
    backends.push_back(
        {device, dtype, std::string(device.is_cpu() ? "cpu_" : "cuda_") + dtype_name(dtype) + "/"});
  }
  return backends;
}

// Saves `tensors` as <TOWERLAB_OPS_VS_TORCH_DIR>/<file_name>, or in a scratch
// directory without the variable, and checks that the file reads back whole.
inline void write_torch_cases(const std::string& file_name,
                              const std::vector<std::pair<std::string, Tensor>>& tensors) {
  const char* dir = std::getenv("TOWERLAB_OPS_VS_TORCH_DIR");
  ScratchDir scratch;
  const std::string path =
      dir != nullptr ? std::string(dir) + "/" + file_name : scratch.file(file_name);
  save_safetensors(path, tensors);
  EXPECT_EQ(load_safetensors(path, Device::cpu()).tensors.size(), tensors.size());
}

}  // namespace towerlab::testing
