// peer_add on every backend: it accumulates, gives the bits of add(dst, dst, src),
// allows dst == src, and says which device cannot read which. peer_sum: every
// member's buffer gets the sum in each span's rotating order, to the bit, on every
// backend; bad spans and buffers are refused. Reading another
// member's buffer in place is exercised end to end by the ring (ring_allreduce_test).
#include "kernels/peer_add.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class PeerAddTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(PeerAddTest);

TEST_P(PeerAddTest, AccumulatesIntoDst) {
  Tensor dst = make({1.0f, 2.0f, 3.0f}, {3});  // sentinel: must be added to
  Tensor src = make({10.0f, 20.0f, 30.0f}, {3});
  peer_add(dst, src, stream());
  EXPECT_EQ(host(dst), (std::vector<float>{11.0f, 22.0f, 33.0f}));
  EXPECT_EQ(host(src), (std::vector<float>{10.0f, 20.0f, 30.0f})) << "src must not be written";
}

TEST_P(PeerAddTest, GivesTheBitsOfAddOnOddSizes) {
  for (std::int64_t n : {0, 1, 7, 257, 1000003}) {
    const auto a = random_values(std::size_t(n), 21), b = random_values(std::size_t(n), 22);
    Tensor dst = make(a, {n}), src = make(b, {n}), expected = make(a, {n});
    peer_add(dst, src, stream());
    add(expected, expected, src, stream());
    const auto got = host(dst);
    EXPECT_EQ(got, host(expected)) << "n = " << n;
    if (n > 0) {
      EXPECT_NE(got, a) << "n = " << n << ": nothing was added";
    }
  }
}

TEST_P(PeerAddTest, DstMayBeSrc) {
  Tensor x = make({1.0f, -2.5f, 4.0f}, {3});
  peer_add(x, x, stream());
  EXPECT_EQ(host(x), (std::vector<float>{2.0f, -5.0f, 8.0f}));
}

TEST_P(PeerAddTest, ShapesNeedNotMatchButCountsMust) {
  Tensor dst = Tensor::zeros({2, 3}, stream());
  peer_add(dst, make({1, 2, 3, 4, 5, 6}, {6}), stream());
  EXPECT_EQ(host(dst), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_THROW_WITH(peer_add(dst, Tensor::zeros({5}, stream()), stream()), ShapeError,
                    "peer_add: src float32[5] on " + device().str() + " has 5 elements");
  EXPECT_THROW_WITH(peer_add(dst, Tensor(), stream()), InvalidArgument, "src is undefined");
}

TEST_P(PeerAddTest, SaysWhichDeviceCannotReadWhich) {
  if (device().is_cpu()) {
    // The host stream never reads a GPU's memory in place (checked without a GPU).
    EXPECT_FALSE(peer_readable(Device::cpu(), Device::cuda(0)));
    EXPECT_TRUE(peer_readable(Device::cpu(), Device::cpu()));
    EXPECT_THROW_WITH(
        peer_add(Tensor::zeros({2}, stream(), DType::Float64), make({1, 2}, {2}), stream()),
        NotSupported, "peer_add: dst is float64[2] on cpu; this op has float32 kernels only");
    return;
  }
  EXPECT_TRUE(peer_readable(device(), device()));
  EXPECT_FALSE(peer_readable(device(), Device::cpu()));
  Stream host_stream(Device::cpu());
  Tensor on_host = Tensor::from_host<float>({1.0f, 2.0f}, {2}, host_stream);
  EXPECT_THROW_WITH(peer_add(Tensor::zeros({2}, stream()), on_host, stream()), InvalidArgument,
                    "peer_add: " + device().str() + " cannot read src float32[2] on cpu in place");
  EXPECT_THROW_WITH(peer_add(on_host, make({1, 2}, {2}), stream()), InvalidArgument,
                    "peer_add: dst is float32[2] on cpu but the stream is on " + device().str());
}

// The specification of peer_sum, in plain loops: span k's elements summed from
// member k on, round the members.
std::vector<float> rotating_sum(const std::vector<std::vector<float>>& values,
                                const std::vector<std::int64_t>& first) {
  const auto n = std::int64_t(values.size());
  std::vector<float> sum(values[0].size());
  for (std::int64_t k = 0; k < n; ++k) {
    for (std::int64_t i = first[std::size_t(k)]; i < first[std::size_t(k) + 1]; ++i) {
      float s = values[std::size_t(k)][std::size_t(i)];
      for (std::int64_t m = 1; m < n; ++m) s += values[std::size_t((k + m) % n)][std::size_t(i)];
      sum[std::size_t(i)] = s;
    }
  }
  return sum;
}

TEST_P(PeerAddTest, PeerSumWritesTheRotatingSumIntoEveryBuffer) {
  for (std::size_t n : {1u, 2u, 3u, 8u}) {
    for (std::int64_t length : {1, 9, 100003}) {
      std::vector<std::vector<float>> values;
      std::vector<Tensor> buffers;
      for (std::size_t m = 0; m < n; ++m) {
        values.push_back(random_values(std::size_t(length), 30 + int(m)));
        buffers.push_back(make(values.back(), {length}));
      }
      // Uneven spans, one of them empty where there are several.
      std::vector<std::int64_t> first{0};
      for (std::size_t k = 1; k < n; ++k) first.push_back(k == 1 ? 0 : length * k / n);
      first.push_back(length);
      const auto expected = rotating_sum(values, first);
      if (n > 2 && length > 9) {
        // Control: summing every span from member 0 gives other bits somewhere.
        std::vector<std::int64_t> one_span(n + 1, length);
        one_span[0] = 0;
        ASSERT_NE(rotating_sum(values, one_span), expected);
      }
      peer_sum(buffers, first, stream());
      for (std::size_t m = 0; m < n; ++m) {
        ASSERT_EQ(host(buffers[m]), expected)
            << n << " members, length " << length << ", member " << m;
      }
    }
  }
}

TEST_P(PeerAddTest, PeerSumRefusesBadSpansAndBuffers) {
  Tensor a = Tensor::zeros({4}, stream()), b = Tensor::zeros({4}, stream());
  EXPECT_THROW_WITH(peer_sum({a, b}, {0, 4}, stream()), InvalidArgument,
                    "peer_sum: 2 span bounds for 2 buffers (needs 3)");
  EXPECT_THROW_WITH(peer_sum({a, b}, {0, 3, 2}, stream()), InvalidArgument,
                    "span bound first[2] = 2; the bounds must rise from 0 to 4");
  EXPECT_THROW_WITH(peer_sum({a, b}, {1, 2, 4}, stream()), InvalidArgument, "first[0] = 1");
  EXPECT_THROW_WITH(peer_sum({a, Tensor::zeros({5}, stream())}, {0, 2, 4}, stream()), ShapeError,
                    "peer_sum: buffers[1] float32[5] on " + device().str() + " has 5 elements");
  EXPECT_THROW_WITH(peer_sum({}, {0}, stream()), InvalidArgument, "0 buffers; it sums 1 to 8");
  std::vector<Tensor> nine(9, a);
  EXPECT_THROW_WITH(peer_sum(nine, std::vector<std::int64_t>(10, 0), stream()), InvalidArgument,
                    "9 buffers");
}

}  // namespace
}  // namespace towerlab::testing
