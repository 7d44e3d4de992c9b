// matmul on every backend: a hand-computed case, all four transpose layouts
// against a double-precision triple loop on odd and large shapes, alpha/beta
// semantics, empty products, shape errors, the raw gemm entry points with padded
// leading dimensions, and the gradients in float64. The CPU GEMM's own paths (its
// bits across threads, edge tiles, packed operands and micro-kernels) are
// matmul_cpu_test.cpp's.
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "gradcheck.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/matmul.h"
#include "kernels/matmul.h"
#include "matmul_case.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

const std::vector<Dims>& odd_shapes() {
  static const std::vector<Dims> shapes = {
      {1, 1, 1},      {7, 7, 7},     {13, 13, 13}, {31, 31, 31},  {67, 67, 67},
      {7, 13, 31},    {67, 31, 13},  {13, 67, 7},  {1, 1, 300},   {1, 97, 33},
      {97, 1, 33},    {5, 6, 1},     {1000, 3, 5}, {3, 1000, 17}, {2, 700, 300},
      {257, 129, 65}, {16, 16, 256}, {3, 4200, 5}, {6, 16, 512},  {512, 384, 256},
  };
  return shapes;
}

class MatmulTest : public BackendTest {
 protected:
  // Runs one product and compares with the reference.
  void check(const Dims& d, bool transpose_a, bool transpose_b, float alpha, float beta,
             unsigned seed) {
    const auto av = random_values(static_cast<std::size_t>(d.m * d.k), seed);
    const auto bv = random_values(static_cast<std::size_t>(d.k * d.n), seed + 1);
    const auto cv = random_values(static_cast<std::size_t>(d.m * d.n), seed + 2);
    Tensor a = make(av, a_shape(d, transpose_a));
    Tensor b = make(bv, b_shape(d, transpose_b));
    Tensor c = make(cv, {d.m, d.n});
    matmul(c, a, b, transpose_a, transpose_b, alpha, beta, stream());
    EXPECT_TRUE(
        close_for_k(host(c), reference(av, bv, cv, d, transpose_a, transpose_b, alpha, beta), d.k))
        << layout(transpose_a, transpose_b) << " " << d.m << "x" << d.n << "x" << d.k << " alpha "
        << alpha << " beta " << beta;
  }
};
TL_INSTANTIATE_BACKENDS(MatmulTest);

TEST_P(MatmulTest, HandComputed2x3x4) {
  Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = make({1, 0, -1, 2, 0, 1, 2, -1, 3, -2, 1, 0}, {3, 4});
  Tensor c = Tensor::empty({2, 4}, stream());
  matmul(c, a, b, false, false, 1.0f, 0.0f, stream());
  EXPECT_EQ(host(c), (std::vector<float>{10, -4, 6, 0, 22, -7, 12, 3}));

  // The same product from transposed storage: A^T stored [3,2], B^T stored [4,3].
  Tensor at = make({1, 4, 2, 5, 3, 6}, {3, 2});
  Tensor bt = make({1, 0, 3, 0, 1, -2, -1, 2, 1, 2, -1, 0}, {4, 3});
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor out = Tensor::empty({2, 4}, stream());
      matmul(out, ta ? at : a, tb ? bt : b, ta, tb, 1.0f, 0.0f, stream());
      EXPECT_EQ(host(out), (std::vector<float>{10, -4, 6, 0, 22, -7, 12, 3})) << layout(ta, tb);
    }
  }
}

TEST_P(MatmulTest, AllLayoutsMatchReferenceOnOddShapes) {
  unsigned seed = 100;
  for (const Dims& d : odd_shapes()) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        check(d, ta, tb, 1.0f, 0.0f, seed += 3);
      }
    }
  }
}

TEST_P(MatmulTest, AlphaAndBetaScale) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check({67, 45, 130}, ta, tb, -1.5f, 0.5f, 7);
      check({67, 45, 300}, ta, tb, 2.0f, 1.0f, 8);  // K spans two cache blocks
    }
  }
}

TEST_P(MatmulTest, BetaZeroIgnoresNanInC) {
  const Dims d{9, 20, 5};
  const auto av = random_values(45, 1), bv = random_values(100, 2);
  Tensor a = make(av, {9, 5}), b = make(bv, {5, 20});
  Tensor c = make(std::vector<float>(180, std::numeric_limits<float>::quiet_NaN()), {9, 20});
  matmul(c, a, b, false, false, 1.0f, 0.0f, stream());
  const auto out = host(c);
  for (float v : out) ASSERT_FALSE(std::isnan(v));
  EXPECT_TRUE(
      close_for_k(out, reference(av, bv, std::vector<float>(180), d, false, false, 1, 0), 5));
}

TEST_P(MatmulTest, BetaOneAccumulates) {
  Tensor a = make({1, 2, 3, 4}, {2, 2});
  Tensor b = make({1, 0, 0, 1}, {2, 2});
  Tensor c = make({10, 20, 30, 40}, {2, 2});
  matmul(c, a, b, false, false, 1.0f, 1.0f, stream());
  EXPECT_EQ(host(c), (std::vector<float>{11, 22, 33, 44}));
  matmul(c, a, b, false, false, 1.0f, 1.0f, stream());
  EXPECT_EQ(host(c), (std::vector<float>{12, 24, 36, 48}));
}

TEST_P(MatmulTest, EmptyProducts) {
  // M or N zero: nothing to do, nothing touched.
  Tensor c0 = Tensor::zeros({0, 4}, stream());
  matmul(c0, Tensor::zeros({0, 3}, stream()), Tensor::zeros({3, 4}, stream()), false, false, 1, 0,
         stream());
  Tensor c1 = Tensor::zeros({4, 0}, stream());
  matmul(c1, Tensor::zeros({4, 3}, stream()), Tensor::zeros({3, 0}, stream()), false, false, 1, 0,
         stream());
  // K zero: C = beta * C.
  Tensor c = make({2, 4, 6, 8, 10, 12}, {2, 3});
  matmul(c, Tensor::zeros({2, 0}, stream()), Tensor::zeros({0, 3}, stream()), false, false, 1.0f,
         0.5f, stream());
  EXPECT_EQ(host(c), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor cn = make({nan, nan, nan, nan}, {2, 2});
  matmul(cn, Tensor::zeros({0, 2}, stream()), Tensor::zeros({2, 0}, stream()), true, true, 1.0f,
         0.0f, stream());
  EXPECT_EQ(host(cn), (std::vector<float>{0, 0, 0, 0}));
}

TEST_P(MatmulTest, RejectsBadShapes) {
  Tensor a = Tensor::zeros({3, 4}, stream());
  Tensor b = Tensor::zeros({5, 6}, stream());
  Tensor c = Tensor::zeros({3, 6}, stream());
  EXPECT_THROW_WITH(matmul(c, a, b, false, false, 1, 0, stream()), ShapeError,
                    "matmul: a is float32[3,4] (op(a) 3x4) but b is float32[5,6] (op(b) 5x6): "
                    "inner dimensions 4 and 5 differ");
  EXPECT_THROW_WITH(matmul(c, a, b, true, true, 1, 0, stream()), ShapeError,
                    "matmul: a is float32[3,4] (op(a) 4x3) but b is float32[5,6] (op(b) 6x5): "
                    "inner dimensions 3 and 6 differ");
  Tensor b4 = Tensor::zeros({4, 6}, stream());
  Tensor c_bad = Tensor::zeros({6, 3}, stream());
  EXPECT_THROW_WITH(matmul(c_bad, a, b4, false, false, 1, 0, stream()), ShapeError,
                    "matmul: c is float32[6,3] but op(a)*op(b) is 3x6");
  Tensor v = Tensor::zeros({4}, stream());
  EXPECT_THROW_WITH(matmul(c, a, v, false, false, 1, 0, stream()), ShapeError,
                    "matmul: b is float32[4] but must be 2-D");
  Tensor c3 = Tensor::zeros({1, 3, 6}, stream());
  EXPECT_THROW_WITH(matmul(c3, a, b4, false, false, 1, 0, stream()), ShapeError,
                    "matmul: c is float32[1,3,6] but must be 2-D");
  EXPECT_THROW_WITH(matmul(c, Tensor(), b4, false, false, 1, 0, stream()), InvalidArgument,
                    "matmul: a is undefined");
  // C may not overlap an operand: here C is a view of A's memory.
  Tensor square = Tensor::zeros({4, 4}, stream());
  Tensor eye = Tensor::zeros({4, 4}, stream());
  EXPECT_THROW_WITH(matmul(square.view(0, {4, 4}), square, eye, false, false, 1, 0, stream()),
                    InvalidArgument, "overlaps a");
}

TEST_P(MatmulTest, RawGemmHonoursLeadingDimensions) {
  // A, B, C are windows of wider buffers: rows are lda/ldb/ldc apart, and the
  // padding between rows must be neither read into the result nor written.
  const Dims d{37, 21, 19};
  const std::int64_t pad = 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Shape as = a_shape(d, ta), bs = b_shape(d, tb);
      const std::int64_t lda = as[1] + pad, ldb = bs[1] + pad, ldc = d.n + pad;
      auto a_wide = random_values(static_cast<std::size_t>(as[0] * lda), 31);
      auto b_wide = random_values(static_cast<std::size_t>(bs[0] * ldb), 32);
      auto c_wide = random_values(static_cast<std::size_t>(d.m * ldc), 33);
      std::vector<float> av, bv, cv;
      for (std::int64_t r = 0; r < as[0]; ++r)
        for (std::int64_t s = 0; s < as[1]; ++s) av.push_back(a_wide[r * lda + s]);
      for (std::int64_t r = 0; r < bs[0]; ++r)
        for (std::int64_t s = 0; s < bs[1]; ++s) bv.push_back(b_wide[r * ldb + s]);
      for (std::int64_t r = 0; r < d.m; ++r)
        for (std::int64_t s = 0; s < d.n; ++s) cv.push_back(c_wide[r * ldc + s]);
      const auto expected = reference(av, bv, cv, d, ta, tb, 0.75, -1.0);

      Tensor a = make(a_wide, {as[0], lda}), b = make(b_wide, {bs[0], ldb});
      Tensor c = make(c_wide, {d.m, ldc});
      if (device().is_cpu()) {
        cpu::gemm<float>(ta, tb, d.m, d.n, d.k, 0.75f, a.data<float>(), lda, b.data<float>(), ldb,
                         -1.0f, c.data<float>(), ldc);
      } else {
#if TOWERLAB_WITH_CUDA
        cuda::gemm(ta, tb, d.m, d.n, d.k, 0.75f, a.data<float>(), lda, b.data<float>(), ldb, -1.0f,
                   c.data<float>(), ldc, stream());
#endif
      }
      const auto out = host(c);
      std::vector<float> inside, padding, padding_before;
      for (std::int64_t r = 0; r < d.m; ++r) {
        for (std::int64_t s = 0; s < ldc; ++s) {
          (s < d.n ? inside : padding).push_back(out[r * ldc + s]);
          if (s >= d.n) padding_before.push_back(c_wide[r * ldc + s]);
        }
      }
      EXPECT_TRUE(close_for_k(inside, expected, d.k)) << layout(ta, tb);
      EXPECT_EQ(padding, padding_before) << layout(ta, tb);
    }
  }
}

#if TOWERLAB_WITH_CUDA
TEST_P(MatmulTest, CudaMisalignedOperandsAndCublasAgree) {
  if (device().is_cpu()) GTEST_SKIP() << "CUDA-only: float4 fallback and the cuBLAS path";
  // Offsets of one element make every pointer 4 bytes off a float4 boundary. Three
  // sizes, so that every tile shape of the kernel meets them (with 8 SMs, 300x600
  // runs on 128x256 tiles, 300x260 on 128x128 tiles and 130x131 on 64x64 ones).
  for (const Dims& d : {Dims{130, 131, 67}, Dims{300, 260, 67}, Dims{300, 600, 67}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Shape as = a_shape(d, ta), bs = b_shape(d, tb);
        const auto av = random_values(static_cast<std::size_t>(d.m * d.k + 1), 41);
        const auto bv = random_values(static_cast<std::size_t>(d.k * d.n + 1), 42);
        Tensor a = make(av, {d.m * d.k + 1}).view(1, as);
        Tensor b = make(bv, {d.k * d.n + 1}).view(1, bs);
        Tensor c_ours = Tensor::empty({d.m * d.n + 1}, stream()).view(1, {d.m, d.n});
        Tensor c_cublas = Tensor::empty({d.m, d.n}, stream());
        matmul(c_ours, a, b, ta, tb, 1.0f, 0.0f, stream());
        set_gemm_backend(GemmBackend::Cublas);
        matmul(c_cublas, a, b, ta, tb, 1.0f, 0.0f, stream());
        set_gemm_backend(GemmBackend::Towerlab);
        const std::vector<float> a_host(av.begin() + 1, av.end()), b_host(bv.begin() + 1, bv.end());
        const auto expected = reference(a_host, b_host, {}, d, ta, tb, 1.0, 0.0);
        EXPECT_TRUE(close_for_k(host(c_ours), expected, d.k)) << layout(ta, tb);
        EXPECT_TRUE(close_for_k(host(c_cublas), expected, d.k)) << "cuBLAS " << layout(ta, tb);
      }
    }
  }
}

// The kernel's operand paths on both tiles, in every layout: cp.async (A
// transposed, B not) in 16-byte copies, zero-filled 16-byte copies past the
// edge, 4-byte copies at a ragged edge and on misaligned rows; registers (A not
// transposed, B transposed) with and without float4 loads. The leading
// dimensions are either the dense ones (no row 16-byte aligned) or padded to a
// multiple of 4 (aligned rows, with 2 of the last 4 floats of a 250-wide row past
// the edge). 130x250x1301 is 2x2 tiles of 128 with ragged rows and columns,
// split 19 ways along K on 132 SMs (the last split is 5, less than a step), and
// 2x1 tiles of 128x256 split 4 ways on 8; 300x260x67 is 3x3 tiles of 128 unsplit on 8
// SMs (ragged rows and columns); 384x520x67 is 3x3 tiles of 128x256 on 8 SMs (a
// column tile of 8) and 6x9 tiles of 64 on 132; 270x600x33 is 3x3 tiles of
// 128x256 on 8 SMs with ragged rows, columns and K; 270x600x5 and
// 384x520x13 are those tiles with one K-step and with two (the wide kernel's
// prologue alone, and one step past it); 384x520x24 has whole K-steps, so its
// six tiles inside C (with 16-byte rows) take the wide kernel's unchecked loop.
TEST_P(MatmulTest, CudaOperandPathsCoverEveryLayoutEdgeAndAlignment) {
  if (device().is_cpu()) GTEST_SKIP() << "CUDA-only: the kernel's operand paths";
  for (const Dims& d :
       {Dims{130, 250, 1301}, Dims{300, 260, 67}, Dims{384, 520, 67}, Dims{270, 600, 33},
        Dims{270, 600, 5}, Dims{384, 520, 13}, Dims{384, 520, 24}}) {
    for (const std::int64_t round_to : {1, 4}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const Shape as = a_shape(d, ta), bs = b_shape(d, tb);
          auto padded = [&](std::int64_t cols) {
            return (cols + round_to - 1) / round_to * round_to;
          };
          const std::int64_t lda = padded(as[1]), ldb = padded(bs[1]), ldc = padded(d.n);
          const auto a_wide = random_values(static_cast<std::size_t>(as[0] * lda), 51);
          const auto b_wide = random_values(static_cast<std::size_t>(bs[0] * ldb), 52);
          std::vector<float> av, bv;
          for (std::int64_t r = 0; r < as[0]; ++r)
            for (std::int64_t s = 0; s < as[1]; ++s) av.push_back(a_wide[r * lda + s]);
          for (std::int64_t r = 0; r < bs[0]; ++r)
            for (std::int64_t s = 0; s < bs[1]; ++s) bv.push_back(b_wide[r * ldb + s]);
          const auto expected = reference(av, bv, {}, d, ta, tb, 1.0, 0.0);
          Tensor a = make(a_wide, {as[0], lda}), b = make(b_wide, {bs[0], ldb});
          Tensor c = make(std::vector<float>(static_cast<std::size_t>(d.m * ldc),
                                             std::numeric_limits<float>::quiet_NaN()),
                          {d.m, ldc});
          cuda::gemm(ta, tb, d.m, d.n, d.k, 1.0f, a.data<float>(), lda, b.data<float>(), ldb, 0.0f,
                     c.data<float>(), ldc, stream());
          const auto out = host(c);
          std::vector<float> inside;
          for (std::int64_t r = 0; r < d.m; ++r)
            for (std::int64_t s = 0; s < d.n; ++s) inside.push_back(out[r * ldc + s]);
          EXPECT_TRUE(close_for_k(inside, expected, d.k))
              << layout(ta, tb) << " " << d.m << "x" << d.n << "x" << d.k << ", rows rounded to "
              << round_to;
        }
      }
    }
  }
}

// Few tiles of C and a long K, which the CUDA kernel splits along K on a GPU with
// many SMs (FashionNet's fc1 forward is one 128x128 tile with K = 3136), plus its
// backward products and a K that no split count divides: against the reference,
// beta = 0 over NaN in C and beta != 0, and the same bits when run again. With
// 132 SMs the plans cover 64x64 tiles split (fc1 forward, 100x70, 5x3) and
// unsplit (the backward products, 720x780), 128x128 tiles split (256x512x640);
// with 8 SMs, 128x256 tiles unsplit (the backward products, 720x780) and split
// (fc1 forward, 256x512x640, 5x3), 64x64 unsplit (100x70).
TEST_P(MatmulTest, CudaSplitKMatchesReferenceAndRepeatsTheBits) {
  if (device().is_cpu()) GTEST_SKIP() << "CUDA-only: the split-K path";
  const struct {
    Dims d;
    bool ta, tb;
    float beta;
  } cases[] = {
      {{128, 128, 3136}, false, true, 0.0f},  {{64, 128, 3136}, false, true, 0.0f},
      {{128, 3136, 128}, false, false, 1.0f}, {{128, 3136, 128}, true, false, 1.0f},
      {{100, 70, 1001}, true, true, -0.5f},   {{5, 3, 4099}, false, false, 0.0f},
      {{256, 512, 640}, true, false, 0.5f},   {{720, 780, 40}, false, true, 0.0f},
  };
  unsigned seed = 600;
  for (const auto& t : cases) {
    const Dims& d = t.d;
    const auto av = random_values(static_cast<std::size_t>(d.m * d.k), ++seed);
    const auto bv = random_values(static_cast<std::size_t>(d.k * d.n), ++seed);
    const auto cv = t.beta == 0.0f ? std::vector<float>(static_cast<std::size_t>(d.m * d.n),
                                                        std::numeric_limits<float>::quiet_NaN())
                                   : random_values(static_cast<std::size_t>(d.m * d.n), ++seed);
    Tensor a = make(av, a_shape(d, t.ta)), b = make(bv, b_shape(d, t.tb));
    auto run = [&] {
      Tensor c = make(cv, {d.m, d.n});
      matmul(c, a, b, t.ta, t.tb, 1.0f, t.beta, stream());
      return host(c);
    };
    const auto first = run();
    SCOPED_TRACE(layout(t.ta, t.tb) + " " + std::to_string(d.m) + "x" + std::to_string(d.n) + "x" +
                 std::to_string(d.k));
    EXPECT_TRUE(close_for_k(first, reference(av, bv, cv, d, t.ta, t.tb, 1.0, t.beta), d.k));
    EXPECT_EQ(run(), first);
  }
}

// Staging (kernels/cuda/matmul.cu): on the wide tile, unsplit, an operand that the
// kernel would transpose on its way into shared memory is transposed into scratch
// first where the other side of C is at least 2048. 270x2048x13 stages A (NN, NT)
// with M not a multiple of 4 (the staged rows padded with zeros), 2050x262x13 stages
// B (NT, TT) with N not a multiple of 4; both have a ragged last K-step. Those are
// the plans on 8 SMs (scripts/test.sh's rerun); on 132 the same products take
// unstaged plans. Either way: against the reference, with beta != 0, and the same
// bits as the product of the same operands stored k-major (A transposed, B not),
// which is the kernel a staged product runs.
TEST_P(MatmulTest, CudaStagedOperandsGiveTheKMajorProductsBits) {
  if (device().is_cpu()) GTEST_SKIP() << "CUDA-only: staging";
  unsigned seed = 700;
  for (const Dims& d : {Dims{270, 2048, 13}, Dims{2050, 262, 13}}) {
    const auto cv = random_values(static_cast<std::size_t>(d.m * d.n), ++seed);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const auto av = random_values(static_cast<std::size_t>(d.m * d.k), ++seed);
        const auto bv = random_values(static_cast<std::size_t>(d.k * d.n), ++seed);
        // The same values stored k-major: A^T [k,m] and B [k,n].
        std::vector<float> a_kmajor(av.size()), b_kmajor(bv.size());
        for (std::int64_t i = 0; i < d.m; ++i) {
          for (std::int64_t p = 0; p < d.k; ++p) {
            a_kmajor[p * d.m + i] = ta ? av[p * d.m + i] : av[i * d.k + p];
          }
        }
        for (std::int64_t j = 0; j < d.n; ++j) {
          for (std::int64_t p = 0; p < d.k; ++p) {
            b_kmajor[p * d.n + j] = tb ? bv[j * d.k + p] : bv[p * d.n + j];
          }
        }
        auto run = [&](const std::vector<float>& a, const std::vector<float>& b, bool t_a,
                       bool t_b) {
          Tensor c = make(cv, {d.m, d.n});
          matmul(c, make(a, a_shape(d, t_a)), make(b, b_shape(d, t_b)), t_a, t_b, 1.0f, 0.5f,
                 stream());
          return host(c);
        };
        SCOPED_TRACE(layout(ta, tb) + " " + std::to_string(d.m) + "x" + std::to_string(d.n) + "x" +
                     std::to_string(d.k));
        const auto c = run(av, bv, ta, tb);
        EXPECT_TRUE(close_for_k(c, reference(av, bv, cv, d, ta, tb, 1.0, 0.5), d.k));
        EXPECT_EQ(c, run(a_kmajor, b_kmajor, true, false));
      }
    }
  }
}
#endif

// C = op(A) op(B), L = sum(G * C). With op(A) [M,K], op(B) [K,N]:
//   dL/dop(A) = G op(B)^T, dL/dop(B) = op(A)^T G,
// each expressed as one matmul into the stored layout, accumulated (beta = 1).
TEST(MatmulGradient, MatchesCentralDifferencesInEveryLayout) {
  const Stream& cpu = default_stream(Device::cpu());
  const Dims d{3, 4, 5};
  const double sentinel = 0.25;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor a = random_double_tensor(a_shape(d, ta), 61);
      Tensor b = random_double_tensor(b_shape(d, tb), 62);
      Tensor g = random_double_tensor({d.m, d.n}, 63);
      auto loss = [&](const std::vector<Tensor>& in) {
        Tensor c = Tensor::empty({d.m, d.n}, cpu, DType::Float64);
        matmul(c, in[0], in[1], ta, tb, 1.0f, 0.0f, cpu);
        return weighted_sum(g, c);
      };
      Tensor grad_a = Tensor::empty(a.shape(), cpu, DType::Float64);
      Tensor grad_b = Tensor::empty(b.shape(), cpu, DType::Float64);
      fill(grad_a, sentinel, cpu);
      fill(grad_b, sentinel, cpu);
      if (!ta) {
        matmul(grad_a, g, b, false, !tb, 1.0f, 1.0f, cpu);  // [M,K] += G op(B)^T
      } else {
        matmul(grad_a, b, g, tb, true, 1.0f, 1.0f, cpu);  // [K,M] += op(B) G^T
      }
      if (!tb) {
        matmul(grad_b, a, g, !ta, false, 1.0f, 1.0f, cpu);  // [K,N] += op(A)^T G
      } else {
        matmul(grad_b, g, a, true, ta, 1.0f, 1.0f, cpu);  // [N,K] += G^T op(A)
      }
      // Take the sentinel back out: a backward that assigned would fail here.
      Tensor sentinel_a = Tensor::empty(a.shape(), cpu, DType::Float64);
      Tensor sentinel_b = Tensor::empty(b.shape(), cpu, DType::Float64);
      fill(sentinel_a, sentinel, cpu);
      fill(sentinel_b, sentinel, cpu);
      sub(grad_a, grad_a, sentinel_a, cpu);
      sub(grad_b, grad_b, sentinel_b, cpu);
      EXPECT_TRUE(check_gradient(loss, {a, b}, {grad_a, grad_b})) << layout(ta, tb);
    }
  }
}

}  // namespace
}  // namespace towerlab::testing
