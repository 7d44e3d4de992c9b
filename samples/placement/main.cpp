// placement: seed 003's walk-through of device placement, in towerlab.
//
//   1. The devices present, and what a missing device does: an error listing those
//      present, or, with soft placement, a warning and a fallback.
//   2. Manual placement: a matmul of two 2x2 constants on each of two devices (two
//      GPUs, or two virtual devices where there are fewer), and their sum on the CPU,
//      with a placement log line for every tensor and op.
// Exits non-zero if the sum is wrong.
#include <cstdio>
#include <iostream>

#include "towerlab.h"

using namespace towerlab;

int main() {
  try {
    std::printf("devices present:");
    for (Device d : available_devices()) std::printf(" %s", d.str().c_str());
    std::printf("\n");

    const Device missing = Device::cuda(cuda_device_count() + 2);
    try {
      check_available(missing);
    } catch (const DeviceError& e) {
      std::printf("asking for %s: DeviceError: %s\n", missing.str().c_str(), e.what());
    }
    const Device soft = place_device(missing, true, std::cout);
    std::printf("with soft placement %s runs on %s\n\n", missing.str().c_str(), soft.str().c_str());

    // Two towers: /gpu:0 and /gpu:1 when present, else virtual devices.
    std::vector<Device> towers;
    for (int i = 0; i < 2; ++i) {
      towers.push_back(cuda_device_count() > i   ? Device::cuda(i)
                       : cuda_device_count() > 0 ? Device::cuda(0)
                                                 : Device::cpu());
    }
    const Device host = Device::cpu();
    Stream host_stream(host);
    Tensor total = Tensor::zeros({2, 2}, host_stream);
    for (std::size_t t = 0; t < towers.size(); ++t) {
      Stream s(towers[t]);
      Tensor a = Tensor::from_host<float>({1, 2, 3, 4}, {2, 2}, s);
      Tensor b = Tensor::from_host<float>({1, 2, 3, 4}, {2, 2}, s);
      Tensor c = Tensor::empty({2, 2}, s);
      std::printf("placement: tower %zu: a float32[2,2] on %s\n", t, towers[t].str().c_str());
      std::printf("placement: tower %zu: b float32[2,2] on %s\n", t, towers[t].str().c_str());
      matmul(c, a, b, false, false, 1.0f, 0.0f, s);
      std::printf("placement: tower %zu: MatMul(a, b) on %s\n", t, towers[t].str().c_str());
      Tensor c_host = Tensor::empty({2, 2}, host);
      copy_tensor(c_host, c, towers[t].is_cuda() ? s : host_stream);
      add(total, total, c_host, host_stream);
      std::printf("placement: AddN input %zu copied from %s to cpu\n", t, towers[t].str().c_str());
    }
    std::printf("placement: AddN on cpu\n");
    const auto sum = total.to_host<float>(host_stream);
    std::printf("sum = [[%g, %g], [%g, %g]]\n", sum[0], sum[1], sum[2], sum[3]);
    const bool ok = sum == std::vector<float>{14, 20, 30, 44};  // 2 * [[7, 10], [15, 22]]
    std::printf("%s\n", ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "placement: %s\n", e.what());
    return 2;
  }
}
