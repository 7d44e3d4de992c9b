// The fixture of the 16-bit tests of the ops that compute on bfloat16 and float16
// tensors in float32 (ReLU, bias add, the activations: kernels/reference/math_type.h):
// one test body on {cpu, cuda:0} x {bfloat16, float16}. The CUDA cases skip
// without a GPU as BackendTest's do; in CI they run on the emulated GPUs.
//
// Values travel as float vectors: make() rounds them into a 16-bit tensor, host()
// widens a tensor back (exactly, and one to one, so equal floats are equal 16-bit
// values, NaN payloads included), and narrow<T> / widen give the host-side arrays
// that the references (templated on T) take.
#pragma once

#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_isa.h"
#include "engine/half.h"
#include "test_util.h"

namespace towerlab::testing {

template <typename T>
std::vector<T> narrow(const std::vector<float>& values) {
  std::vector<T> out;
  out.reserve(values.size());
  for (float v : values) out.push_back(T(v));
  return out;
}

template <typename T>
std::vector<float> widen(const std::vector<T>& values) {
  std::vector<float> out;
  out.reserve(values.size());
  for (T v : values) out.push_back(static_cast<float>(v));
  return out;
}

class SixteenBitTest : public ::testing::TestWithParam<std::tuple<Device, DType>> {
 protected:
  void SetUp() override {
    if (device().is_cuda()) {
      skip_without_cuda_device();
      if (IsSkipped() || HasFatalFailure()) return;
    }
    stream_ = std::make_unique<Stream>(device());
  }
  Device device() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  Stream& stream() { return *stream_; }

  // `values` rounded to nearest even into a dtype() tensor on the device.
  Tensor make(const std::vector<float>& values, const Shape& shape) {
    return cast(make32(values, shape), dtype(), stream());
  }
  Tensor make32(const std::vector<float>& values, const Shape& shape) {
    return Tensor::from_host<float>(values, shape, stream());
  }
  // t's values widened to float32.
  std::vector<float> host(const Tensor& t) {
    return cast(t, DType::Float32, stream()).to_host<float>(stream());
  }
  // testing::for_each_cpu_isa on this test's device (the CPU's 16-bit kernels
  // convert with code chosen at run time: kernels/cpu/convert16.h).
  template <typename Fn>
  void for_each_cpu_isa(Fn&& fn) {
    testing::for_each_cpu_isa(device(), fn);
  }
  // fn.template operator()<T>() with T dtype()'s type (bfloat16 or float16), for
  // the references, which are templated on it.
  template <typename Fn>
  void typed(Fn&& fn) const {
    if (dtype() == DType::BFloat16) {
      fn.template operator()<bfloat16>();
    } else {
      fn.template operator()<float16>();
    }
  }

 private:
  std::unique_ptr<Stream> stream_;
};

// n values uniform in [low, high) from `seed`, with NaN, +-infinity, -0, +0 and a
// float16 subnormal (2^-20) at the first positions, so that every test of a 16-bit
// op sees the values its contract names.
inline std::vector<float> values_with_specials(std::size_t n, unsigned seed, float low = -3.0f,
                                               float high = 3.0f) {
  std::vector<float> v = random_values(n, seed, low, high);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {
      std::numeric_limits<float>::quiet_NaN(), inf, -inf, -0.0f, 0.0f, 9.5367431640625e-7f};
  for (std::size_t i = 0; i < n && i < std::size(specials); ++i) v[i] = specials[i];
  return v;
}

inline std::string sixteen_bit_name(
    const ::testing::TestParamInfo<std::tuple<Device, DType>>& info) {
  const Device device = std::get<0>(info.param);
  return (device.is_cpu() ? std::string("cpu") : "cuda" + std::to_string(device.index)) + "_" +
         dtype_name(std::get<1>(info.param));
}

#define TL_INSTANTIATE_SIXTEEN_BIT(Fixture)                                            \
  INSTANTIATE_TEST_SUITE_P(                                                            \
      SixteenBit, Fixture,                                                             \
      ::testing::Combine(                                                              \
          ::testing::Values(::towerlab::Device::cpu(), ::towerlab::Device::cuda(0)),   \
          ::testing::Values(::towerlab::DType::BFloat16, ::towerlab::DType::Float16)), \
      ::towerlab::testing::sixteen_bit_name)

}  // namespace towerlab::testing
