// Tensors on every backend: creation, host round trips, views, and copies
// between devices (host <-> device, device <-> device, and virtual devices).
#include "test_util.h"

namespace towerlab::testing {
namespace {

class TensorTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(TensorTest);

TEST_P(TensorTest, RoundTripsHostValues) {
  for (std::int64_t n : {0, 1, 2, 13, 1031, 65537}) {
    const auto values = random_values(static_cast<std::size_t>(n), 5);
    Tensor t = make(values, {n});
    EXPECT_EQ(t.numel(), n);
    EXPECT_EQ(t.device(), device());
    EXPECT_EQ(host(t), values) << "n = " << n;
  }
}

TEST_P(TensorTest, ZerosAreZero) {
  Tensor t = Tensor::zeros({3, 5, 7}, stream());
  EXPECT_EQ(host(t), std::vector<float>(105, 0.0f));
  EXPECT_EQ(t.shape(), (Shape{3, 5, 7}));
  EXPECT_EQ(t.nbytes(), 420u);
  EXPECT_EQ(t.describe(), "float32[3,5,7] on " + device().str());
}

TEST_P(TensorTest, ViewsShareStorage) {
  Tensor t = make({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {4, 3});
  Tensor rows = t.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(host(rows), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  EXPECT_TRUE(rows.shares_storage_with(t));
  Tensor flat = t.reshape({-1});
  EXPECT_EQ(flat.shape(), (Shape{12}));
  Tensor window = flat.view(5, {2, 2});
  EXPECT_EQ(host(window), (std::vector<float>{5, 6, 7, 8}));
  fill(window, -1.0, stream());  // writes through to the parent
  EXPECT_EQ(host(t)[5], -1.0f);
  EXPECT_EQ(host(t)[9], 9.0f);
  EXPECT_EQ(t.slice(2, 2).numel(), 0);
}

TEST_P(TensorTest, ViewErrorsNameTheShapes) {
  Tensor t = Tensor::zeros({4, 3}, stream());
  EXPECT_THROW_WITH(t.reshape({5, 3}), ShapeError,
                    "reshape [4,3] (12 elements) to [5,3] (15 elements)");
  EXPECT_THROW_WITH(t.reshape({-1, -1}), ShapeError, "more than one -1");
  EXPECT_THROW_WITH(t.reshape({5, -1}), ShapeError, "cannot infer");
  EXPECT_THROW_WITH(t.slice(2, 5), ShapeError, "slice [2, 5) out of range for [4,3]");
  EXPECT_THROW_WITH(t.view(10, {3}), ShapeError, "view of 3 elements at offset 10 does not fit");
  EXPECT_THROW_WITH(t.size(2), ShapeError, "axis 2 out of range");
  EXPECT_EQ(t.size(-1), 3);
}

TEST_P(TensorTest, CreationErrorsAreClear) {
  EXPECT_THROW_WITH(Tensor::empty({2, -3}, stream()), ShapeError, "negative dimension");
  EXPECT_THROW_WITH(make({1, 2, 3}, {2, 2}), ShapeError, "3 values for shape [2,2] (4 elements)");
  EXPECT_THROW_WITH(Tensor::empty({1 << 30, 1 << 30, 1 << 30}, stream()), ShapeError,
                    "more elements than fit in 64 bits");
  EXPECT_THROW_WITH(make({1}, {1}).to_host<double>(stream()), ShapeError,
                    "asked for float64 values of float32[1]");
  EXPECT_THROW_WITH(Tensor().to_host<float>(stream()), InvalidArgument, "undefined");
}

TEST_P(TensorTest, CopiesToAndFromTheHost) {
  const auto values = random_values(4099, 8);
  Tensor here = make(values, {4099});
  Tensor on_cpu = here.to(Device::cpu(), stream());
  EXPECT_EQ(on_cpu.device(), Device::cpu());
  EXPECT_EQ(on_cpu.to_host<float>(default_stream(Device::cpu())), values);
  Tensor back = on_cpu.to(device(), stream());
  EXPECT_EQ(host(back), values);
  EXPECT_FALSE(back.shares_storage_with(here));
}

TEST_P(TensorTest, CopiesBetweenVirtualDevicesOfOneKind) {
  // Two towers on one physical device: copies become same-device copies.
  Stream tower0(device()), tower1(device());
  const auto values = random_values(1000, 9);
  Tensor a = Tensor::from_host<float>(values, {10, 100}, tower0);
  Tensor b = Tensor::empty({1000}, tower1);
  tower1.synchronize();
  copy_tensor(b, a, tower1);
  EXPECT_EQ(b.to_host<float>(tower1), values);
  EXPECT_EQ(b.shape(), (Shape{1000}));  // copies need equal sizes, not equal shapes
  Tensor wrong = Tensor::empty({999}, tower1);
  EXPECT_THROW_WITH(copy_tensor(wrong, a, tower1), ShapeError, "cannot copy float32[10,100]");
}

TEST_P(TensorTest, CloneIsDeep) {
  Tensor a = make({1, 2, 3}, {3});
  Tensor b = a.clone(stream());
  fill(a, 0.0, stream());
  EXPECT_EQ(host(b), (std::vector<float>{1, 2, 3}));
}

TEST(TensorCpu, Float64LivesOnTheCpu) {
  const Stream& cpu = default_stream(Device::cpu());
  Tensor d = Tensor::from_host<double>({1.0, 2.5}, {2}, cpu);
  EXPECT_EQ(d.dtype(), DType::Float64);
  EXPECT_EQ(d.nbytes(), 16u);
  EXPECT_EQ(d.to_host<double>(), (std::vector<double>{1.0, 2.5}));
  EXPECT_THROW_WITH(d.data<float>(), ShapeError, "data<float32>() of float64[2] on cpu");
  if (cuda_device_count() > 0) {
    Stream gpu(Device::cuda(0));
    EXPECT_THROW_WITH(Tensor::empty({2}, gpu, DType::Float64), NotSupported,
                      "float64 tensors live on the CPU only");
  }
}

// Host copies of 256 KiB and more split over the caller's share of the pool: every
// byte arrives on any thread count, for a length no thread count divides evenly;
// ranges that overlap (views of one tensor) copy as if through a buffer, either way
// round.
TEST(TensorCpu, LargeAndOverlappingHostCopiesAreExact) {
  const int saved = num_threads();
  const Stream& stream = default_stream(Device::cpu());
  const std::int64_t n = (std::int64_t(1) << 18) + 7;  // 1 MiB and 28 bytes of float32
  const auto values = random_values(std::size_t(n), 21);
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor src = Tensor::from_host<float>(values, {n}, stream);
    Tensor dst = Tensor::from_host<float>(std::vector<float>(std::size_t(n), -1.0f), {n}, stream);
    copy_tensor(dst, src, stream);
    EXPECT_EQ(dst.to_host<float>(stream), values) << threads << " threads";

    const std::int64_t shift = 1000;  // forward and backward overlaps of 1 MiB ranges
    copy_tensor(src.slice(shift, n), src.slice(0, n - shift), stream);
    std::vector<float> expected(values.begin(), values.begin() + shift);
    expected.insert(expected.end(), values.begin(), values.end() - shift);
    EXPECT_EQ(src.to_host<float>(stream), expected) << threads << " threads, copied forward";
    copy_tensor(src.slice(0, n - shift), src.slice(shift, n), stream);
    std::copy(expected.begin() + shift, expected.end(), expected.begin());
    EXPECT_EQ(src.to_host<float>(stream), expected) << threads << " threads, copied back";
  }
  set_num_threads(saved);
}

TEST(TensorCpu, ToDtypeConvertsEveryElement) {
  const Stream& cpu = default_stream(Device::cpu());
  Tensor f = Tensor::from_host<float>({0.1f, -2.5f, 3e38f, 7.0f}, {2, 2}, cpu);
  Tensor d = f.to(DType::Float64, cpu);
  EXPECT_EQ(d.dtype(), DType::Float64);
  EXPECT_EQ(d.shape(), f.shape());
  EXPECT_EQ(d.to_host<double>(), (std::vector<double>{double(0.1f), -2.5, double(3e38f), 7.0}));
  // float64 to float32 rounds to nearest: 0.1 becomes 0.1f, 1 + 1e-12 becomes 1.
  Tensor back = Tensor::from_host<double>({0.1, 1.0 + 1e-12}, {2}, cpu).to(DType::Float32, cpu);
  EXPECT_EQ(back.dtype(), DType::Float32);
  EXPECT_EQ(back.to_host<float>(), (std::vector<float>{0.1f, 1.0f}));
  // A view converts its own elements, not the storage's first ones.
  EXPECT_EQ(f.slice(1, 2).to(DType::Float64, cpu).to_host<double>(),
            (std::vector<double>{double(3e38f), 7.0}));
  // The same dtype is a deep copy.
  Tensor same = f.to(DType::Float32, cpu);
  EXPECT_FALSE(same.shares_storage_with(f));
  EXPECT_EQ(same.to_host<float>(), f.to_host<float>());
  EXPECT_THROW_WITH(Tensor().to(DType::Float64, cpu), InvalidArgument,
                    "Tensor::to: the tensor is undefined");
  if (cuda_device_count() > 0) {
    Stream gpu(Device::cuda(0));
    EXPECT_THROW_WITH(Tensor::zeros({2}, gpu).to(DType::Float64, gpu), NotSupported,
                      "float64 exists on the CPU only");
    EXPECT_THROW_WITH(f.to(DType::Float64, gpu), InvalidArgument, "use a stream of its device");
  }
}

TEST(TensorCuda, CopyBetweenTwoGpusIsPeerOrStaged) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  Stream s0(Device::cuda(0)), s1(Device::cuda(1));
  const auto values = random_values(1 << 20, 10);
  Tensor a = Tensor::from_host<float>(values, {1 << 20}, s0);
  Tensor b = a.to(Device::cuda(1), s1);
  EXPECT_EQ(b.to_host<float>(s1), values);
}

TEST(TensorCuda, HostStreamCannotDriveDeviceCopies) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  Stream gpu(Device::cuda(0));
  Tensor a = Tensor::zeros({4}, gpu);
  Tensor h = Tensor::zeros({4}, Device::cpu());
  EXPECT_THROW_WITH(copy_tensor(h, a, default_stream(Device::cpu())), InvalidArgument,
                    "needs a stream of the GPU");
}

}  // namespace
}  // namespace towerlab::testing
