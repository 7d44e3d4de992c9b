// Uses towerlab through its one public header and checks what a program relies on:
// the header is <towerlab/towerlab.h> and nothing of the tree's layout (engine/,
// kernels/, ...) is at the top of the include path, C++20 comes from the target,
// the version macros agree with the package CMake found, and one result.
#include <towerlab/towerlab.h>

#include <cstdio>
#include <string>

static_assert(__cplusplus >= 202002L, "towerlab::towerlab should require C++20 of its users");
#if __has_include(<engine/tensor.h>) || __has_include(<towerlab.h>)
#error "towerlab's own folders are on the include path: only <towerlab/...> should be"
#endif
#if __has_include(<towerlab/engine/cuda_check.h>)
#error "an internal header (engine/cuda_check.h) is reachable as <towerlab/engine/cuda_check.h>"
#endif

int main() {
  using namespace towerlab;
  const std::string version = std::to_string(TOWERLAB_VERSION_MAJOR) + "." +
                              std::to_string(TOWERLAB_VERSION_MINOR) + "." +
                              std::to_string(TOWERLAB_VERSION_PATCH);
  std::printf("consumer: towerlab %s (package %s)\n", TOWERLAB_VERSION, EXPECTED_VERSION);
  if (version != TOWERLAB_VERSION || version != EXPECTED_VERSION) {
    std::printf("consumer: the version macros say %s and %s, the package %s\n", version.c_str(),
                TOWERLAB_VERSION, EXPECTED_VERSION);
    return 1;
  }

  const Stream& cpu = default_stream(Device::cpu());
  Tensor a = Tensor::from_host<float>({1, 2, 3}, {3}, cpu);
  Tensor total = Tensor::empty({1}, cpu);
  sum(total, a, cpu);
  const float got = total.to_host<float>(cpu)[0];
  std::printf("consumer: sum = %g\n", got);
  return got == 6.0f ? 0 : 1;
}
