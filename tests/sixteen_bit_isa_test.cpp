// The 16-bit element-wise CPU kernels under every ISA the CPU has: ReLU and bias add
// (plain and fused with ReLU; the activations' 16-bit test runs every ISA itself,
// tests/activation_test.cpp) convert their bfloat16 and float16 values with
// kernels/cpu/convert16.h, whose code is chosen at run time
// (Portable: the references' scalar conversions; AVX2 with F16C: eight lanes;
// AVX-512: sixteen), as TOWERLAB_GEMM_ISA or set_gemm_isa pins it
// (kernels/cpu/x86.h). Each ISA must give the references' bits, on lengths that
// leave a partial vector and cross the kernels' conversion blocks (1024 values),
// and bias rows that straddle them. The other 16-bit tests run the default ISA.
#include <string>
#include <vector>

#include "kernels/reference/bias.h"
#include "kernels/reference/relu.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// The ISAs are the CPU kernels': the CPU instances only (a CUDA instance would
// only skip, and every CUDA case must run on the emulated GPUs).
class SixteenBitIsaTest : public SixteenBitTest {};
INSTANTIATE_TEST_SUITE_P(SixteenBit, SixteenBitIsaTest,
                         ::testing::Combine(::testing::Values(Device::cpu()),
                                            ::testing::Values(DType::BFloat16, DType::Float16)),
                         sixteen_bit_name);

const std::vector<std::int64_t> kLengths = {5, 17, 1029, 4099};

TEST_P(SixteenBitIsaTest, ReluIsTheReferenceBitForBit) {
  for_each_cpu_isa([&](const std::string& isa) {
    for (std::int64_t n : kLengths) {
      const auto size = static_cast<std::size_t>(n);
      const auto xv = values_with_specials(size, 41), gyv = values_with_specials(size, 42);
      const auto sentinel = random_values(size, 43, -100.0f, 100.0f);
      Tensor x = make(xv, {n}), grad_y = make(gyv, {n}), y = Tensor::empty({n}, stream(), dtype());
      Tensor added = make(sentinel, {n}), assigned = make(sentinel, {n});
      relu_forward(y, x, stream());
      relu_backward(added, grad_y, y, stream());
      relu_backward(assigned, grad_y, y, stream(), GradWrite::Assign);
      typed([&]<typename T>() {
        const std::vector<T> x16 = narrow<T>(xv), gy16 = narrow<T>(gyv);
        std::vector<T> ey(size), eadded = narrow<T>(sentinel), eassigned = eadded;
        reference::relu_forward(ey.data(), x16.data(), n);
        reference::relu_backward(eadded.data(), gy16.data(), ey.data(), n, GradWrite::Accumulate);
        reference::relu_backward(eassigned.data(), gy16.data(), ey.data(), n, GradWrite::Assign);
        const std::string where = isa + ", n = " + std::to_string(n);
        EXPECT_EQ(bits(host(y)), bits(widen(ey))) << where;
        EXPECT_EQ(bits(host(added)), bits(widen(eadded))) << where;
        EXPECT_EQ(bits(host(assigned)), bits(widen(eassigned))) << where;
        EXPECT_NE(bits(widen(eadded)), bits(widen(eassigned))) << "control, " << where;
      });
    }
  });
}

// Shapes: rows of 77 with tails, [N,C] rows, rows of 1023 across the conversion
// blocks, and [1029,3], whose channels wrap across a block's end.
TEST_P(SixteenBitIsaTest, BiasAddIsTheReferenceBitForBit) {
  const std::vector<Shape> shapes = {{3, 5, 7, 11}, {7, 13}, {2, 3, 33, 31}, {1029, 3}};
  for_each_cpu_isa([&](const std::string& isa) {
    for (const Shape& shape : shapes) {
      const std::int64_t N = shape[0], C = shape[1], n = numel_of(shape), S = n / (N * C);
      const auto size = static_cast<std::size_t>(n);
      const auto xv = values_with_specials(size, 44), yv = random_values(size, 45);
      const auto gyv = random_values(size, 46), sentinel = random_values(size, 47, -8.0f, 8.0f);
      const auto bv = random_values(static_cast<std::size_t>(C), 48);
      Tensor x = make(xv, shape), bias = make32(bv, {C});
      Tensor y = Tensor::empty(shape, stream(), dtype()),
             z = Tensor::empty(shape, stream(), dtype());
      bias_add_forward(y, x, bias, stream());
      bias_add_relu_forward(z, x, bias, stream());
      Tensor out = make(yv, shape), grad_y = make(gyv, shape), grad_x = make(sentinel, shape);
      Tensor grad_bias = make32(std::vector<float>(C, 1.0f), {C});
      Tensor fused_bias = make32(std::vector<float>(C, 1.0f), {C});
      bias_add_backward(grad_bias, grad_y, stream());
      bias_add_relu_backward(grad_x, fused_bias, grad_y, out, stream());
      typed([&]<typename T>() {
        const std::vector<T> x16 = narrow<T>(xv), y16 = narrow<T>(yv), gy16 = narrow<T>(gyv);
        std::vector<T> ey(size), ez(size), rounded_bias(size), egx = narrow<T>(sentinel);
        reference::bias_add_forward(ey.data(), x16.data(), bv.data(), N, C, S);
        reference::relu_forward(ez.data(), ey.data(), n);
        reference::relu_backward(egx.data(), gy16.data(), y16.data(), n, GradWrite::Accumulate);
        std::vector<float> sums(static_cast<std::size_t>(C), 1.0f);
        reference::bias_add_backward(sums.data(), gy16.data(), N, C, S);
        const std::string where = isa + ", " + to_string(shape);
        EXPECT_EQ(bits(host(y)), bits(widen(ey))) << where;
        EXPECT_EQ(bits(host(z)), bits(widen(ez))) << where;
        EXPECT_EQ(bits(host(grad_x)), bits(widen(egx))) << where;
        EXPECT_TRUE(all_close(host(grad_bias), sums, 1e-4, 1e-5)) << where;
        const std::vector<float> b16 = widen(narrow<T>(bv));
        reference::bias_add_forward(rounded_bias.data(), x16.data(), b16.data(), N, C, S);
        EXPECT_NE(bits(widen(rounded_bias)), bits(host(y))) << "control, " << where;
      });
    }
  });
}

}  // namespace
}  // namespace towerlab::testing
