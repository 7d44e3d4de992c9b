// Checks and backend dispatch for the random fills (kernels/random.h).
#include "kernels/random.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/random.h"
#include "kernels/cuda/random.h"

namespace towerlab {

namespace {

void random(const char* op, const Tensor& x, Distribution dist, std::uint64_t seed,
            std::uint64_t subsequence, float a, float b, const Stream& stream) {
  kernels::check_on_stream(op, stream, {{"x", &x}});
  TL_CHECK(std::isfinite(a) && std::isfinite(b), InvalidArgument,
           op << ": parameters must be finite, got " << a << " and " << b);
  if (x.numel() == 0) return;
  TL_DISPATCH(stream, cpu::random(x, dist, seed, subsequence, a, b),
              cuda::random(x, dist, seed, subsequence, a, b, stream));
}

}  // namespace

void random_uniform(const Tensor& x, std::uint64_t seed, std::uint64_t subsequence, float low,
                    float high, const Stream& stream) {
  TL_CHECK(low <= high, InvalidArgument,
           "random_uniform: low " << low << " is greater than high " << high);
  random("random_uniform", x, Distribution::Uniform, seed, subsequence, low, high, stream);
}

void random_normal(const Tensor& x, std::uint64_t seed, std::uint64_t subsequence, float mean,
                   float stddev, const Stream& stream) {
  TL_CHECK(stddev >= 0.0f, InvalidArgument, "random_normal: stddev " << stddev << " is negative");
  random("random_normal", x, Distribution::Normal, seed, subsequence, mean, stddev, stream);
}

}  // namespace towerlab
