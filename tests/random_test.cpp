// The Philox generator: known-answer vectors, distribution moments, and the
// same numbers on every backend for the same seed.
#include <bit>
#include <cmath>
#include <cstdint>
#include <iomanip>

#include "engine/philox.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// Known-answer tests from the Random123 distribution (kat_vectors, philox4x32_10).
TEST(Philox, MatchesRandom123KnownAnswers) {
  philox::Uint4 r = philox::philox4x32_10({0, 0, 0, 0}, 0, 0);
  EXPECT_EQ(r.x, 0x6627e8d5u);
  EXPECT_EQ(r.y, 0xe169c58du);
  EXPECT_EQ(r.z, 0xbc57ac4cu);
  EXPECT_EQ(r.w, 0x9b00dbd8u);
  r = philox::philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu,
                            0xffffffffu);
  EXPECT_EQ(r.x, 0x408f276du);
  EXPECT_EQ(r.y, 0x41c83b0eu);
  EXPECT_EQ(r.z, 0xa20bc7c6u);
  EXPECT_EQ(r.w, 0x6d5451fdu);
  r = philox::philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u,
                            0x299f31d0u);
  EXPECT_EQ(r.x, 0xd16cfe09u);
  EXPECT_EQ(r.y, 0x94fdccebu);
  EXPECT_EQ(r.z, 0x5001e420u);
  EXPECT_EQ(r.w, 0x24126ea1u);
}

class RandomTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(RandomTest);

TEST_P(RandomTest, UniformHasTheRightRangeAndMoments) {
  const std::int64_t n = 1 << 18;
  Tensor x = Tensor::empty({n}, stream());
  random_uniform(x, 1234, 0, -2.0f, 6.0f, stream());
  const auto v = host(x);
  double mean = 0.0, var = 0.0;
  for (float f : v) {
    ASSERT_GE(f, -2.0f);
    ASSERT_LT(f, 6.0f);
    mean += f;
  }
  mean /= n;
  for (float f : v) var += (f - mean) * (f - mean);
  var /= n;
  EXPECT_NEAR(mean, 2.0, 0.02);
  EXPECT_NEAR(var, 64.0 / 12.0, 0.05);
}

TEST_P(RandomTest, NormalHasTheRightMoments) {
  const std::int64_t n = 1 << 18;
  Tensor x = Tensor::empty({n}, stream());
  random_normal(x, 99, 3, 1.5f, 0.5f, stream());
  const auto v = host(x);
  double mean = 0.0, var = 0.0;
  for (float f : v) {
    ASSERT_TRUE(std::isfinite(f));
    mean += f;
  }
  mean /= n;
  for (float f : v) var += (f - mean) * (f - mean);
  var /= n;
  EXPECT_NEAR(mean, 1.5, 0.005);
  EXPECT_NEAR(std::sqrt(var), 0.5, 0.005);
}

// Uniform ranges for the bit-exactness tests. A range whose width is a power of
// two in float makes (high - low) * u exact, so a fused and an unfused
// low + (high - low) * u agree there and cannot tell the two roundings apart:
// [-1, 1) and [-0.3, 0.7) are such ranges (0.7f - -0.3f is exactly 1). The
// others are not, and are where a GPU that fuses and a host that does not differ.
struct UniformRange {
  float low, high;
  bool power_of_two_width;
};
const UniformRange kUniformRanges[] = {{-1.0f, 1.0f, true},
                                       {-0.3f, 0.7f, true},
                                       {-0.3f, 0.71f, false},
                                       {-0.0765f, 0.0765f, false},  // a Glorot-uniform limit
                                       {2.0f, 3.3f, false}};

// Uniform is specified as fma(high - low, u, low), rounded once (kept below high),
// with u the top 24 bits of the element's first Philox word over 2^24: checked here bit for bit on
// every backend. The control counts the elements where the twice-rounded formula
// differs, showing that the comparison catches an unfused (or contracted on one
// side only) computation on the ranges that are not a power of two wide.
TEST_P(RandomTest, UniformIsTheFmaFormulaOnEveryRange) {
  const std::int64_t n = 4099;
  const std::uint64_t seed = 11, subsequence = 5;
  Tensor x = Tensor::empty({n}, stream());
  for (const UniformRange& r : kUniformRanges) {
    SCOPED_TRACE(::testing::Message() << "[" << r.low << ", " << r.high << ")");
    random_uniform(x, seed, subsequence, r.low, r.high, stream());
    const auto v = host(x);
    std::int64_t twice_rounded_differs = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float u = philox::to_unit_float(philox::draw(seed, subsequence, std::uint64_t(i)).x);
      const float fma = std::fma(r.high - r.low, u, r.low);
      const float expected = fma < r.high ? fma : std::nextafter(r.high, r.low);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(v[std::size_t(i)]),
                std::bit_cast<std::uint32_t>(expected))
          << "element " << i << ": " << std::setprecision(9) << v[std::size_t(i)] << " instead of "
          << expected;
      // volatile: the product is rounded to float before the addition, whatever
      // this file's compiler would contract.
      const volatile float product = (r.high - r.low) * u;
      if (r.low + product != expected) ++twice_rounded_differs;
    }
    if (r.power_of_two_width) {
      EXPECT_EQ(twice_rounded_differs, 0);
    } else {
      EXPECT_GT(twice_rounded_differs, n / 20) << "the control would not catch a wrong rounding";
    }
  }
}

// The largest u, 1 - 2^-24, rounds to `high` on [2, 3.3) and [100, 100.5) and past
// it on [1, 1.1) (whose width rounded up); uniform still stays below `high`. The
// control is the bare fma reaching `high` on those ranges.
TEST(Philox, UniformStaysBelowHigh) {
  const float largest_u = philox::to_unit_float(0xffffffffu);
  ASSERT_EQ(largest_u, 1.0f - 1.0f / 16777216.0f);
  const UniformRange reaching[] = {
      {2.0f, 3.3f, false}, {1.0f, 1.1f, false}, {100.0f, 100.5f, false}};
  for (const UniformRange& r : reaching) {
    SCOPED_TRACE(::testing::Message() << "[" << r.low << ", " << r.high << ")");
    EXPECT_GE(std::fma(r.high - r.low, largest_u, r.low), r.high) << "the control";
    const float v = philox::uniform_from_unit(largest_u, r.low, r.high);
    EXPECT_LT(v, r.high);
    EXPECT_EQ(v, std::nextafter(r.high, r.low));
  }
  for (const UniformRange& r : kUniformRanges) {
    EXPECT_LT(philox::uniform_from_unit(largest_u, r.low, r.high), r.high);
    EXPECT_EQ(philox::uniform_from_unit(0.0f, r.low, r.high), r.low);
  }
}

TEST_P(RandomTest, SameSeedSameNumbersAsTheCpu) {
  const std::int64_t n = 100003;
  Tensor x = Tensor::empty({n}, stream());
  Tensor ref = Tensor::empty({n}, Device::cpu());
  const Stream& cpu = default_stream(Device::cpu());

  for (const UniformRange& r : kUniformRanges) {
    random_uniform(x, 42, 7, r.low, r.high, stream());
    random_uniform(ref, 42, 7, r.low, r.high, cpu);
    EXPECT_EQ(host(x), ref.to_host<float>(cpu))
        << "uniform on [" << r.low << ", " << r.high << ") must agree bit for bit";
  }

  random_normal(x, 42, 7, 0.0f, 1.0f, stream());
  random_normal(ref, 42, 7, 0.0f, 1.0f, cpu);
  const auto a = host(x), b = ref.to_host<float>(cpu);
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_LE(std::abs(a[i] - b[i]), std::abs(b[i]) * 1.2e-7f) << "element " << i;
  }
}

TEST_P(RandomTest, SeedsAndSubsequencesGiveDifferentStreams) {
  Tensor a = Tensor::empty({64}, stream()), b = Tensor::empty({64}, stream());
  random_uniform(a, 1, 0, 0.0f, 1.0f, stream());
  random_uniform(b, 2, 0, 0.0f, 1.0f, stream());
  EXPECT_NE(host(a), host(b));
  random_uniform(b, 1, 1, 0.0f, 1.0f, stream());
  EXPECT_NE(host(a), host(b));
  random_uniform(b, 1, 0, 0.0f, 1.0f, stream());
  EXPECT_EQ(host(a), host(b));
}

TEST_P(RandomTest, BadParametersAreRejected) {
  Tensor x = Tensor::empty({4}, stream());
  EXPECT_THROW_WITH(random_uniform(x, 0, 0, 1.0f, 0.0f, stream()), InvalidArgument,
                    "low 1 is greater than high 0");
  EXPECT_THROW_WITH(random_normal(x, 0, 0, 0.0f, -1.0f, stream()), InvalidArgument,
                    "stddev -1 is negative");
  EXPECT_THROW_WITH(random_normal(x, 0, 0, NAN, 1.0f, stream()), InvalidArgument, "must be finite");
}

}  // namespace
}  // namespace towerlab::testing
