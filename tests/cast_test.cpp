// bfloat16 and float16: engine/half.h's conversions against an oracle that works
// from the definition (the nearest representable value, ties to the even pattern),
// the cast on every backend against its reference, 16-bit tensors through creation,
// copies, to_host and printing, and the typed error of an op that does not take them.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu_isa.h"
#include "engine/half.h"
#include "kernels/cast.h"
#include "kernels/cpu/convert16.h"
#include "kernels/reference/cast.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Floats of every sign and exponent, each with mantissas at and around both 16-bit
// formats' ties, signaling and quiet NaN payloads and subnormals: 8704 values.
std::vector<float> floats_of_every_exponent() {
  std::vector<float> floats;
  for (std::uint32_t e = 0; e < 0x200; ++e) {  // sign and exponent
    for (std::uint32_t m : {0x000000u, 0x000001u, 0x000fffu, 0x001000u, 0x001001u, 0x002000u,
                            0x003000u, 0x007fffu, 0x008000u, 0x008001u, 0x018000u, 0x3fffffu,
                            0x400000u, 0x400001u, 0x7fe000u, 0x7ff000u, 0x7fffffu}) {
      floats.push_back(from_bits((e << 23) | m));
    }
  }
  return floats;
}

// A 16-bit format described by its field widths, decoded with ldexp: the
// definition, not half.h's bit tricks.
struct Format {
  int exponent_bits, mantissa_bits, bias;
  std::uint16_t max_finite() const {
    return static_cast<std::uint16_t>((((1u << exponent_bits) - 1u) << mantissa_bits) - 1u);
  }
  // The value of a non-negative pattern up to max_finite() + 1 (which stands for the
  // next power of two, the value an overflow rounds against).
  double value(std::uint32_t p) const {
    const std::uint32_t e = p >> mantissa_bits, m = p & ((1u << mantissa_bits) - 1u);
    if (e == 0) return std::ldexp(double(m), 1 - bias - mantissa_bits);
    return std::ldexp(1.0 + std::ldexp(double(m), -mantissa_bits), int(e) - bias);
  }
  // The nearest pattern to a finite x, ties to the even pattern; past the largest
  // finite value, the infinity.
  std::uint16_t nearest(double x) const {
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    std::uint32_t lo = 0, hi = max_finite() + 1u;  // value(lo) <= a < value(hi), or a is big
    if (a >= value(hi)) return static_cast<std::uint16_t>(sign | hi);
    while (hi - lo > 1) {
      const std::uint32_t mid = (lo + hi) / 2;
      (value(mid) <= a ? lo : hi) = mid;
    }
    const double below = a - value(lo), above = value(hi) - a;
    const std::uint32_t p = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
    return static_cast<std::uint16_t>(sign | p);
  }
};
constexpr Format kBFloat16{8, 7, 127};
constexpr Format kFloat16{5, 10, 15};

template <typename H>
void expect_matches_oracle(const Format& format) {
  for (std::uint32_t p = 0; p <= format.max_finite(); ++p) {
    const double v = format.value(p), next = format.value(p + 1);
    const float mid = static_cast<float>((v + next) / 2);  // exact: float has the bits
    ASSERT_EQ(double(mid), (v + next) / 2);
    for (float x : {static_cast<float>(v), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      for (float s : {x, -x}) {
        ASSERT_EQ(H(s).bits, format.nearest(s)) << "x = " << s << " (pattern " << p << ")";
      }
    }
  }
}

TEST(HalfConversion, BFloat16RoundsToNearestEven) {
  expect_matches_oracle<bfloat16>(kBFloat16);
}

TEST(HalfConversion, Float16RoundsToNearestEvenWithSubnormalsAndOverflow) {
  expect_matches_oracle<float16>(kFloat16);
  EXPECT_EQ(float16(65519.996f).bits, 0x7bff);  // below the halfway point: 65504
  EXPECT_EQ(float16(65520.0f).bits, 0x7c00);    // the tie goes to the even pattern: inf
  EXPECT_EQ(float16(-1e9f).bits, 0xfc00);
  EXPECT_EQ(float16(std::ldexp(1.0f, -25)).bits, 0x0000);  // a tie to zero
  EXPECT_EQ(float16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits, 0x0001);
  EXPECT_EQ(float16(-std::ldexp(1.0f, -26)).bits, 0x8000);  // the sign of a zero is kept
}

TEST(HalfConversion, EveryPatternWidensExactlyAndRoundTrips) {
  for (std::uint32_t p = 0; p < 0x10000; ++p) {
    const auto b = bfloat16::from_bits(static_cast<std::uint16_t>(p));
    const auto h = float16::from_bits(static_cast<std::uint16_t>(p));
    const float fb = static_cast<float>(b), fh = static_cast<float>(h);
    ASSERT_EQ(bits_of(fb), p << 16) << "bfloat16 is float32's top half";
    const bool h_nan = (p & 0x7c00) == 0x7c00 && (p & 0x03ff) != 0;
    if (!h_nan) {
      const double expected = ((p & 0x7c00) == 0x7c00) ? std::numeric_limits<double>::infinity()
                                                       : kFloat16.value(p & 0x7fff);
      ASSERT_EQ(double(std::fabs(fh)), expected) << "pattern " << p;
      ASSERT_EQ(std::signbit(fh), (p & 0x8000) != 0);
    }
    // Back to 16 bits: the same pattern, a NaN only made quiet (sign and top payload kept).
    const std::uint16_t quiet_b = std::isnan(fb) ? 0x0040 : 0, quiet_h = h_nan ? 0x0200 : 0;
    ASSERT_EQ(bfloat16(fb).bits, p | quiet_b) << "pattern " << p;
    ASSERT_EQ(float16(fh).bits, p | quiet_h) << "pattern " << p;
  }
}

TEST(HalfConversion, NaNAndInfinityAreKept) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bfloat16(inf).bits, 0x7f80);
  EXPECT_EQ(bfloat16(-inf).bits, 0xff80);
  EXPECT_EQ(float16(inf).bits, 0x7c00);
  EXPECT_EQ(float16(-inf).bits, 0xfc00);
  // A signalling NaN with its payload in the low bits only: truncation would make it
  // an infinity.
  const float snan = from_bits(0x7f800001u), neg_nan = from_bits(0xffc00000u);
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(snan))));
  EXPECT_TRUE(std::isnan(static_cast<float>(float16(snan))));
  EXPECT_EQ(bfloat16(neg_nan).bits, 0xffc0);
  EXPECT_EQ(float16(neg_nan).bits, 0xfe00);
  // The largest float rounds past bfloat16's largest finite value.
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);
}

TEST(HalfConversion, Float64RoundsOnceNotTwice) {
  // Just above a tie of bfloat16 (1 + 2^-8, between 1 and 1 + 2^-7) by less than
  // float32's half ulp: float32 would round it onto the tie, which goes to the even
  // pattern (1.0); the value is above the tie and rounds up.
  const double above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(bfloat16(static_cast<float>(above_tie)).bits, 0x3f80) << "control: twice rounds down";
  EXPECT_EQ(bfloat16(above_tie).bits, 0x3f81);
  const double h_above_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(float16(static_cast<float>(h_above_tie)).bits, 0x3c00) << "control";
  EXPECT_EQ(float16(h_above_tie).bits, 0x3c01);
  EXPECT_EQ(float16(1e300).bits, 0x7c00);
  EXPECT_EQ(bfloat16(-1e300).bits, 0xff80);
  EXPECT_EQ(float16(1e-300).bits, 0x0000);
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(std::nan("")))));
}

TEST(DTypeNames, ParseAndSize) {
  for (DType d : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  }
  EXPECT_EQ(dtype_size(DType::BFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::Float16), 2u);
  EXPECT_STREQ(dtype_name(DType::BFloat16), "bfloat16");
  EXPECT_THROW_WITH(dtype_from_name("bf16"), InvalidArgument, "unknown dtype 'bf16'");
}

// The CPU cast runs the four float32 <-> 16-bit pairs through kernels/cpu/convert16.h,
// sixteen values at a time under AVX-512 and eight under AVX2: under every ISA the
// CPU has, every 16-bit pattern widens and floats of every exponent (each with
// mantissas at and around both formats' ties, signaling and quiet NaN payloads,
// subnormals) round to the reference's bits; the lengths leave tails of 1 to 15
// values for the reference to finish. (All 2^32 floats were checked once, outside
// the suite.)
TEST(CastCpu, EveryIsaGivesTheReferenceBits) {
  const RestoreGemmIsa restore;
  std::vector<std::uint16_t> patterns(0x10000);
  for (std::uint32_t p = 0; p < 0x10000; ++p) patterns[p] = static_cast<std::uint16_t>(p);
  const std::vector<float> floats = floats_of_every_exponent();
  int runs = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++runs;
    for (std::int64_t tail : {0, 1, 7, 15}) {
      const std::int64_t n = static_cast<std::int64_t>(floats.size()) - tail;
      const std::vector<float> in(floats.begin(), floats.begin() + n);
      const std::string where = "ISA " + std::to_string(int(isa)) + ", n " + std::to_string(n);
      Tensor f = Tensor::from_host<float>(in, {n}, cpu());
      std::vector<bfloat16> rb(in.size());
      std::vector<float16> rh(in.size());
      reference::cast(rb.data(), in.data(), n);
      reference::cast(rh.data(), in.data(), n);
      const auto gb = cast(f, DType::BFloat16, cpu()).to_host<bfloat16>(cpu());
      const auto gh = cast(f, DType::Float16, cpu()).to_host<float16>(cpu());
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(gb[i].bits, rb[i].bits) << where << ", float " << std::hex << bits_of(in[i]);
        ASSERT_EQ(gh[i].bits, rh[i].bits) << where << ", float " << std::hex << bits_of(in[i]);
      }
      const std::int64_t m = 0x10000 - tail;
      std::vector<bfloat16> b(m);
      std::vector<float16> h(m);
      std::memcpy(b.data(), patterns.data(), m * 2);
      std::memcpy(h.data(), patterns.data(), m * 2);
      std::vector<float> wb(m), wh(m);
      reference::cast(wb.data(), b.data(), m);
      reference::cast(wh.data(), h.data(), m);
      const auto got_b = cast(Tensor::from_host<bfloat16>(b, {m}, cpu()), DType::Float32, cpu())
                             .to_host<float>(cpu());
      const auto got_h = cast(Tensor::from_host<float16>(h, {m}, cpu()), DType::Float32, cpu())
                             .to_host<float>(cpu());
      for (std::int64_t i = 0; i < m; ++i) {
        ASSERT_EQ(bits_of(got_b[i]), bits_of(wb[i])) << where << ", bfloat16 " << std::hex << i;
        ASSERT_EQ(bits_of(got_h[i]), bits_of(wh[i])) << where << ", float16 " << std::hex << i;
      }
    }
  }
  EXPECT_GE(runs, 1);
}

// round_through (kernels/cast.h) is the two casts, float32 to the 16-bit dtype and
// back, bit for bit, under every ISA the CPU has, on the floats of the test above
// (8704 of them: several of the CPU's blocks, ties, NaN payloads, subnormals), with
// tails of 1 to 15 values; the control: its values are not all the floats it read.
// float64 or a 16-bit source, or a float32 target, is NotSupported.
// The portable four-lane store (kernels/cpu/convert16.h, Winograd F(4x4)'s bfloat16
// y) gives engine/half.h's bits on floats of every exponent, ties and NaNs among them,
// and writes only its first `count` values.
TEST(CastCpu, FourLaneBfloat16StoreGivesTheReferenceBits) {
  const std::vector<float> floats = floats_of_every_exponent();
  for (std::size_t i = 0; i + 4 <= floats.size(); i += 4) {
    const cpu::Vec4 v{floats[i], floats[i + 1], floats[i + 2], floats[i + 3]};
    for (int count : {4, 3}) {
      bfloat16 out[4];
      out[3] = bfloat16::from_bits(0x7777);  // a sentinel past a store of three
      cpu::round_store_first4(out, v, count);
      for (int lane = 0; lane < count; ++lane) {
        ASSERT_EQ(out[lane].bits, bfloat16(floats[i + lane]).bits)
            << "float " << std::hex << bits_of(floats[i + lane]);
      }
      if (count == 3) ASSERT_EQ(out[3].bits, 0x7777) << "a store of three wrote a fourth";
    }
  }
}

TEST(CastCpu, RoundThroughIsTheTwoCastsOnEveryIsa) {
  const std::vector<float> floats = floats_of_every_exponent();
  for_each_cpu_isa(Device::cpu(), [&](const std::string& isa) {
    for (DType through : {DType::BFloat16, DType::Float16}) {
      for (std::int64_t tail : {0, 1, 7, 15}) {
        const std::int64_t n = static_cast<std::int64_t>(floats.size()) - tail;
        const std::string where = isa + ", " + dtype_name(through) + ", n " + std::to_string(n);
        const Tensor f = Tensor::from_host<float>(
            std::vector<float>(floats.begin(), floats.begin() + n), {n}, cpu());
        const auto got = round_through(f, through, cpu()).to_host<float>(cpu());
        const auto expected =
            cast(cast(f, through, cpu()), DType::Float32, cpu()).to_host<float>(cpu());
        std::int64_t moved = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(bits_of(got[i]), bits_of(expected[i]))
              << where << ", float " << std::hex << bits_of(floats[i]);
          moved += bits_of(got[i]) != bits_of(floats[i]);
        }
        EXPECT_GT(moved, n / 4) << where;
      }
    }
  });
  const Tensor f = Tensor::zeros({3}, cpu());
  EXPECT_THROW_WITH(round_through(f, DType::Float32, cpu()), NotSupported,
                    "round_through: float32[3] on cpu through float32");
  EXPECT_THROW_WITH(round_through(cast(f, DType::Float64, cpu()), DType::BFloat16, cpu()),
                    NotSupported, "round_through: float64[3] on cpu through bfloat16");
}

// The first of the two steps from float64 to a 16-bit type (kernels/cpu/convert16.h,
// which the 16-bit activations take): under every ISA the CPU has, doubles of every
// float32 exponent and beyond (overflow, float32 subnormals, underflow to zero), of
// both signs, exact, halfway and just off, infinities and NaNs with payloads give
// engine/half.h's round_to_odd bits; 1029 values leave tails for the scalar code.
// The control: rounding to nearest differs from it on these values.
TEST(CastCpu, RoundToOddIsEngineHalfsOnEveryIsa) {
  const RestoreGemmIsa restore;
  std::vector<double> in;
  for (int e = -160; e <= 140; e += 3) {
    for (double m : {1.0, 1.0 + 0x1p-24, 1.0 + 0x1p-23, 1.0 + 0x1p-23 + 0x1p-40, 1.5 + 0x1p-30,
                     2.0 - 0x1p-52, 1.2345678901234}) {
      in.push_back(std::ldexp(m, e));
      in.push_back(-std::ldexp(m, e));
    }
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {0.0, -0.0, inf, -inf, std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::signaling_NaN(), -std::nan("0x12345"),
                   double(std::numeric_limits<float>::max()), 0x1.fffffffp127}) {
    in.push_back(v);
  }
  while (in.size() < 1029) in.push_back(std::ldexp(1.0 + double(in.size()) * 0x1p-35, -3));
  const auto n = static_cast<std::int64_t>(in.size());
  std::vector<std::uint32_t> expected, nearest;
  for (double d : in) {
    expected.push_back(bits_of(half_detail::round_to_odd(d)));
    nearest.push_back(bits_of(static_cast<float>(d)));
  }
  EXPECT_NE(expected, nearest) << "control";
  int runs = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++runs;
    std::vector<float> got(in.size());
    cpu::round_to_odd_float(got.data(), in.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits_of(got[i]), expected[i]) << "ISA " << int(isa) << ", double " << in[i];
    }
  }
  EXPECT_GE(runs, 1);
}

class CastTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(CastTest);

// Every bfloat16 and float16 pattern, and floats around their ties, cast on this
// backend and compared bit for bit with the reference.
TEST_P(CastTest, MatchesReferenceOnEveryPattern) {
  std::vector<std::uint16_t> patterns(0x10000);
  for (std::uint32_t p = 0; p < 0x10000; ++p) patterns[p] = static_cast<std::uint16_t>(p);
  std::vector<float> floats;
  for (std::uint32_t p = 0; p < 0x10000; p += 7) {
    floats.push_back(from_bits(p << 16));
    floats.push_back(from_bits((p << 16) | 0x8000u));  // a bfloat16 tie
    floats.push_back(from_bits((p << 16) | 0x8001u));
    floats.push_back(from_bits((p << 13) | 0x1000u));  // a float16 tie (normal range)
  }
  const std::int64_t n = static_cast<std::int64_t>(floats.size());
  Tensor f = make(floats, {n});
  for (DType to : {DType::BFloat16, DType::Float16}) {
    Tensor h = cast(f, to, stream());
    Tensor back = cast(h, DType::Float32, stream());
    std::vector<float> expected(floats.size());
    if (to == DType::BFloat16) {
      std::vector<bfloat16> r(floats.size());
      reference::cast(r.data(), floats.data(), n);
      reference::cast(expected.data(), r.data(), n);
      const auto got = h.to_host<bfloat16>(stream());
      for (std::size_t i = 0; i < r.size(); ++i) ASSERT_EQ(got[i].bits, r[i].bits) << i;
    } else {
      std::vector<float16> r(floats.size());
      reference::cast(r.data(), floats.data(), n);
      reference::cast(expected.data(), r.data(), n);
      const auto got = h.to_host<float16>(stream());
      for (std::size_t i = 0; i < r.size(); ++i) ASSERT_EQ(got[i].bits, r[i].bits) << i;
    }
    const auto widened = host(back);
    for (std::size_t i = 0; i < widened.size(); ++i) {
      ASSERT_EQ(bits_of(widened[i]), bits_of(expected[i])) << i;
    }
  }
  // 16-bit to 16-bit, all patterns, both ways.
  std::vector<bfloat16> b(patterns.size());
  std::memcpy(b.data(), patterns.data(), patterns.size() * 2);
  Tensor tb = Tensor::from_host<bfloat16>(b, {0x10000}, stream());
  const auto th = cast(tb, DType::Float16, stream()).to_host<float16>(stream());
  std::vector<float16> expected(patterns.size());
  reference::cast(expected.data(), b.data(), 0x10000);
  for (std::size_t i = 0; i < th.size(); ++i) ASSERT_EQ(th[i].bits, expected[i].bits) << i;
}

TEST_P(CastTest, SixteenBitTensorsAreCreatedCopiedAndPrinted) {
  Tensor z = Tensor::zeros({3}, stream(), DType::Float16);
  for (float16 v : z.to_host<float16>(stream())) EXPECT_EQ(v.bits, 0);
  const std::vector<bfloat16> values{bfloat16(1.0f), bfloat16(1.0f / 3), bfloat16(-2.5f),
                                     bfloat16(std::numeric_limits<float>::infinity())};
  Tensor t = Tensor::from_host<bfloat16>(values, {2, 2}, stream());
  EXPECT_EQ(t.describe(), "bfloat16[2,2] on " + device().str());
  EXPECT_EQ(t.nbytes(), 8u);
  EXPECT_EQ(t.str(), "bfloat16[2,2] on " + device().str() + " {1, 0.333984, -2.5, inf}");
  EXPECT_EQ(t.str(2), "bfloat16[2,2] on " + device().str() + " {1, 0.333984, ... (4 values)}");
  // Between devices, and within one through copy().
  Tensor on_cpu = t.to(Device::cpu(), stream());
  Tensor back = on_cpu.to(device(), stream());
  Tensor copied = Tensor::empty({4}, stream(), DType::BFloat16);
  copy(copied, back, stream());
  const auto out = copied.to_host<bfloat16>(stream());
  for (std::size_t i = 0; i < values.size(); ++i) EXPECT_EQ(out[i].bits, values[i].bits);
  EXPECT_THROW_WITH(t.to_host<float>(stream()), ShapeError, "asked for float32 values of bfloat16");
}

// An op that does not take the 16-bit dtypes says so, naming itself, the dtype and
// what it takes, before it touches memory.
TEST_P(CastTest, OpsWithoutSixteenBitKernelsThrowTypedErrors) {
  const std::string takes = device().is_cpu() ? "(float32, float64 on cpu" : "(float32 on cuda";
  Tensor x = Tensor::zeros({4}, stream(), DType::BFloat16);
  Tensor y = Tensor::zeros({4}, stream(), DType::BFloat16);
  EXPECT_THROW_WITH(softmax_forward(y, x, SoftmaxMask::None, stream()), NotSupported,
                    "softmax_forward: bfloat16 is not supported " + takes);
  EXPECT_THROW_WITH(add(y, x, x, stream()), NotSupported, "add: bfloat16 is not supported");
  // (matmul takes 16-bit operands on every device, tests/matmul_lowp_test.cpp; so do
  // ReLU, bias add and the activations, their tests' SixteenBit cases.)
  Tensor h = Tensor::zeros({2, 2}, stream(), DType::Float16);
  EXPECT_THROW_WITH(fill(h, 1.0, stream()), NotSupported, "fill: float16 is not supported");
  Tensor s = Tensor::zeros({1}, stream());
  EXPECT_THROW_WITH(sum(s, h, stream()), NotSupported, "sum: float16 is not supported");
  // Control: the same ops take float32.
  Tensor f = Tensor::zeros({4}, stream());
  Tensor g = Tensor::zeros({4}, stream());
  EXPECT_NO_THROW(softmax_forward(g, f, SoftmaxMask::None, stream()));
}

TEST_P(CastTest, RejectsMismatchedSizesAndFloat64OnAGpu) {
  Tensor a = Tensor::zeros({4}, stream());
  Tensor b = Tensor::zeros({3}, stream(), DType::BFloat16);
  EXPECT_THROW_WITH(cast(b, a, stream()), ShapeError, "cast: src float32[4]");
  if (device().is_cuda()) {
    EXPECT_THROW_WITH(cast(a, DType::Float64, stream()), NotSupported,
                      "float64 exists on the CPU only");
  } else {
    // float64 to bfloat16 on the CPU: rounded once (HalfConversion.Float64RoundsOnceNotTwice).
    const double above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
    Tensor d = Tensor::from_host<double>(std::vector<double>{above_tie}, {1}, stream());
    EXPECT_EQ(cast(d, DType::BFloat16, stream()).to_host<bfloat16>(stream())[0].bits, 0x3f81);
    EXPECT_EQ(d.to(DType::BFloat16, stream()).to_host<bfloat16>(stream())[0].bits, 0x3f81);
  }
}

}  // namespace
}  // namespace towerlab::testing
