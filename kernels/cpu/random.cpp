// CPU random fills: element i from philox::uniform/normal(seed, subsequence, i).
#include "kernels/cpu/random.h"
#include "engine/philox.h"
#include "kernels/cpu/dtype_dispatch.h"

namespace towerlab::cpu {

void random(const Tensor& x, Distribution dist, std::uint64_t seed, std::uint64_t subsequence,
            float a, float b) {
  with_dtype(x.dtype(), [&]<typename T>() {
    T* out = x.data<T>();  // [n]
    const auto n = static_cast<std::uint64_t>(x.numel());
    for (std::uint64_t i = 0; i < n; ++i) {
      out[i] = static_cast<T>(dist == Distribution::Uniform
                                  ? philox::uniform(seed, subsequence, i, a, b)
                                  : philox::normal(seed, subsequence, i, a, b));
    }
  });
}

}  // namespace towerlab::cpu
