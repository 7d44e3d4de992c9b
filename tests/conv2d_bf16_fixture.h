// The fixture of the CPU's bfloat16 conv2d tests (tests/conv2d_bf16_cpu_test.cpp:
// the lowering; tests/conv2d_planes_bf16_test.cpp: the padded planes): the three
// passes on bfloat16 operands under one conv2d algorithm, with the vdpbf16ps
// kernel selected (the cases skip on a CPU without avx512_bf16), each held to the
// bound kernels/conv2d.h states for exact products summed in float32,
//   |got - want| <= 2 (n + 2) 2^-24 (sum of |terms| + |the sentinel|),
// around the plain reference in double on the bfloat16 values (tests/conv2d_gemm_bound.h).
// y over NaN, in float32 and in bfloat16 (the float32 y rounded once, bit for bit);
// grad_weight and grad_bias onto sentinels; grad_x assigned over NaN or added onto a
// sentinel.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "conv2d_case.h"
#include "conv2d_gemm_bound.h"
#include "engine/half.h"
#include "engine/settings.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {

inline constexpr float kWeightSentinel = 0.5f, kBiasSentinel = -0.25f, kDataSentinel = 0.75f;

inline std::vector<float> rounded_bf16(const std::vector<float>& v) {
  return widen(narrow<bfloat16>(v));
}

template <Conv2dAlgorithm Algorithm>
class Conv2dBf16Fixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!bf16_gemm_kernel_supported(Bf16GemmKernel::Avx512Bf16)) {
      GTEST_SKIP() << "this CPU does not report avx512_bf16: the vdpbf16ps path cannot run";
    }
    set_bf16_gemm_kernel(Bf16GemmKernel::Avx512Bf16);
  }
  void TearDown() override { set_bf16_gemm_kernel(saved_); }

  cpu::ScopedConv2dAlgorithm algorithm_{Algorithm};

  Tensor filled(float value, const Shape& shape) {
    return Tensor::from_host<float>(std::vector<float>(std::size_t(numel_of(shape)), value), shape,
                                    stream_);
  }
  Tensor bf16(const std::vector<float>& v, const Shape& shape) {
    return Tensor::from_host<bfloat16>(narrow<bfloat16>(v), shape, stream_);
  }

  // The three passes on bfloat16 x, w and g (b float32): y over NaN (float32, and
  // a bfloat16 y alongside), grad_weight and grad_bias onto their sentinels, grad_x
  // assigned over NaN or accumulated onto its sentinel. y16: the bfloat16 y widened.
  ConvResults run(const ConvCase& k, const ConvOperands& v, GradWrite grad_x_write,
                  std::vector<float>* y16 = nullptr) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const Tensor x = bf16(v.x, k.x_shape()), w = bf16(v.w, k.w_shape());
    const Tensor b = k.bias ? Tensor::from_host<float>(v.b, {k.K}, stream_) : Tensor();
    Tensor y = filled(nan, k.y_shape());
    conv2d_forward(y, x, w, b, k.params, stream_);
    if (y16 != nullptr) {
      Tensor y_bf16 = Tensor::from_host<bfloat16>(
          std::vector<bfloat16>(std::size_t(numel_of(k.y_shape())), bfloat16(nan)), k.y_shape(),
          stream_);
      conv2d_forward(y_bf16, x, w, b, k.params, stream_);
      y16->clear();
      for (bfloat16 value : y_bf16.to_host<bfloat16>(stream_)) {
        y16->push_back(static_cast<float>(value));
      }
    }
    Tensor grad_x = filled(grad_x_write == GradWrite::Assign ? nan : kDataSentinel, k.x_shape());
    Tensor grad_w = filled(kWeightSentinel, k.w_shape());
    Tensor grad_b = k.bias ? filled(kBiasSentinel, {k.K}) : Tensor();
    conv2d_backward(grad_x, grad_w, grad_b, bf16(v.g, k.y_shape()), x, w, k.params, stream_,
                    grad_x_write);
    return {y.to_host<float>(stream_), grad_x.to_host<float>(stream_),
            grad_w.to_host<float>(stream_),
            k.bias ? grad_b.to_host<float>(stream_) : std::vector<float>()};
  }

  // One case against the reference on the bfloat16 values.
  void check(const ConvCase& k, unsigned seed, GradWrite grad_x_write) {
    SCOPED_TRACE(k.name +
                 (grad_x_write == GradWrite::Assign ? ", grad_x assigned" : ", grad_x added"));
    ASSERT_TRUE(
        conv2d_multiplies_16bit(k.x_shape(), k.w_shape(), DType::BFloat16, k.params, stream_))
        << "the case does not take the bfloat16 GEMM path";
    const ConvOperands v = operands(k, seed);
    std::vector<float> y16;
    const ConvResults got = run(k, v, grad_x_write, &y16);
    const auto x = rounded_bf16(v.x), w = rounded_bf16(v.w), g = rounded_bf16(v.g);
    const Reference want = reference(k, widen(x), widen(w), widen(v.b), widen(g));
    const Reference scale =
        reference(k, magnitudes(x), magnitudes(w), magnitudes(v.b), magnitudes(g));
    const ConvLengths n = lengths(k);
    const double data_sentinel = grad_x_write == GradWrite::Assign ? 0.0 : kDataSentinel;
    EXPECT_TRUE(within_bound(got.y, want.y, scale.y, n.forward, 0.0)) << "y";
    EXPECT_EQ(y16, rounded_bf16(got.y)) << "the bfloat16 y is not the float32 y rounded once";
    EXPECT_TRUE(within_bound(got.grad_x, want.grad_x, scale.grad_x, n.data, data_sentinel))
        << "grad_x";
    EXPECT_TRUE(within_bound(got.grad_w, want.grad_w, scale.grad_w, n.weight, kWeightSentinel))
        << "grad_w";
    if (k.bias) {
      EXPECT_TRUE(within_bound(got.grad_b, want.grad_b, scale.grad_b, n.weight, kBiasSentinel))
          << "grad_b";
    }
  }

  // The same bits whatever the threads (1, 2 and 3): each image's products, and the
  // weight gradient's fixed groups of images, do not depend on who runs them.
  void expect_same_bits_for_any_thread_count(const ConvCase& k, unsigned seed) {
    const ConvOperands v = operands(k, seed);
    const int saved = num_threads();
    set_num_threads(1);
    const ConvResults one = run(k, v, GradWrite::Assign);
    for (int threads : {2, 3}) {
      set_num_threads(threads);
      const ConvResults many = run(k, v, GradWrite::Assign);
      EXPECT_EQ(many.y, one.y) << threads << " threads";
      EXPECT_EQ(many.grad_x, one.grad_x) << threads << " threads";
      EXPECT_EQ(many.grad_w, one.grad_w) << threads << " threads";
    }
    set_num_threads(saved);
  }

  Stream stream_{Device::cpu()};
  Bf16GemmKernel saved_ = bf16_gemm_kernel();
};

}  // namespace towerlab::testing
