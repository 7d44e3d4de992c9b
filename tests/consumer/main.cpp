// Uses towerlab through its one public header and checks one result.
#include <towerlab.h>

#include <cstdio>

int main() {
  using namespace towerlab;
  const Stream& cpu = default_stream(Device::cpu());
  Tensor a = Tensor::from_host<float>({1, 2, 3}, {3}, cpu);
  Tensor total = Tensor::empty({1}, cpu);
  sum(total, a, cpu);
  const float got = total.to_host<float>(cpu)[0];
  std::printf("consumer: sum = %g\n", got);
  return got == 6.0f ? 0 : 1;
}
