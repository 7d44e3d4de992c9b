// Device strings, the list of devices present, and the errors for devices that
// do not exist.
#include "test_util.h"

namespace towerlab::testing {
namespace {

TEST(Device, ParsesNativeAndTensorFlowStrings) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cpu:0"), Device::cpu());
  EXPECT_EQ(Device::parse("/cpu:0"), Device::cpu());
  EXPECT_EQ(Device::parse("CPU"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("/gpu:1"), Device::cuda(1));
  EXPECT_EQ(Device::parse("gpu:12"), Device::cuda(12));
  EXPECT_EQ(Device::parse("/device:GPU:2"), Device::cuda(2));
  EXPECT_EQ(Device::parse("  cuda:1 "), Device::cuda(1));
}

TEST(Device, PrintsCanonicalNames) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(7).str(), "cuda:7");
  EXPECT_EQ(Device::parse("/gpu:4").str(), "cuda:4");
}

TEST(Device, RejectsMalformedStrings) {
  EXPECT_THROW_WITH(Device::parse("tpu:0"), DeviceError,
                    "cannot parse device 'tpu:0': unknown device type");
  EXPECT_THROW_WITH(Device::parse(""), DeviceError, "unknown device type");
  EXPECT_THROW_WITH(Device::parse("cuda:"), DeviceError, "missing device index");
  EXPECT_THROW_WITH(Device::parse("cuda:-1"), DeviceError, "non-negative integer");
  EXPECT_THROW_WITH(Device::parse("cuda:1x"), DeviceError, "non-negative integer");
  EXPECT_THROW_WITH(Device::parse("cuda0"), DeviceError, "expected ':'");
  EXPECT_THROW_WITH(Device::parse("cpu:1"), DeviceError, "there is one CPU device");
  EXPECT_THROW_WITH(Device::parse("gpu:99999999999"), DeviceError, "non-negative integer");
  // Every message shows the accepted forms.
  EXPECT_THROW_WITH(Device::parse("xpu"), DeviceError, "expected cpu, cuda:N, /cpu:0 or /gpu:N");
}

TEST(Device, ParsesListsKeepingRepeats) {
  const auto devices = parse_device_list("cpu, cpu,/gpu:1,cuda:0");
  ASSERT_EQ(devices.size(), 4u);
  EXPECT_EQ(devices[0], Device::cpu());
  EXPECT_EQ(devices[1], Device::cpu());
  EXPECT_EQ(devices[2], Device::cuda(1));
  EXPECT_EQ(devices[3], Device::cuda(0));
  EXPECT_THROW_WITH(parse_device_list("cpu,,cpu"), DeviceError, "has an empty entry");
  EXPECT_THROW_WITH(parse_device_list(""), DeviceError, "has an empty entry");
  EXPECT_THROW_WITH(parse_device_list("cpu,gpu:x"), DeviceError, "cannot parse device 'gpu:x'");
}

TEST(Device, AvailableListStartsWithCpuAndCountsGpus) {
  const auto devices = available_devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices.front(), Device::cpu());
  EXPECT_EQ(static_cast<int>(devices.size()), 1 + cuda_device_count());
  for (int i = 0; i < cuda_device_count(); ++i) EXPECT_EQ(devices[1 + i], Device::cuda(i));
}

TEST(Device, MissingDeviceErrorListsThosePresent) {
  const Device missing = Device::cuda(cuda_device_count() + 3);
  std::string present = "devices present: cpu";
  for (int i = 0; i < cuda_device_count(); ++i) present += ", cuda:" + std::to_string(i);
  EXPECT_THROW_WITH(check_available(missing), DeviceError, present);
  EXPECT_THROW_WITH(check_available(missing), DeviceError, missing.str() + " is not available");
  EXPECT_NO_THROW(check_available(Device::cpu()));
  // Creating anything on it fails the same way, before touching CUDA.
  EXPECT_THROW_WITH(Stream{missing}, DeviceError, "is not available");
  EXPECT_THROW_WITH(Tensor::empty({2}, missing), DeviceError, "is not available");
}

TEST(Device, DescribeNamesTheDevice) {
  EXPECT_NE(describe(Device::cpu()).find("cpu ("), std::string::npos);
  for (int i = 0; i < cuda_device_count(); ++i) {
    EXPECT_NE(describe(Device::cuda(i)).find("sm_"), std::string::npos);
  }
}

}  // namespace
}  // namespace towerlab::testing
