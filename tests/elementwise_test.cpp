// fill, copy, add, sub, mul, scale, axpy on every backend: hand-computed cases,
// odd sizes against host loops, aliasing, and shape errors.
#include "kernels/reference/elementwise.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class ElementwiseTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(ElementwiseTest);

TEST_P(ElementwiseTest, HandComputed) {
  Tensor a = make({1, 2, 3, 4}, {2, 2});
  Tensor b = make({10, 20, 30, 40}, {2, 2});
  Tensor out = Tensor::empty({2, 2}, stream());
  add(out, a, b, stream());
  EXPECT_EQ(host(out), (std::vector<float>{11, 22, 33, 44}));
  sub(out, a, b, stream());
  EXPECT_EQ(host(out), (std::vector<float>{-9, -18, -27, -36}));
  mul(out, a, b, stream());
  EXPECT_EQ(host(out), (std::vector<float>{10, 40, 90, 160}));
  scale(out, a, -0.5, stream());
  EXPECT_EQ(host(out), (std::vector<float>{-0.5f, -1, -1.5f, -2}));
  axpy(out, 2.0, b, stream());  // accumulates
  EXPECT_EQ(host(out), (std::vector<float>{19.5f, 39, 58.5f, 78}));
  fill(out, 7.0, stream());
  EXPECT_EQ(host(out), std::vector<float>(4, 7.0f));
}

TEST_P(ElementwiseTest, AxpyScalarBroadcastsADeviceScalar) {
  Tensor y = make({1, 2, 3, 4, 5}, {5});
  Tensor s = make({2}, {1});
  axpy_scalar(y, 0.5, s, stream());
  EXPECT_EQ(host(y), (std::vector<float>{2, 3, 4, 5, 6}));
  EXPECT_THROW_WITH(axpy_scalar(y, 1.0, y, stream()), ShapeError,
                    "axpy_scalar: s must have one element, got float32[5]");
}

TEST_P(ElementwiseTest, OddSizesMatchHostLoops) {
  for (std::int64_t n : {1, 2, 3, 31, 255, 257, 4099, 1000003}) {
    const auto x = random_values(static_cast<std::size_t>(n), 1);
    const auto y = random_values(static_cast<std::size_t>(n), 2);
    Tensor tx = make(x, {n}), ty = make(y, {n}), out = Tensor::empty({n}, stream());
    std::vector<float> expected(x.size());

    mul(out, tx, ty, stream());
    reference::mul(expected.data(), x.data(), y.data(), n);
    EXPECT_EQ(host(out), expected) << "mul, n = " << n;

    axpy(ty, 0.25, tx, stream());
    expected = y;
    reference::axpy(expected.data(), 0.25f, x.data(), n);
    EXPECT_TRUE(all_close(host(ty), expected, 1e-7, 1e-6)) << "axpy, n = " << n;
  }
}

TEST_P(ElementwiseTest, OutputMayAliasInputs) {
  Tensor a = make({1, 2, 3}, {3});
  add(a, a, a, stream());
  EXPECT_EQ(host(a), (std::vector<float>{2, 4, 6}));
  scale(a, a, 0.5, stream());
  EXPECT_EQ(host(a), (std::vector<float>{1, 2, 3}));
}

TEST_P(ElementwiseTest, CopyWithinADevice) {
  const auto values = random_values(777, 4);
  Tensor src = make(values, {7, 111});
  Tensor dst = Tensor::empty({777}, stream());
  copy(dst, src, stream());
  EXPECT_EQ(host(dst), values);
  Tensor other = Tensor::empty({776}, stream());
  EXPECT_THROW_WITH(copy(other, src, stream()), ShapeError, "has 777 elements but dst");
}

TEST_P(ElementwiseTest, EmptyTensorsAreANoOp) {
  Tensor e = Tensor::empty({0, 5}, stream());
  add(e, e, e, stream());
  fill(e, 1.0, stream());
  axpy(e, 1.0, e, stream());
  EXPECT_TRUE(host(e).empty());
}

TEST_P(ElementwiseTest, ShapeAndDeviceErrorsNameTheTensors) {
  Tensor a = Tensor::zeros({2, 3}, stream());
  Tensor b = Tensor::zeros({3, 2}, stream());
  EXPECT_THROW_WITH(add(a, a, b, stream()), ShapeError,
                    "add: b is float32[3,2] on " + device().str() + " but out is float32[2,3]");
  EXPECT_THROW_WITH(axpy(a, 1.0, b, stream()), ShapeError, "axpy: x is float32[3,2]");
  EXPECT_THROW_WITH(add(a, a, Tensor(), stream()), InvalidArgument, "add: b is undefined");
  if (device().is_cuda()) {
    Tensor h = Tensor::zeros({2, 3}, Device::cpu());
    EXPECT_THROW_WITH(add(a, a, h, stream()), InvalidArgument,
                      "add: b is float32[2,3] on cpu but the stream is on cuda:0");
  }
}

TEST(ElementwiseCpu, Float64AndDtypeConversion) {
  const Stream& cpu = default_stream(Device::cpu());
  Tensor d = Tensor::from_host<double>({0.1, 0.2}, {2}, cpu);
  Tensor f = Tensor::empty({2}, cpu);
  copy(f, d, cpu);
  EXPECT_EQ(f.to_host<float>(), (std::vector<float>{0.1f, 0.2f}));
  add(d, d, d, cpu);
  EXPECT_EQ(d.to_host<double>(), (std::vector<double>{0.2, 0.4}));
  EXPECT_THROW_WITH(add(f, d, d, cpu), ShapeError,
                    "add: a is float64[2] on cpu but out is float32[2]");
}

}  // namespace
}  // namespace towerlab::testing
