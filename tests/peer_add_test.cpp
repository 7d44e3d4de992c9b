// peer_add on every backend: it accumulates, gives the bits of add(dst, dst, src),
// allows dst == src, and says which device cannot read which. Reading another
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

}  // namespace
}  // namespace towerlab::testing
