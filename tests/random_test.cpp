// The Philox generator: known-answer vectors, distribution moments, and the
// same numbers on every backend for the same seed.
#include <cmath>

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

TEST_P(RandomTest, SameSeedSameNumbersAsTheCpu) {
  const std::int64_t n = 100003;
  Tensor x = Tensor::empty({n}, stream());
  Tensor ref = Tensor::empty({n}, Device::cpu());
  const Stream& cpu = default_stream(Device::cpu());

  random_uniform(x, 42, 7, -1.0f, 1.0f, stream());
  random_uniform(ref, 42, 7, -1.0f, 1.0f, cpu);
  EXPECT_EQ(host(x), ref.to_host<float>()) << "uniform must agree bit for bit";

  random_normal(x, 42, 7, 0.0f, 1.0f, stream());
  random_normal(ref, 42, 7, 0.0f, 1.0f, cpu);
  const auto a = host(x), b = ref.to_host<float>();
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
