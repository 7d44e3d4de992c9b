// CUDA random fills: the same philox functions as the CPU, one element per
// thread step, so the results match the CPU's.
#include "engine/philox.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/random.h"

namespace towerlab::cuda {

namespace {

template <Distribution Dist>
__global__ void random_kernel(std::int64_t n, float* x, std::uint64_t seed,
                              std::uint64_t subsequence, float a, float b) {
  for (const std::int64_t i : grid_stride(n)) {
    const auto index = static_cast<std::uint64_t>(i);
    if constexpr (Dist == Distribution::Uniform) {
      x[i] = philox::uniform(seed, subsequence, index, a, b);
    } else {
      x[i] = philox::normal(seed, subsequence, index, a, b);
    }
  }
}

}  // namespace

void random(const Tensor& x, Distribution dist, std::uint64_t seed, std::uint64_t subsequence,
            float a, float b, const Stream& stream) {
  const auto kernel = dist == Distribution::Uniform ? random_kernel<Distribution::Uniform>
                                                    : random_kernel<Distribution::Normal>;
  launch_grid_stride(kernel, x.numel(), stream, x.data<float>(), seed, subsequence, a, b);
}

}  // namespace towerlab::cuda
