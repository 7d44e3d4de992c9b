// matmul with Float32Math::Tf32 (kernels/matmul.h): the reference's rounding to
// TF32 (reference::round_tf32) on chosen values; on the CPU, Ieee's bits; on
// cuda:0 (the emulated GPUs in CI, a real one where present), the TF32 tensor-core
// GEMM (kernels/cuda/matmul_tc.cu) against reference::matmul_tf32 within the
// header's bound E in all four layouts, on odd shapes, through split-K, over NaN
// with beta 0 and onto a sentinel with beta 1, from a misaligned operand, entry by
// entry in batched_matmul, and through a tape (forward and both gradients); with
// controls that show the check can fail: the reference on the unrounded values is
// further off than E, and so is one TF32 ulp in one value of A.
//
// On the emulated GPUs (132 SMs unless TOWERLAB_EMULATED_SMS says fewer) the shapes
// take these paths: 128x128 tiles with M, N at and past a tile's edge; K from 1 (one
// zero-filled step of 16) to 300 (19 steps through the 3-stage ring) and 1000 (split
// in 3 along K, then split_reduce); operands whose rows are not a multiple of 4
// floats (K = 9 in A [M,K]) or that start off a 16-byte boundary, which the launcher
// pads into scratch first. The sizes are small: every CUDA case also runs twice more
// under the sanitizers in CI, on the emulator.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/batched_matmul.h"
#include "kernels/matmul.h"
#include "kernels/reference/matmul.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// --- the reference's rounding --------------------------------------------------

float bits_to_float(std::uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

TEST(Tf32Reference, RoundsToNearestWithTiesAwayFromZero) {
  const float ulp_at_one = std::ldexp(1.0f, -10);
  struct Expect {
    float x, rounded;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Expect> cases = {
      {1.0f, 1.0f},
      {1.0f + ulp_at_one / 2, 1.0f + ulp_at_one},                // a tie: away from zero
      {-(1.0f + ulp_at_one / 2), -(1.0f + ulp_at_one)},          // and so for negatives
      {1.0f + 3 * ulp_at_one / 2, 1.0f + 2 * ulp_at_one},        // a tie, not to even
      {1.0f + ulp_at_one / 2 - std::ldexp(1.0f, -23), 1.0f},     // just below the tie
      {std::nextafter(2.0f, 0.0f), 2.0f},                        // a carry into the exponent
      {bits_to_float(0x7f7fe000u), bits_to_float(0x7f7fe000u)},  // the largest TF32
      {std::numeric_limits<float>::max(), inf},                  // past it: an infinity
      {-std::numeric_limits<float>::max(), -inf},
      {inf, inf},
      {std::ldexp(1.0f, -137), std::ldexp(1.0f, -136)},  // subnormal tie: steps of 2^-136
      {std::ldexp(1.0f, -149), 0.0f},                    // the smallest subnormal
      {-0.0f, -0.0f},
  };
  for (const Expect& e : cases) {
    const float got = reference::round_tf32(e.x);
    EXPECT_EQ(bits({got}), bits({e.rounded})) << e.x << " gave " << got;
  }
  EXPECT_TRUE(std::isnan(reference::round_tf32(std::numeric_limits<float>::quiet_NaN())));
  // Any value: 10 mantissa bits (the low 13 zero), within half a TF32 ulp.
  for (float x : random_values(1000, 1, -3.0f, 3.0f)) {
    const float r = reference::round_tf32(x);
    EXPECT_EQ(bits({r})[0] & 0x1fffu, 0u) << x;
    int exponent = 0;
    std::frexp(x, &exponent);
    EXPECT_LE(std::fabs(double(r) - double(x)), std::ldexp(1.0, exponent - 12)) << x;
  }
}

// --- products --------------------------------------------------------------------

struct Dims {
  std::int64_t m, n, k;
};

std::string describe(const Dims& d, bool transpose_a, bool transpose_b) {
  return std::string(transpose_a ? "T" : "N") + (transpose_b ? "T" : "N") + " " +
         std::to_string(d.m) + "x" + std::to_string(d.n) + "x" + std::to_string(d.k);
}

// What the expectation is made of: the operands rounded to TF32 (the contract of
// Float32Math::Tf32), or the float32 values themselves (a control).
enum class Operands { Tf32, Unrounded };

// One product's float32 operands (as stored) and its expected result: the reference
// in double and the bound E = 2 (K + 2) 2^-24 (|alpha| S + |beta c0|) of
// kernels/matmul.h around it.
struct Case {
  Dims d;
  bool transpose_a, transpose_b;
  float alpha, beta;
  std::vector<float> a, b, c0;  // A and B as stored; c before
  std::vector<float> want;
  std::vector<double> err;

  std::int64_t lda() const { return transpose_a ? d.m : d.k; }
  std::int64_t ldb() const { return transpose_b ? d.k : d.n; }
  Shape a_shape() const { return transpose_a ? Shape{d.k, d.m} : Shape{d.m, d.k}; }
  Shape b_shape() const { return transpose_b ? Shape{d.n, d.k} : Shape{d.k, d.n}; }

  // Fills `want` and `err` from a, b and c0.
  void expect(Operands operands = Operands::Tf32) {
    std::vector<double> a64, b64;  // the values the expectation multiplies
    for (float v : a) a64.push_back(operands == Operands::Tf32 ? reference::round_tf32(v) : v);
    for (float v : b) b64.push_back(operands == Operands::Tf32 ? reference::round_tf32(v) : v);
    want = c0;
    if (operands == Operands::Tf32) {
      reference::matmul_tf32(transpose_a, transpose_b, d.m, d.n, d.k, alpha, a.data(), lda(),
                             b.data(), ldb(), beta, want.data(), d.n);
    } else {
      std::vector<double> c64(c0.begin(), c0.end());
      reference::matmul<double>(transpose_a, transpose_b, d.m, d.n, d.k, alpha, a64.data(), lda(),
                                b64.data(), ldb(), beta, c64.data(), d.n);
      for (std::size_t i = 0; i < c64.size(); ++i) want[i] = static_cast<float>(c64[i]);
    }
    for (double& v : a64) v = std::fabs(v);
    for (double& v : b64) v = std::fabs(v);
    std::vector<double> s(static_cast<std::size_t>(d.m * d.n));
    reference::matmul<double>(transpose_a, transpose_b, d.m, d.n, d.k, 1.0, a64.data(), lda(),
                              b64.data(), ldb(), 0.0, s.data(), d.n);
    const double scale = 2.0 * static_cast<double>(d.k + 2) * std::ldexp(1.0, -24);
    err.resize(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
      const double old = beta == 0.0f ? 0.0 : std::fabs(double(beta) * double(c0[i]));
      err[i] = scale * (std::fabs(double(alpha)) * s[i] + old);
    }
  }
};

Case make_case(const Dims& d, bool transpose_a, bool transpose_b, float alpha, float beta,
               unsigned seed) {
  Case x{d, transpose_a, transpose_b, alpha, beta, {}, {}, {}, {}, {}};
  x.a = random_values(static_cast<std::size_t>(d.m * d.k), seed);
  x.b = random_values(static_cast<std::size_t>(d.k * d.n), seed + 1);
  x.c0 = random_values(static_cast<std::size_t>(d.m * d.n), seed + 2);
  x.expect();
  return x;
}

// |got - want| <= E, element by element.
::testing::AssertionResult within_bound(const std::vector<float>& got, const Case& x) {
  int bad = 0;
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - double(x.want[i]));
    if (!(diff <= x.err[i])) {
      if (bad++ == 0) result = ::testing::AssertionFailure();
      if (bad <= 5) {
        result << "\n  c[" << i / x.d.n << "," << i % x.d.n << "] = " << got[i] << ", reference "
               << x.want[i] << ", |difference| " << diff << " > bound " << x.err[i];
      }
    }
  }
  if (bad > 5) result << "\n  ... " << bad << " outputs in all";
  return result;
}

// The product through matmul() on `s`, c holding c0 before.
std::vector<float> run(const Case& x, const Stream& s, Float32Math math = Float32Math::Tf32) {
  Tensor a = Tensor::from_host<float>(x.a, x.a_shape(), s);
  Tensor b = Tensor::from_host<float>(x.b, x.b_shape(), s);
  Tensor c = Tensor::from_host<float>(x.c0, {x.d.m, x.d.n}, s);
  matmul(c, a, b, x.transpose_a, x.transpose_b, x.alpha, x.beta, s, math);
  return c.to_host<float>(s);
}

// The CPU has no TF32 arithmetic: Tf32 there gives Ieee's bits.
TEST(MatmulTf32, OnTheCpuIsFloat32) {
  for (bool ta : {false, true}) {
    const Case x = make_case({23, 17, 40}, ta, !ta, 1.0f, 0.5f, 3);
    EXPECT_EQ(bits(run(x, cpu(), Float32Math::Tf32)), bits(run(x, cpu(), Float32Math::Ieee)));
  }
}

class MatmulTf32Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    skip_without_cuda_device();
    if (IsSkipped() || HasFatalFailure()) return;
    stream_ = std::make_unique<Stream>(Device::cuda(0));
  }
  const Stream& stream() const { return *stream_; }

  void check(const Dims& d, bool transpose_a, bool transpose_b, float alpha, float beta,
             unsigned seed) {
    const Case x = make_case(d, transpose_a, transpose_b, alpha, beta, seed);
    EXPECT_TRUE(within_bound(run(x, stream()), x)) << describe(d, transpose_a, transpose_b);
  }
  void check_all_layouts(const Dims& d, float alpha, float beta, unsigned seed) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) check(d, ta, tb, alpha, beta, seed += 3);
    }
  }

 private:
  std::unique_ptr<Stream> stream_;
};

TEST_F(MatmulTf32Cuda, OddShapesEveryLayout) {
  unsigned seed = 100;
  for (const Dims& d : std::vector<Dims>{
           {1, 1, 1}, {17, 33, 9}, {3, 5, 40}, {24, 64, 64}, {130, 70, 33}, {129, 136, 17}}) {
    check_all_layouts(d, 1.0f, 0.0f, seed += 20);
  }
}

TEST_F(MatmulTf32Cuda, AlphaAndBetaManyStepsAndSplitK) {
  check_all_layouts({67, 45, 131}, -1.5f, 0.5f, 200);
  check({40, 48, 300}, false, true, 1.0f, 1.0f, 210);    // 19 steps through the ring
  check({20, 24, 1000}, false, false, 2.0f, 0.5f, 220);  // 3 splits along K
  check({20, 24, 1000}, true, true, 1.0f, 0.0f, 230);
}

// beta == 0 assigns: NaN in c does not leak, with and without a split of K; beta
// == 1 adds onto a sentinel far from the product's values.
TEST_F(MatmulTf32Cuda, BetaZeroIgnoresNanAndBetaOneAccumulates) {
  for (const Dims& d : {Dims{13, 45, 33}, Dims{13, 45, 600}}) {  // the second split in 2
    Case x = make_case(d, false, true, 1.0f, 0.0f, 600);
    x.c0.assign(x.c0.size(), std::numeric_limits<float>::quiet_NaN());
    EXPECT_TRUE(within_bound(run(x, stream()), x)) << describe(d, false, true);
  }
  Case sum = make_case({14, 40, 77}, true, false, 1.0f, 1.0f, 601);
  sum.c0.assign(sum.c0.size(), 64.0f);
  sum.expect();
  const std::vector<float> got = run(sum, stream());
  EXPECT_TRUE(within_bound(got, sum));
  Case assigned = sum;
  assigned.beta = 0.0f;
  assigned.expect();
  EXPECT_FALSE(within_bound(got, assigned)) << "the sentinel was not added";
}

// An operand that starts off a 16-byte boundary (a view one float into its storage)
// gives the bits of the same operand aligned: the padded copy changes no sum.
TEST_F(MatmulTf32Cuda, MisalignedOperandGivesTheAlignedBits) {
  const Case x = make_case({24, 40, 48}, false, false, 1.0f, 0.0f, 500);
  std::vector<float> shifted = {0.0f};
  shifted.insert(shifted.end(), x.a.begin(), x.a.end());
  const Tensor storage =
      Tensor::from_host<float>(shifted, {static_cast<std::int64_t>(shifted.size())}, stream());
  const Tensor a = storage.view(1, x.a_shape());
  const Tensor b = Tensor::from_host<float>(x.b, x.b_shape(), stream());
  Tensor c = Tensor::empty({x.d.m, x.d.n}, stream());
  matmul(c, a, b, false, false, 1.0f, 0.0f, stream(), Float32Math::Tf32);
  const std::vector<float> got = c.to_host<float>(stream());
  EXPECT_TRUE(within_bound(got, x));
  EXPECT_EQ(bits(got), bits(run(x, stream())));
}

// The check can fail: against the unrounded values (what Ieee multiplies, and
// what Ieee on cuda:0 stays within E of) the TF32 product is further off than E,
// in every layout; and one TF32 ulp more in one value of A moves its row of C past
// the bound.
TEST_F(MatmulTf32Cuda, ControlToleranceCatchesAWrongResult) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Case x = make_case({20, 30, 64}, ta, tb, 1.0f, 0.0f, 700);
      Case unrounded = x;
      unrounded.expect(Operands::Unrounded);
      const std::vector<float> tf32 = run(x, stream());
      EXPECT_TRUE(within_bound(tf32, x)) << describe(x.d, ta, tb);
      EXPECT_FALSE(within_bound(tf32, unrounded))
          << describe(x.d, ta, tb) << ": unrounded operands went unnoticed";
      EXPECT_TRUE(within_bound(run(x, stream(), Float32Math::Ieee), unrounded))
          << describe(x.d, ta, tb) << ": Ieee on CUDA is float32";
    }
  }
  for (bool ta : {false, true}) {
    Case x = make_case({20, 30, 16}, ta, false, 1.0f, 0.0f, 710);
    x.a[5] = 0.75f;  // a TF32 value, whose ulp is 2^-11
    x.expect();
    Case changed = x;
    changed.a[5] = 0.75f + std::ldexp(1.0f, -11);  // the next TF32 value
    EXPECT_FALSE(within_bound(run(changed, stream()), x)) << "a one-ulp change in A went unnoticed";
  }
}

// batched_matmul passes Float32Math to every entry's matmul: each entry within E of
// the TF32 reference, and not Ieee's bits.
TEST_F(MatmulTf32Cuda, BatchedMatmulEntries) {
  const Dims d{5, 9, 7};
  const std::int64_t batch = 3;
  std::vector<Case> entries;
  std::vector<float> a, b;
  for (std::int64_t i = 0; i < batch; ++i) {
    entries.push_back(make_case(d, false, true, 1.0f, 0.0f, 800 + 10 * static_cast<unsigned>(i)));
    a.insert(a.end(), entries.back().a.begin(), entries.back().a.end());
    b.insert(b.end(), entries.back().b.begin(), entries.back().b.end());
  }
  const Tensor ta = Tensor::from_host<float>(a, {batch, d.m, d.k}, stream());
  const Tensor tb = Tensor::from_host<float>(b, {batch, d.n, d.k}, stream());
  const auto product = [&](Float32Math math) {
    Tensor c = Tensor::empty({batch, d.m, d.n}, stream());
    batched_matmul(c, ta, tb, false, true, 1.0f, 0.0f, stream(), math);
    return c.to_host<float>(stream());
  };
  const std::vector<float> got = product(Float32Math::Tf32);
  const std::size_t per = static_cast<std::size_t>(d.m * d.n);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::vector<float> entry(got.begin() + i * per, got.begin() + (i + 1) * per);
    EXPECT_TRUE(within_bound(entry, entries[i])) << "entry " << i;
  }
  EXPECT_NE(bits(got), bits(product(Float32Math::Ieee)));
}

// A tape's Float32Math reaches ag::matmul's three GEMMs: y = x w^T (linear's
// product) and, from an output gradient, grad_x = gy w and grad_w = gy^T x, each
// within E of the TF32 reference; the same tape under Ieee gives other bits.
TEST_F(MatmulTf32Cuda, ATf32TapeRunsMatmulsForwardAndBackwardOnTf32) {
  const std::int64_t m = 9, n = 6, k = 21;
  const std::vector<float> xv = random_values(std::size_t(m * k), 900);
  const std::vector<float> wv = random_values(std::size_t(n * k), 901);
  const std::vector<float> gv = random_values(std::size_t(m * n), 902);
  struct Result {
    std::vector<float> y, grad_x, grad_w;
  };
  const auto pass = [&](Float32Math math) {
    Tape tape(stream());
    tape.set_float32_math(math);
    const auto make = [&](const std::vector<float>& v, const Shape& s) {
      return Tensor::from_host<float>(v, s, stream());
    };
    const Var x = tape.variable(make(xv, {m, k}), make(std::vector<float>(xv.size()), {m, k}), "x");
    const Var w = tape.variable(make(wv, {n, k}), make(std::vector<float>(wv.size()), {n, k}), "w");
    const Var y = ag::matmul(x, w, false, true);
    tape.backward(y, make(gv, {m, n}));
    return Result{y.value().to_host<float>(stream()), x.grad().to_host<float>(stream()),
                  w.grad().to_host<float>(stream())};
  };
  const Result tf32 = pass(Float32Math::Tf32);
  // The expectations: the same three products through the reference.
  const auto expected = [](Dims d, bool ta, bool tb, std::vector<float> a, std::vector<float> b) {
    Case x{d, ta, tb, 1.0f, 0.0f, std::move(a), std::move(b), {}, {}, {}};
    x.c0.assign(std::size_t(d.m * d.n), 0.0f);
    x.expect();
    return x;
  };
  EXPECT_TRUE(within_bound(tf32.y, expected({m, n, k}, false, true, xv, wv))) << "y";
  EXPECT_TRUE(within_bound(tf32.grad_x, expected({m, k, n}, false, false, gv, wv))) << "grad_x";
  EXPECT_TRUE(within_bound(tf32.grad_w, expected({n, k, m}, true, false, gv, xv))) << "grad_w";
  const Result ieee = pass(Float32Math::Ieee);
  EXPECT_NE(bits(tf32.y), bits(ieee.y));
  EXPECT_NE(bits(tf32.grad_x), bits(ieee.grad_x));
  EXPECT_NE(bits(tf32.grad_w), bits(ieee.grad_w));
}

}  // namespace
}  // namespace towerlab::testing
