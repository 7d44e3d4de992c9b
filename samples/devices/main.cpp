// towerlab_devices: lists the devices this process can use and runs a small
// computation on each, checking the result. Exits non-zero if any device gives a
// wrong answer, so it doubles as a smoke test of a fresh install.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "towerlab.h"

using namespace towerlab;

namespace {

// relu(a + b) summed, on one device; compares with the same sum done on the host.
bool check_device(Device device) {
  Stream stream(device);
  const int n = 1000;
  std::vector<float> a(n), b(n);
  double expected = 0.0;
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 17) - 8.0f;
    b[i] = 0.5f * static_cast<float>(i % 5);
    expected += std::max(a[i] + b[i], 0.0f);
  }
  Tensor ta = Tensor::from_host<float>(a, {n}, stream);
  Tensor tb = Tensor::from_host<float>(b, {n}, stream);
  Tensor tc = Tensor::empty({n}, stream);
  Tensor total = Tensor::empty({1}, stream);
  add(tc, ta, tb, stream);
  relu_forward(tc, tc, stream);
  sum(total, tc, stream);
  const float got = total.to_host<float>(stream)[0];
  const bool ok = std::abs(got - expected) <= 1e-3 * std::abs(expected);
  std::printf("  %-40s sum(relu(a + b)) over %d elements = %.1f (expected %.1f) %s\n",
              describe(device).c_str(), n, got, expected, ok ? "ok" : "WRONG");
  return ok;
}

}  // namespace

int main() {
  try {
    const auto devices = available_devices();
    std::printf("towerlab sees %zu device(s):\n", devices.size());
    bool all_ok = true;
    for (Device device : devices) all_ok = check_device(device) && all_ok;
    if (cuda_device_count() == 0) {
      // Say why: no backend, or the runtime's error (no driver, a driver too old, no
      // device visible).
      std::string why;
      if (!TOWERLAB_WITH_CUDA) {
        why = " (built without the CUDA backend)";
      } else if (!cuda_device_count_error().empty()) {
        why = " (cudaGetDeviceCount: " + cuda_device_count_error() + ")";
      }
      std::printf("no CUDA device is visible%s\n", why.c_str());
    }
    return all_ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "towerlab_devices: %s\n", e.what());
    return 2;
  }
}
