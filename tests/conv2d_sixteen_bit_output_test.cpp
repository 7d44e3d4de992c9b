// conv2d's forward into a 16-bit y (kernels/conv2d.h, "Mixed precision"): on the CPU
// the float32 sums are rounded once, to nearest even, where the direct kernels,
// Winograd's output transform and the GEMM path store them, with no float32 copy
// of y (but for a float16 y of Winograd F(4x4), rounded from float32 sums in one
// pass). The specification is the float32 y of the same call (the widening path)
// cast to y's dtype: every case must give its bits, on every ISA this CPU has
// (tests/cpu_isa.h), in bfloat16 and in float16.
//
// The cases reach each path: FashionNet's conv1 (one channel, 3x3: the direct
// kernels on AVX2 and AVX-512, im2col + GEMM on Portable) and conv2 (Winograd under
// Auto), odd sizes (a pixel count that leaves a partial vector, odd P and Q for
// Winograd's edge tiles, Q below eight), each Winograd shape again under Im2col and
// small ones under Winograd, strides, dilation, a 1x1 layer (no lowering), grouped
// and depthwise layers (a float32 y cast once), with and without a bias; and biases
// that are 16-bit ties (zero weights, so y is the tie itself) on each path. y is
// filled with a sentinel first. Controls: the sentinel is none of the expected
// values (a kernel that writes nothing fails), and the expected values truncated
// toward zero differ from what the kernels wrote (a comparison that cannot tell
// the rounding apart fails).
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "conv2d_case.h"
#include "cpu_isa.h"
#include "engine/half.h"
#include "kernels/cast.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/winograd.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr std::uint16_t kSentinel = 0x7fa5;  // a NaN in both formats: no sum rounds to it

template <typename T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint16_t> out;
  out.reserve(v.size());
  for (const T& x : v) out.push_back(x.bits);
  return out;
}

// f rounded toward zero to T: to nearest, then one step back toward zero where that
// went away from it (f finite and within T's range, as every sum here is).
template <typename T>
std::uint16_t truncated_bits(float f) {
  const T nearest(f);
  const float back = static_cast<float>(nearest);
  const bool away = (back < 0 ? -back : back) > (f < 0 ? -f : f);
  return static_cast<std::uint16_t>(nearest.bits - (away ? 1 : 0));
}

template <typename T>
DType dtype_of() {
  return std::is_same_v<T, bfloat16> ? DType::BFloat16 : DType::Float16;
}

// A float32 a 16-bit T rounds at a tie: 1 + (2j + 1) half-ulps of T, the kept part
// odd for odd j, even for even j (so half the ties round up, half down).
template <typename T>
float tie(int j) {
  const int mantissa = std::is_same_v<T, bfloat16> ? 7 : 10;
  return 1.0f + static_cast<float>(2 * j + 1) * std::ldexp(1.0f, -mantissa - 1);
}

class Conv2dSixteenBitOutput : public ::testing::Test {
 protected:
  const Stream& stream() const { return stream_; }

  // One case in T: the 16-bit y against the float32 y cast, bit for bit, with the
  // controls; returns how many elements the truncation control told apart.
  template <typename T>
  std::int64_t check(const ConvCase& k, const std::string& where, bool ties = false) {
    SCOPED_TRACE(k.name + " " + dtype_name(dtype_of<T>()) + ", " + where);
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 11);
    auto wv = random_values(std::size_t(numel_of(k.w_shape())), 12);
    auto bv = random_values(std::size_t(k.K), 13);
    if (ties) {
      wv.assign(wv.size(), 0.0f);
      for (std::int64_t j = 0; j < k.K; ++j)
        bv[std::size_t(j)] = (j % 3 == 2 ? -1 : 1) * tie<T>(int(j));
    }
    std::vector<T> x16, w16;
    for (float v : xv) x16.push_back(T(v));
    for (float v : wv) w16.push_back(T(v));
    const Tensor x = Tensor::from_host<T>(x16, k.x_shape(), stream());
    const Tensor w = Tensor::from_host<T>(w16, k.w_shape(), stream());
    const Tensor b = k.bias ? Tensor::from_host<float>(bv, {k.K}, stream()) : Tensor();

    Tensor sums = Tensor::empty(k.y_shape(), stream(), DType::Float32);
    conv2d_forward(sums, x, w, b, k.params, stream());
    const std::vector<T> want = cast(sums, dtype_of<T>(), stream()).template to_host<T>(stream());

    const std::vector<T> sentinel(want.size(), T::from_bits(kSentinel));
    Tensor y = Tensor::from_host<T>(sentinel, k.y_shape(), stream());
    conv2d_forward(y, x, w, b, k.params, stream());
    const std::vector<std::uint16_t> got = bits_of(y.to_host<T>(stream()));
    EXPECT_EQ(got, bits_of(want));

    std::int64_t told_apart = 0, sentinels = 0;
    const std::vector<float> float32 = sums.to_host<float>(stream());
    for (std::size_t i = 0; i < want.size(); ++i) {
      sentinels += want[i].bits == kSentinel;
      told_apart += truncated_bits<T>(float32[i]) != got[i];
    }
    EXPECT_EQ(sentinels, 0) << "control: the sentinel is an expected value";
    EXPECT_GT(told_apart, 0) << "control: truncation gives the same bits";
    return told_apart;
  }

  template <typename Fn>
  void each_dtype(const Fn& fn) {
    fn.template operator()<bfloat16>();
    fn.template operator()<float16>();
  }

 private:
  Stream stream_{Device::cpu()};
};

std::vector<ConvCase> cases() {
  std::vector<ConvCase> c = {
      {"fashion_conv1", 3, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1), false},
      {"fashion_conv2", 2, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1), false},
      {"direct_odd_pixels", 2, 1, 9, 11, 5, 3, 3, make_params(1, 1, 1, 1)},
      {"direct_pad0", 3, 1, 10, 13, 3, 3, 3, make_params(1, 1, 0, 0)},
      {"one_channel_narrow", 2, 1, 10, 9, 4, 3, 3, make_params(1, 1, 0, 0)},  // Q = 7
      {"winograd_odd_pad0", 3, 16, 9, 11, 17, 3, 3, make_params(1, 1, 0, 0)},
      {"winograd_odd_pad1", 2, 16, 7, 10, 16, 3, 3, make_params(1, 1, 1, 1)},
      {"stride2_ragged", 2, 3, 8, 7, 5, 3, 3, make_params(2, 2, 1, 1)},
      {"dilation2_stride2x1", 2, 2, 9, 8, 3, 3, 2, make_params(2, 1, 1, 0, 2, 2)},
      {"one_by_one", 3, 4, 5, 6, 7, 1, 1, make_params(1, 1, 0, 0)},
      {"grouped", 2, 4, 6, 5, 6, 3, 3, make_params(1, 1, 1, 1, 1, 1, 2)},
      {"depthwise", 2, 3, 6, 7, 6, 3, 3, make_params(1, 1, 1, 1, 1, 1, 3)},
  };
  return c;
}

TEST_F(Conv2dSixteenBitOutput, EveryPathStoresTheFloat32SumsCastOnEveryIsa) {
  for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
    each_dtype([&]<typename T>() {
      for (const ConvCase& k : cases()) check<T>(k, isa);
    });
  });
}

// Each 3x3 stride-1 shape under both algorithms, whatever Auto picks: Winograd's
// output transforms (F(2x2,3x3) and F(4x4,3x3)) and the GEMM path each take every
// shape.
TEST_F(Conv2dSixteenBitOutput, WinogradAndIm2colEachStoreTheCastBits) {
  struct Path {
    Conv2dAlgorithm algorithm;
    cpu::WinogradTile tile;
    const char* name;
  };
  for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
    for (const Path& path : {Path{Conv2dAlgorithm::Winograd, cpu::WinogradTile::F2x2, ", F(2x2)"},
                             Path{Conv2dAlgorithm::Winograd, cpu::WinogradTile::F4x4, ", F(4x4)"},
                             Path{Conv2dAlgorithm::Im2col, cpu::WinogradTile::Auto, ", Im2col"}}) {
      const cpu::ScopedConv2dAlgorithm scoped(path.algorithm);
      const cpu::ScopedWinogradTile tile(path.tile);
      const std::string where = isa + path.name;
      each_dtype([&]<typename T>() {
        for (const ConvCase& k : cases()) {
          if (k.R == 3 && k.S == 3 && k.params.stride_h == 1 && k.params.stride_w == 1 &&
              k.params.groups == 1) {
            check<T>(k, where);
          }
        }
      });
    }
  });
}

// Zero weights and biases at 16-bit ties: y is the tie itself, rounded to even by
// each path's store (half the ties up, half down), as the cast rounds it.
TEST_F(Conv2dSixteenBitOutput, TiesRoundToEvenOnEveryPath) {
  const std::vector<ConvCase> ties = {
      {"direct_ties", 2, 1, 7, 9, 6, 3, 3, make_params(1, 1, 1, 1)},
      {"winograd_ties", 2, 16, 5, 7, 16, 3, 3, make_params(1, 1, 1, 1)},
      {"gemm_ties", 2, 3, 7, 6, 6, 3, 3, make_params(2, 2, 1, 1)},
  };
  for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
    each_dtype([&]<typename T>() {
      for (const ConvCase& k : ties) {
        // Every y is a tie: truncation tells apart the half that rounds up.
        EXPECT_GT(check<T>(k, isa, true), 0);
      }
    });
  });
}

// A 16-bit y must be of the operands' dtype; beside float32 operands it is refused
// by the operands' check.
TEST_F(Conv2dSixteenBitOutput, AYOfAnotherDtypeIsRefused) {
  const Tensor x = Tensor::from_host<bfloat16>(std::vector<bfloat16>(2 * 3 * 5 * 5, bfloat16(1.0f)),
                                               {2, 3, 5, 5}, stream());
  const Tensor w = Tensor::from_host<bfloat16>(std::vector<bfloat16>(4 * 3 * 3 * 3, bfloat16(1.0f)),
                                               {4, 3, 3, 3}, stream());
  Tensor y = Tensor::empty({2, 4, 3, 3}, stream(), DType::Float16);
  EXPECT_THROW_WITH(conv2d_forward(y, x, w, Tensor(), {}, stream()), NotSupported,
                    "conv2d_forward: y is float16[2,4,3,3] but with bfloat16 operands y is "
                    "float32 or bfloat16");
  Tensor y16 = Tensor::empty({2, 4, 3, 3}, stream(), DType::BFloat16);
  EXPECT_ANY_THROW(conv2d_forward(y16, cast(x, DType::Float32, stream()),
                                  cast(w, DType::Float32, stream()), Tensor(), {}, stream()));
}

}  // namespace
}  // namespace towerlab::testing
