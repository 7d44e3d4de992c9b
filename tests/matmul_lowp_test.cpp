// matmul with bfloat16 and float16 inputs (kernels/matmul.h's mixed precision):
// every path (the widening one on each float32 ISA, and vdpbf16ps where the CPU
// has AVX-512 BF16) against kernels/reference/matmul.h's matmul_mixed within the
// tolerance the header states, in all four transpose layouts, on odd and large
// shapes, with alpha and beta, float32 and 16-bit outputs; the beta == 0 and
// beta == 1 sentinels; controls that show the tolerance check can fail; and the
// typed errors, on the CPU and on a CUDA device. The same checks run the CUDA
// tensor-core GEMM (kernels/cuda/matmul_tc.cu) on cuda:0: the emulated GPUs in CI,
// a real one where present (MatmulLowpCuda, below).
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/half.h"
#include "kernels/batched_matmul.h"
#include "kernels/cpu/matmul.h"
#include "kernels/matmul.h"
#include "kernels/reference/matmul.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

struct Dims {
  std::int64_t m, n, k;
};

std::string describe(const Dims& d, bool transpose_a, bool transpose_b) {
  return std::string(transpose_a ? "T" : "N") + (transpose_b ? "T" : "N") + " " +
         std::to_string(d.m) + "x" + std::to_string(d.n) + "x" + std::to_string(d.k);
}

// The CPU paths a 16-bit product can take (engine/settings.h).
enum class Path { Portable, Avx2, Avx512, Avx512Bf16 };

const char* path_name(Path path) {
  switch (path) {
    case Path::Portable:
      return "widened, portable kernel";
    case Path::Avx2:
      return "widened, AVX2 kernel";
    case Path::Avx512:
      return "widened, AVX-512 kernel";
    case Path::Avx512Bf16:
      return "vdpbf16ps";
  }
  return "?";
}

// Puts the GEMM settings back when a test ends.
struct RestoreSettings {
  GemmIsa isa = gemm_isa();
  Bf16GemmKernel bf16 = bf16_gemm_kernel();
  ~RestoreSettings() {
    set_gemm_isa(isa);
    set_bf16_gemm_kernel(bf16);
  }
};

// Selects `path`; false (with the reason in *why) where this CPU lacks it.
bool select(Path path, std::string* why) {
  const GemmIsa isa = path == Path::Portable ? GemmIsa::Portable
                      : path == Path::Avx2   ? GemmIsa::Avx2
                                             : GemmIsa::Avx512;
  if (!gemm_isa_supported(isa)) {
    *why = std::string("this CPU lacks the ISA of the ") + path_name(path) + " path";
    return false;
  }
  if (path == Path::Avx512Bf16 && !bf16_gemm_kernel_supported(Bf16GemmKernel::Avx512Bf16)) {
    *why = "this CPU does not report avx512_bf16, so the vdpbf16ps path cannot run here";
    return false;
  }
  set_gemm_isa(isa);
  set_bf16_gemm_kernel(path == Path::Avx512Bf16 ? Bf16GemmKernel::Avx512Bf16
                                                : Bf16GemmKernel::Widen);
  return true;
}

// The unit roundoff of a c of type Out: 0 for float32 (its rounding is in E).
template <typename Out>
constexpr double output_roundoff() {
  if constexpr (std::is_same_v<Out, bfloat16>) return std::ldexp(1.0, -8);
  if constexpr (std::is_same_v<Out, float16>) return std::ldexp(1.0, -11);
  return 0.0;
}

// One product's operands (the 16-bit values as they are stored) and its expected
// result: the reference with a float32 c, and the bound of kernels/matmul.h.
template <typename In>
struct Case {
  Dims d;
  bool transpose_a, transpose_b;
  float alpha, beta;
  std::vector<In> a, b;     // as stored: op(A) [m,k], op(B) [k,n]
  std::vector<float> c0;    // c before, widened from Out where c is 16-bit
  std::vector<float> want;  // reference matmul_mixed with a float32 c
  std::vector<double> err;  // E = 2 (K + 2) 2^-24 (|alpha| S + |beta c0|)

  std::int64_t lda() const { return transpose_a ? d.m : d.k; }
  std::int64_t ldb() const { return transpose_b ? d.k : d.n; }
  Shape a_shape() const { return transpose_a ? Shape{d.k, d.m} : Shape{d.m, d.k}; }
  Shape b_shape() const { return transpose_b ? Shape{d.n, d.k} : Shape{d.k, d.n}; }

  // Fills `want` and `err` from a, b and c0.
  void expect() {
    want = c0;
    reference::matmul_mixed<In, float>(transpose_a, transpose_b, d.m, d.n, d.k, alpha, a.data(),
                                       lda(), b.data(), ldb(), beta, want.data(), d.n);
    std::vector<double> abs_a, abs_b, s(static_cast<std::size_t>(d.m * d.n));
    for (In v : a) abs_a.push_back(std::fabs(static_cast<double>(v)));
    for (In v : b) abs_b.push_back(std::fabs(static_cast<double>(v)));
    reference::matmul<double>(transpose_a, transpose_b, d.m, d.n, d.k, 1.0, abs_a.data(), lda(),
                              abs_b.data(), ldb(), 0.0, s.data(), d.n);
    const double scale = 2.0 * static_cast<double>(d.k + 2) * std::ldexp(1.0, -24);
    err.resize(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
      const double old = beta == 0.0f ? 0.0 : std::fabs(double(beta) * double(c0[i]));
      err[i] = scale * (std::fabs(double(alpha)) * s[i] + old);
    }
  }
};

template <typename In>
Case<In> make_case(const Dims& d, bool transpose_a, bool transpose_b, float alpha, float beta,
                   unsigned seed) {
  Case<In> x{d, transpose_a, transpose_b, alpha, beta, {}, {}, {}, {}, {}};
  x.a = narrow<In>(random_values(static_cast<std::size_t>(d.m * d.k), seed));
  x.b = narrow<In>(random_values(static_cast<std::size_t>(d.k * d.n), seed + 1));
  // c0 representable in In too, so that a 16-bit c holds exactly these values.
  x.c0 = widen(narrow<In>(random_values(static_cast<std::size_t>(d.m * d.n), seed + 2)));
  x.expect();
  return x;
}

// |got - want| <= E for a float32 c, E + u (|want| + E) for a 16-bit one (and the
// float16 subnormal half-spacing 2^-25), element by element.
template <typename Out, typename In>
::testing::AssertionResult within_bound(const std::vector<float>& got, const Case<In>& x) {
  const double u = output_roundoff<Out>();
  const double floor = std::is_same_v<Out, float16> ? std::ldexp(1.0, -25) : 0.0;
  int bad = 0;
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double want = x.want[i];
    const double bound = x.err[i] + u * (std::fabs(want) + x.err[i]) + floor;
    const double diff = std::fabs(double(got[i]) - want);
    if (!(diff <= bound)) {
      if (bad++ == 0) result = ::testing::AssertionFailure();
      if (bad <= 5) {
        result << "\n  c[" << i / x.d.n << "," << i % x.d.n << "] = " << got[i] << ", reference "
               << want << ", |difference| " << diff << " > bound " << bound;
      }
    }
  }
  if (bad > 5) result << "\n  ... " << bad << " outputs in all";
  return result;
}

// The product through matmul() on `s` (the CPU by default) with a c of type Out
// holding c0.
template <typename Out, typename In>
std::vector<float> run(const Case<In>& x, const Stream& s = cpu()) {
  Tensor a = Tensor::from_host<In>(x.a, x.a_shape(), s);
  Tensor b = Tensor::from_host<In>(x.b, x.b_shape(), s);
  Tensor c = Tensor::from_host<Out>(narrow<Out>(x.c0), {x.d.m, x.d.n}, s);
  matmul(c, a, b, x.transpose_a, x.transpose_b, x.alpha, x.beta, s);
  if constexpr (std::is_same_v<Out, float>) {
    return c.to_host<float>(s);
  } else {
    return widen(c.to_host<Out>(s));
  }
}

const std::vector<Dims>& odd_shapes() {
  static const std::vector<Dims> shapes = {
      {1, 1, 1},   {1, 1, 2},    {2, 3, 1},    {3, 5, 7},     {7, 13, 31},   {12, 32, 2},
      {13, 33, 3}, {11, 31, 65}, {24, 64, 64}, {25, 65, 67},  {36, 17, 70},  {70, 70, 69},
      {1, 70, 33}, {70, 1, 33},  {5, 6, 1},    {64, 64, 257}, {12, 32, 256}, {13, 31, 511},
  };
  return shapes;
}

class MatmulLowpPath : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    std::string why;
    if (!select(GetParam(), &why)) GTEST_SKIP() << why;
  }

  // The product with a float32 c and with a c of type In, each within the bound; the
  // 16-bit c is the float32 one rounded once (the same path, the same sums).
  template <typename In>
  void check(const Dims& d, bool transpose_a, bool transpose_b, float alpha, float beta,
             unsigned seed) {
    const Case<In> x = make_case<In>(d, transpose_a, transpose_b, alpha, beta, seed);
    const std::vector<float> c32 = run<float>(x);
    const std::vector<float> c16 = run<In>(x);
    EXPECT_TRUE(within_bound<float>(c32, x)) << describe(d, transpose_a, transpose_b);
    EXPECT_TRUE(within_bound<In>(c16, x)) << describe(d, transpose_a, transpose_b) << " 16-bit c";
    EXPECT_EQ(c16, widen(narrow<In>(c32)))
        << describe(d, transpose_a, transpose_b) << ": a 16-bit c is the float32 one rounded once";
  }

 private:
  RestoreSettings restore_;
};

INSTANTIATE_TEST_SUITE_P(Paths, MatmulLowpPath,
                         ::testing::Values(Path::Portable, Path::Avx2, Path::Avx512,
                                           Path::Avx512Bf16),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           switch (info.param) {
                             case Path::Portable:
                               return std::string("WidenPortable");
                             case Path::Avx2:
                               return std::string("WidenAvx2");
                             case Path::Avx512:
                               return std::string("WidenAvx512");
                             case Path::Avx512Bf16:
                               return std::string("Avx512Bf16");
                           }
                           return std::string("Unknown");
                         });

TEST_P(MatmulLowpPath, Bfloat16AllLayoutsOnOddShapes) {
  unsigned seed = 10;
  for (const Dims& d : odd_shapes()) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) check<bfloat16>(d, ta, tb, 1.0f, 0.0f, seed += 3);
    }
  }
}

// The widening paths are the float32 GEMM on the widened operands, bit for bit:
// the bfloat16 panels the vector packers widen as they load (kernels/cpu/gemm_kernels.cpp)
// and the float16 ones the generic loops widen hold the widened values, and the same
// kernel sums them in the same order. Every layout, on the odd shapes (edge panels,
// k tails past the packers' groups of eight), alpha and beta over a nonzero c. The
// control: the float32 product of the operands before their rounding differs.
TEST_P(MatmulLowpPath, WideningIsTheFloat32ProductOfTheWidenedOperands) {
  if (GetParam() == Path::Avx512Bf16) GTEST_SKIP() << "vdpbf16ps sums pairs of k in its order";
  unsigned seed = 40;
  for (const Dims& d : odd_shapes()) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const std::string where = describe(d, ta, tb);
        const auto compare = [&]<typename In>() {
          const Case<In> x = make_case<In>(d, ta, tb, 0.75f, 0.5f, seed += 3);
          // op(A) op(B) alpha + beta c0 in float32 on float operands a and b.
          const auto float32_product = [&](const std::vector<float>& a,
                                           const std::vector<float>& b) {
            Tensor c = Tensor::from_host<float>(x.c0, {d.m, d.n}, cpu());
            matmul(c, Tensor::from_host<float>(a, x.a_shape(), cpu()),
                   Tensor::from_host<float>(b, x.b_shape(), cpu()), ta, tb, x.alpha, x.beta, cpu());
            return c.to_host<float>(cpu());
          };
          const std::vector<float> got = run<float>(x);
          EXPECT_EQ(got, float32_product(widen(x.a), widen(x.b))) << where;
          if (d.k >= 16) {  // make_case's operands before their rounding
            EXPECT_NE(got, float32_product(random_values(std::size_t(d.m * d.k), seed),
                                           random_values(std::size_t(d.k * d.n), seed + 1)))
                << "the control; " << where;
          }
        };
        compare.template operator()<bfloat16>();
        compare.template operator()<float16>();
      }
    }
  }
}

TEST_P(MatmulLowpPath, Float16AllLayoutsOnOddShapes) {
  unsigned seed = 20;
  for (const Dims& d : odd_shapes()) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) check<float16>(d, ta, tb, 1.0f, 0.0f, seed += 3);
    }
  }
}

TEST_P(MatmulLowpPath, AlphaAndBeta) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check<bfloat16>({67, 45, 131}, ta, tb, -1.5f, 0.5f, 7);
      check<bfloat16>({37, 70, 513}, ta, tb, 2.0f, 1.0f, 8);  // K: blocks of 256, 256 and 1
      check<float16>({67, 45, 131}, ta, tb, -1.5f, 0.5f, 9);
      check<float16>({37, 70, 300}, ta, tb, 0.25f, 1.0f, 10);
    }
  }
}

TEST_P(MatmulLowpPath, LargeShapes) {
  check<bfloat16>({512, 384, 300}, false, false, 1.0f, 0.0f, 30);
  check<bfloat16>({300, 520, 1031}, true, false, 1.0f, 1.0f, 31);
  check<bfloat16>({260, 1000, 97}, false, true, 0.5f, 0.0f, 32);
  check<float16>({384, 512, 257}, true, true, 1.0f, 0.0f, 33);
}

// beta == 0 assigns: NaN in c does not leak, in a float32 c or a 16-bit one.
TEST_P(MatmulLowpPath, BetaZeroIgnoresNanInC) {
  const Dims d{13, 45, 33};
  const Case<bfloat16> x = make_case<bfloat16>(d, false, false, 1.0f, 0.0f, 40);
  const Stream& s = cpu();
  Tensor a = Tensor::from_host<bfloat16>(x.a, x.a_shape(), s);
  Tensor b = Tensor::from_host<bfloat16>(x.b, x.b_shape(), s);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> nans(static_cast<std::size_t>(d.m * d.n), nan);
  Tensor c32 = Tensor::from_host<float>(nans, {d.m, d.n}, s);
  Tensor c16 = Tensor::from_host<bfloat16>(narrow<bfloat16>(nans), {d.m, d.n}, s);
  matmul(c32, a, b, false, false, 1.0f, 0.0f, s);
  matmul(c16, a, b, false, false, 1.0f, 0.0f, s);
  const std::vector<float> out32 = c32.to_host<float>(s);
  const std::vector<float> out16 = widen(c16.to_host<bfloat16>(s));
  for (std::size_t i = 0; i < out32.size(); ++i) {
    ASSERT_FALSE(std::isnan(out32[i])) << "float32 c[" << i << "]";
    ASSERT_FALSE(std::isnan(out16[i])) << "bfloat16 c[" << i << "]";
  }
  EXPECT_TRUE(within_bound<float>(out32, x));
  EXPECT_TRUE(within_bound<bfloat16>(out16, x));
}

// beta == 1 accumulates: c starts at a sentinel far from the product's values, and
// the result is sentinel + product, not the product.
TEST_P(MatmulLowpPath, BetaOneAccumulates) {
  const Dims d{14, 40, 77};
  Case<bfloat16> x = make_case<bfloat16>(d, true, false, 1.0f, 1.0f, 50);
  x.c0.assign(x.c0.size(), 64.0f);
  x.expect();
  const std::vector<float> c32 = run<float>(x), c16 = run<bfloat16>(x);
  EXPECT_TRUE(within_bound<float>(c32, x));
  EXPECT_TRUE(within_bound<bfloat16>(c16, x));
  Case<bfloat16> assigned = x;
  assigned.beta = 0.0f;
  assigned.expect();
  EXPECT_FALSE(within_bound<float>(c32, assigned)) << "the sentinel was not added";
}

// The splits over threads never change a sum's order: 1 and 2 threads give the
// same bits.
TEST_P(MatmulLowpPath, SameBitsForAnyThreadCount) {
  const int saved = num_threads();
  const Case<bfloat16> x = make_case<bfloat16>({200, 300, 333}, false, true, 1.0f, 0.0f, 60);
  set_num_threads(1);
  const std::vector<float> one = run<float>(x);
  set_num_threads(2);
  const std::vector<float> two = run<float>(x);
  set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_TRUE(within_bound<float>(one, x));
}

// The check can fail: one input value one bfloat16 ulp off (2^-8 of its value)
// moves its row of C by more than the bound, as does a perturbed c0.
TEST_P(MatmulLowpPath, ControlToleranceCatchesAOneUlpChange) {
  for (bool ta : {false, true}) {
    const Dims d{20, 30, 64};
    Case<bfloat16> x = make_case<bfloat16>(d, ta, false, 1.0f, 0.0f, 70);
    x.a[5].bits = static_cast<std::uint16_t>(x.a[5].bits + 1);  // one ulp further from zero
    const std::vector<float> got = run<float>(x);
    x.a[5].bits = static_cast<std::uint16_t>(x.a[5].bits - 1);  // the expectation's input
    x.expect();
    EXPECT_FALSE(within_bound<float>(got, x)) << "a one-ulp change in A went unnoticed";
  }
  Case<float16> y = make_case<float16>({9, 17, 40}, false, true, 1.0f, 1.0f, 71);
  y.c0[3] += 0.01f;
  const std::vector<float> got = run<float>(y);
  y.c0[3] -= 0.01f;
  y.expect();
  EXPECT_FALSE(within_bound<float>(got, y)) << "a changed c0 went unnoticed";
}

// The paths agree within the bound, not bit for bit: the vdpbf16ps path adds each
// pair of k in the other order. Where it runs, it differs from the widening path
// somewhere on a product large enough (a check that it really ran).
TEST(MatmulLowp, Avx512Bf16IsNotTheWideningPath) {
  RestoreSettings restore;
  std::string why;
  if (!select(Path::Avx512Bf16, &why)) GTEST_SKIP() << why;
  const Case<bfloat16> x = make_case<bfloat16>({64, 64, 255}, false, false, 1.0f, 0.0f, 80);
  const std::vector<float> dot = run<float>(x);
  ASSERT_TRUE(select(Path::Avx512, &why));
  const std::vector<float> widened = run<float>(x);
  EXPECT_TRUE(within_bound<float>(dot, x));
  EXPECT_TRUE(within_bound<float>(widened, x));
  EXPECT_NE(dot, widened);
}

// Auto runs vdpbf16ps where it pays (engine/settings.h: an AMD CPU with avx512_bf16,
// the float32 GEMM on AVX-512) and widens everywhere else; it gives exactly the bits
// of the path bf16_gemm_runs_vdpbf16ps() names, and vdpbf16ps runs on request.
TEST(MatmulLowp, AutoRunsVdpbf16psWhereItPaysAndWidensElsewhere) {
  RestoreSettings restore;
  const Case<bfloat16> x = make_case<bfloat16>({40, 48, 129}, false, false, 1.0f, 0.0f, 90);
  std::string why;
  for (Path path : {Path::Portable, Path::Avx2}) {
    if (!select(path, &why)) continue;
    const std::vector<float> widened = run<float>(x);
    set_bf16_gemm_kernel(Bf16GemmKernel::Auto);
    EXPECT_FALSE(bf16_gemm_runs_vdpbf16ps()) << path_name(path);
    EXPECT_EQ(run<float>(x), widened) << path_name(path);
  }
  if (!bf16_gemm_kernel_supported(Bf16GemmKernel::Avx512Bf16)) {
    EXPECT_THROW(set_bf16_gemm_kernel(Bf16GemmKernel::Avx512Bf16), NotSupported);
    if (select(Path::Avx512, &why)) {
      const std::vector<float> widened = run<float>(x);
      set_bf16_gemm_kernel(Bf16GemmKernel::Auto);
      EXPECT_FALSE(bf16_gemm_runs_vdpbf16ps());
      EXPECT_EQ(run<float>(x), widened) << "Auto on AVX-512 without avx512_bf16";
    }
    GTEST_SKIP() << "this CPU does not report avx512_bf16: only the widening and the refusal "
                    "are checked";
  }
  ASSERT_TRUE(select(Path::Avx512, &why));
  const std::vector<float> widened = run<float>(x);
  ASSERT_TRUE(select(Path::Avx512Bf16, &why));
  const std::vector<float> dot = run<float>(x);
  EXPECT_NE(dot, widened) << "Avx512Bf16 did not run vdpbf16ps";
  set_bf16_gemm_kernel(Bf16GemmKernel::Auto);
  // CPUID's vendor, read here from /proc/cpuinfo rather than the library's check.
  std::ifstream cpuinfo("/proc/cpuinfo");
  const std::string text{std::istreambuf_iterator<char>(cpuinfo), {}};
  const bool amd = text.find("AuthenticAMD") != std::string::npos;
  EXPECT_EQ(bf16_gemm_runs_vdpbf16ps(), amd) << "vendor AMD: " << amd;
  EXPECT_EQ(run<float>(x), bf16_gemm_runs_vdpbf16ps() ? dot : widened);
  set_gemm_isa(GemmIsa::Avx2);  // Auto follows a GEMM held to AVX2
  EXPECT_FALSE(bf16_gemm_runs_vdpbf16ps());
}

// ---------------------------------------------------------------------------
// CUDA: the tensor-core GEMM (kernels/cuda/matmul_tc.cu), held to the same bound.
// On the emulated GPUs (132 SMs unless TOWERLAB_EMULATED_SMS says fewer) the shapes
// below take these paths: 128x128 tiles with M, N at and past a tile's edge; K
// from 1 (one zero-filled step) to 511 (16 steps through the 3-stage ring in one
// block) and 1000 (split in 3 along K, each split 11 steps, then split_reduce);
// operands whose rows are not a multiple of 8 values (K = 9 in A [M,K], N = 33 in
// B [K,N]) or that start off a 16-byte boundary (a view at an odd offset), which
// the launcher pads into scratch first.

class MatmulLowpCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    skip_without_cuda_device();
    if (IsSkipped() || HasFatalFailure()) return;
    stream_ = std::make_unique<Stream>(Device::cuda(0));
  }
  const Stream& stream() const { return *stream_; }

  // As MatmulLowpPath::check, on cuda:0.
  template <typename In>
  void check(const Dims& d, bool transpose_a, bool transpose_b, float alpha, float beta,
             unsigned seed) {
    const Case<In> x = make_case<In>(d, transpose_a, transpose_b, alpha, beta, seed);
    const std::vector<float> c32 = run<float>(x, stream());
    const std::vector<float> c16 = run<In>(x, stream());
    EXPECT_TRUE(within_bound<float>(c32, x)) << describe(d, transpose_a, transpose_b);
    EXPECT_TRUE(within_bound<In>(c16, x)) << describe(d, transpose_a, transpose_b) << " 16-bit c";
    EXPECT_EQ(c16, widen(narrow<In>(c32)))
        << describe(d, transpose_a, transpose_b) << ": a 16-bit c is the float32 one rounded once";
  }

  // Every layout, both input dtypes.
  void check_all(const Dims& d, float alpha, float beta, unsigned seed) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        check<bfloat16>(d, ta, tb, alpha, beta, seed += 3);
        check<float16>(d, ta, tb, alpha, beta, seed += 3);
      }
    }
  }

 private:
  std::unique_ptr<Stream> stream_;
};

TEST_F(MatmulLowpCuda, OddShapesEveryLayoutBothDtypes) {
  unsigned seed = 100;
  for (const Dims& d : std::vector<Dims>{
           {1, 1, 1}, {17, 33, 9}, {3, 5, 40}, {24, 64, 64}, {130, 70, 257}, {129, 136, 33}}) {
    check_all(d, 1.0f, 0.0f, seed += 50);
  }
}

TEST_F(MatmulLowpCuda, AlphaAndBetaOverANonzeroC) {
  check_all({67, 45, 131}, -1.5f, 0.5f, 200);
  check_all({40, 136, 24}, 0.25f, 1.0f, 300);
}

TEST_F(MatmulLowpCuda, ManyStepsAndSplitK) {
  check<bfloat16>({40, 48, 511}, false, false, 1.0f, 0.0f, 400);  // 16 steps, one block
  check<float16>({33, 130, 511}, true, true, 1.0f, 1.0f, 401);
  check<bfloat16>({20, 24, 1000}, true, false, 2.0f, 0.5f, 402);  // 3 splits of 11 steps
  check<float16>({20, 24, 1000}, false, true, 1.0f, 0.0f, 403);
}

// An operand that starts off a 16-byte boundary (a view 1 value into its storage)
// gives the bits of the same operand aligned: the padded copy changes no sum.
TEST_F(MatmulLowpCuda, MisalignedOperandGivesTheAlignedBits) {
  const Case<bfloat16> x = make_case<bfloat16>({24, 40, 48}, false, false, 1.0f, 0.0f, 500);
  std::vector<bfloat16> shifted = {bfloat16(0.0f)};
  shifted.insert(shifted.end(), x.a.begin(), x.a.end());
  const Tensor storage =
      Tensor::from_host<bfloat16>(shifted, {static_cast<std::int64_t>(shifted.size())}, stream());
  const Tensor a = storage.view(1, x.a_shape());
  const Tensor b = Tensor::from_host<bfloat16>(x.b, x.b_shape(), stream());
  Tensor c = Tensor::empty({x.d.m, x.d.n}, stream());
  matmul(c, a, b, false, false, 1.0f, 0.0f, stream());
  const std::vector<float> got = c.to_host<float>(stream());
  EXPECT_TRUE(within_bound<float>(got, x));
  EXPECT_EQ(got, run<float>(x, stream()));
}

TEST_F(MatmulLowpCuda, BetaZeroIgnoresNanAndBetaOneAccumulates) {
  const Dims d{13, 45, 33};
  const Case<bfloat16> x = make_case<bfloat16>(d, false, true, 1.0f, 0.0f, 600);
  Tensor a = Tensor::from_host<bfloat16>(x.a, x.a_shape(), stream());
  Tensor b = Tensor::from_host<bfloat16>(x.b, x.b_shape(), stream());
  const std::vector<float> nans(static_cast<std::size_t>(d.m * d.n),
                                std::numeric_limits<float>::quiet_NaN());
  Tensor c32 = Tensor::from_host<float>(nans, {d.m, d.n}, stream());
  Tensor c16 = Tensor::from_host<bfloat16>(narrow<bfloat16>(nans), {d.m, d.n}, stream());
  matmul(c32, a, b, false, true, 1.0f, 0.0f, stream());
  matmul(c16, a, b, false, true, 1.0f, 0.0f, stream());
  EXPECT_TRUE(within_bound<float>(c32.to_host<float>(stream()), x));
  EXPECT_TRUE(within_bound<bfloat16>(widen(c16.to_host<bfloat16>(stream())), x));

  Case<bfloat16> sum = make_case<bfloat16>(d, true, false, 1.0f, 1.0f, 601);
  sum.c0.assign(sum.c0.size(), 64.0f);
  sum.expect();
  const std::vector<float> got = run<float>(sum, stream());
  EXPECT_TRUE(within_bound<float>(got, sum));
  Case<bfloat16> assigned = sum;
  assigned.beta = 0.0f;
  assigned.expect();
  EXPECT_FALSE(within_bound<float>(got, assigned)) << "the sentinel was not added";
}

// The check can fail on this path too: one value of A one ulp off moves its row of
// C past the bound, and so does reading A and B unrounded (the reference on the
// float32 values the 16-bit ones were rounded from).
TEST_F(MatmulLowpCuda, ControlToleranceCatchesAWrongResult) {
  for (bool ta : {false, true}) {
    Case<bfloat16> x = make_case<bfloat16>({20, 30, 64}, ta, true, 1.0f, 0.0f, 700);
    x.a[5].bits = static_cast<std::uint16_t>(x.a[5].bits + 1);
    const std::vector<float> got = run<float>(x, stream());
    x.a[5].bits = static_cast<std::uint16_t>(x.a[5].bits - 1);
    x.expect();
    EXPECT_FALSE(within_bound<float>(got, x)) << "a one-ulp change in A went unnoticed";
  }
  const Dims d{20, 30, 64};
  const Case<float16> x = make_case<float16>(d, false, false, 1.0f, 0.0f, 701);
  const std::vector<float> got = run<float>(x, stream());
  Case<float16> unrounded = x;
  const std::vector<float> a32 = random_values(static_cast<std::size_t>(d.m * d.k), 701);
  const std::vector<float> b32 = random_values(static_cast<std::size_t>(d.k * d.n), 702);
  reference::matmul<float>(false, false, d.m, d.n, d.k, 1.0f, a32.data(), d.k, b32.data(), d.n,
                           0.0f, unrounded.want.data(), d.n);
  EXPECT_TRUE(within_bound<float>(got, x));
  EXPECT_FALSE(within_bound<float>(got, unrounded)) << "unrounded inputs went unnoticed";
}

// batched_matmul takes the same kernel entry by entry; entries of 5x7 and 7x9
// values start off 16-byte boundaries, so this also runs the padded copies.
TEST_F(MatmulLowpCuda, BatchedMatmulEntries) {
  const Dims d{5, 9, 7};
  const std::int64_t batch = 3;
  std::vector<Case<bfloat16>> entries;
  std::vector<bfloat16> a, b;
  for (std::int64_t i = 0; i < batch; ++i) {
    entries.push_back(make_case<bfloat16>(d, false, false, 1.0f, 0.0f, 800 + 10 * i));
    a.insert(a.end(), entries.back().a.begin(), entries.back().a.end());
    b.insert(b.end(), entries.back().b.begin(), entries.back().b.end());
  }
  Tensor ta = Tensor::from_host<bfloat16>(a, {batch, d.m, d.k}, stream());
  Tensor tb = Tensor::from_host<bfloat16>(b, {batch, d.k, d.n}, stream());
  Tensor c = Tensor::empty({batch, d.m, d.n}, stream(), DType::BFloat16);
  batched_matmul(c, ta, tb, false, false, 1.0f, 0.0f, stream());
  const std::vector<float> got = widen(c.to_host<bfloat16>(stream()));
  const std::size_t per = static_cast<std::size_t>(d.m * d.n);
  for (std::int64_t i = 0; i < batch; ++i) {
    const std::vector<float> entry(got.begin() + i * per, got.begin() + (i + 1) * per);
    EXPECT_TRUE(within_bound<bfloat16>(entry, entries[static_cast<std::size_t>(i)])) << i;
  }
}

// ---------------------------------------------------------------------------
// Errors.

Tensor cpu_tensor(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, cpu(), dtype);
  return t;
}

// The call throws NotSupported whose message has every one of `parts`.
template <typename Fn>
void expect_not_supported(const Fn& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const NotSupported& e) {
    const std::string message = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    }
  }
}

TEST(MatmulLowpErrors, RefusesOtherDtypeCombinations) {
  struct Combination {
    DType a, b, c;
  };
  const std::vector<Combination> refused = {
      {DType::BFloat16, DType::Float16, DType::Float32},
      {DType::BFloat16, DType::Float32, DType::Float32},
      {DType::Float32, DType::BFloat16, DType::Float32},
      {DType::BFloat16, DType::BFloat16, DType::Float64},
      {DType::BFloat16, DType::BFloat16, DType::Float16},
      {DType::Float16, DType::Float16, DType::BFloat16},
      {DType::Float32, DType::Float32, DType::BFloat16},
      {DType::Float64, DType::Float64, DType::Float16},
  };
  for (const Combination& x : refused) {
    Tensor a = cpu_tensor({3, 4}, x.a), b = cpu_tensor({4, 5}, x.b), c = cpu_tensor({3, 5}, x.c);
    expect_not_supported([&] { matmul(c, a, b, false, false, 1.0f, 0.0f, cpu()); },
                         {"matmul", dtype_name(x.a), dtype_name(x.b), dtype_name(x.c)});
  }
  // The shape checks still apply to the accepted combinations.
  Tensor a = cpu_tensor({3, 4}, DType::BFloat16), b = cpu_tensor({5, 5}, DType::BFloat16);
  Tensor c = cpu_tensor({3, 5}, DType::Float32);
  EXPECT_THROW(matmul(c, a, b, false, false, 1.0f, 0.0f, cpu()), ShapeError);
}

// CUDA refuses the combinations the CPU refuses, naming the three dtypes (run on
// the emulated GPUs in CI and on a real one where present).
TEST(MatmulLowpErrors, RefusesOtherDtypeCombinationsOnCuda) {
  skip_without_cuda_device();
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  Stream stream(Device::cuda(0));
  Tensor a = Tensor::empty({3, 4}, stream, DType::BFloat16);
  Tensor b = Tensor::empty({4, 5}, stream, DType::BFloat16);
  Tensor c = Tensor::empty({3, 5}, stream, DType::Float16);
  expect_not_supported([&] { matmul(c, a, b, false, false, 1.0f, 0.0f, stream); },
                       {"matmul", "bfloat16", "float16"});
}

}  // namespace
}  // namespace towerlab::testing
