// The CPU GEMM's own paths, bit for bit: the same bits on any thread count, in an
// edge tile as in a full one and as each output's scalar chain, with A or B (or
// both) packed ahead or written straight into the GEMM's panels, with panels packed
// across rows; and every micro-kernel this CPU runs against the reference. The
// comparisons with packed operands and with the scalar chains each carry a control
// that shows they can fail. matmul on every backend is matmul_test.cpp's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/matmul.h"
#include "matmul_case.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// The CPU GEMM's result may not depend on the thread count: each element of C is
// summed by one micro-kernel in a fixed order, so the bits must match.
TEST(MatmulCpu, ThreadCountDoesNotChangeTheBits) {
  const Stream& cpu = default_stream(Device::cpu());
  const int saved = num_threads();
  for (const Dims& d : {Dims{257, 129, 65}, Dims{6, 2000, 300}, Dims{600, 300, 520}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Tensor a = Tensor::from_host<float>(random_values(d.m * d.k, 51), a_shape(d, ta), cpu);
        Tensor b = Tensor::from_host<float>(random_values(d.k * d.n, 52), b_shape(d, tb), cpu);
        std::vector<std::vector<float>> results;
        for (int threads : {1, 2, 3}) {
          set_num_threads(threads);
          Tensor c = Tensor::empty({d.m, d.n}, cpu);
          matmul(c, a, b, ta, tb, 1.0f, 0.0f, cpu);
          results.push_back(c.to_host<float>());
        }
        EXPECT_EQ(results[0], results[1]) << layout(ta, tb) << " " << d.m << "x" << d.n;
        EXPECT_EQ(results[0], results[2]) << layout(ta, tb) << " " << d.m << "x" << d.n;
      }
    }
  }
  set_num_threads(saved);
}

// A tile on the edge of C (fewer rows or columns than the micro-kernel's) may be
// computed by a smaller kernel, but each output is the same k-loop of the same
// FMAs: its bits are those it has inside a full tile. C = A B with A of 36 rows
// and B of 64 columns (whole tiles on every kernel here) against the same product
// cut to 1-35 rows and 1-63 columns (edge tiles of every size), on every ISA, with
// beta 0 and beta 1 (the edge's write-back); and AVX2's products are AVX-512's.
TEST(MatmulCpu, EdgeTilesHaveTheFullTilesBits) {
  const RestoreGemmIsa restore;
  const std::int64_t M = 36, N = 64, K = 75;
  const auto a = random_values(std::size_t(M * K), 801), b = random_values(std::size_t(K * N), 802);
  const auto c0 = random_values(std::size_t(M * N), 803);
  int isas = 0;
  std::vector<float> avx_whole[2];  // the first x86 vector kernel's products, per beta
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas;
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> whole = c0;
      cpu::gemm<float>(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, beta, whole.data(),
                       N);
      // AVX2 and AVX-512 tiles differ in size, not in any output's arithmetic.
      if (isa != GemmIsa::Portable) {
        std::vector<float>& first = avx_whole[beta == 0.0f ? 0 : 1];
        if (first.empty()) first = whole;
        EXPECT_EQ(whole, first) << "isa " << int(isa) << " against the first vector ISA";
      }
      for (std::int64_t m = 1; m <= M; ++m) {
        for (std::int64_t n = 1; n <= N; n += (n < 20 ? 1 : 7)) {
          std::vector<float> part = c0;  // C's first m rows and n columns, ldc N
          cpu::gemm<float>(false, false, m, n, K, 1.0f, a.data(), K, b.data(), N, beta, part.data(),
                           N);
          for (std::int64_t i = 0; i < M; ++i) {
            for (std::int64_t j = 0; j < N; ++j) {
              const bool inside = i < m && j < n;
              const float want =
                  inside ? whole[std::size_t(i * N + j)] : c0[std::size_t(i * N + j)];
              ASSERT_EQ(part[std::size_t(i * N + j)], want)
                  << "isa " << int(isa) << ", beta " << beta << ", " << m << " x " << n << " at ("
                  << i << ", " << j << ")" << (inside ? "" : ", outside: not written");
            }
          }
        }
      }
    }
  }
  EXPECT_GE(isas, 1);
}

// B written straight into the GEMM's panels (GemmBPanels::at) gives the bits of the
// GEMM packing B itself, op(A) transposed or not, beta 0 and 1, on every ISA: a K of
// two blocks (300 = 256 + 44), an N that ends in a partial panel on every width (37),
// the padding's columns left as zeros.
TEST(MatmulCpu, PackedBHasTheGemmsBits) {
  const RestoreGemmIsa restore;
  const std::int64_t M = 29, N = 37, K = 300;
  const auto a = random_values(std::size_t(M * K), 811), b = random_values(std::size_t(K * N), 812);
  const auto c0 = random_values(std::size_t(M * N), 813);
  int isas = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas;
    const cpu::GemmBPanels panels = cpu::gemm_b_panels(K, N);
    EXPECT_EQ(panels.isa, isa);
    std::vector<float> packed(std::size_t(panels.floats()), 0.0f);
    for (std::int64_t p = 0; p < K; ++p) {
      for (std::int64_t j = 0; j < N; ++j) {
        packed[std::size_t(panels.at(p, j))] = b[std::size_t(p * N + j)];
      }
    }
    for (bool ta : {false, true}) {
      for (float beta : {0.0f, 1.0f}) {
        // op(A) [M,K]: A stored [M,K], or [K,M] when transposed (the same values, moved).
        std::vector<float> stored = a;
        if (ta) {
          for (std::int64_t i = 0; i < M; ++i) {
            for (std::int64_t p = 0; p < K; ++p)
              stored[std::size_t(p * M + i)] = a[std::size_t(i * K + p)];
          }
        }
        const std::int64_t lda = ta ? M : K;
        std::vector<float> want = c0, got = c0;
        cpu::gemm<float>(ta, false, M, N, K, 1.0f, stored.data(), lda, b.data(), N, beta,
                         want.data(), N);
        cpu::gemm_packed_b(ta, M, stored.data(), lda, panels, packed.data(), beta, got.data(), N);
        EXPECT_EQ(got, want) << "isa " << int(isa) << (ta ? ", A transposed" : "") << ", beta "
                             << beta;
      }
    }
  }
  EXPECT_GE(isas, 1);
}

// Every tile of the AVX kernels, full or at an edge (M = 16 = 6 + 6 + 4 rows on AVX2,
// 12 + 4 on AVX-512; N = 40 = 16 + 16 + 8 columns, 32 + 8), computed in place or aside,
// has the bits of each output's scalar chain: fused multiply-adds in k order, kGemmKc
// at a time, each block's sum then rounded onto beta * C (alpha 1, beta 0, 1 and -0.5;
// the later blocks onto C). Control: the chain without its last product differs.
TEST(MatmulCpu, EdgeTilesHaveTheScalarChainsBits) {
  const RestoreGemmIsa restore;
  const std::int64_t M = 16, N = 40, K = 300;
  const auto a = random_values(std::size_t(M * K), 841), b = random_values(std::size_t(K * N), 842);
  const auto c0 = random_values(std::size_t(M * N), 843);
  auto chain = [&](float beta, std::int64_t depth) {
    std::vector<float> c = c0;
    for (std::int64_t i = 0; i < M; ++i) {
      for (std::int64_t j = 0; j < N; ++j) {
        float& out = c[std::size_t(i * N + j)];
        for (std::int64_t p0 = 0; p0 < depth; p0 += cpu::kGemmKc) {
          float acc = 0.0f;
          for (std::int64_t p = p0; p < std::min(depth, p0 + cpu::kGemmKc); ++p) {
            acc = std::fma(a[std::size_t(i * K + p)], b[std::size_t(p * N + j)], acc);
          }
          const float scaled = p0 == 0 ? beta * out : out;
          out = p0 == 0 && beta == 0.0f ? acc : acc + scaled;
        }
      }
    }
    return c;
  };
  int isas = 0;
  for (GemmIsa isa : {GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas;
    for (float beta : {0.0f, 1.0f, -0.5f}) {
      SCOPED_TRACE(::testing::Message() << "isa " << int(isa) << ", beta " << beta);
      std::vector<float> got = c0;
      cpu::gemm<float>(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, beta, got.data(), N);
      EXPECT_EQ(bits(got), bits(chain(beta, K)));
      EXPECT_NE(bits(got), bits(chain(beta, K - 1))) << "control";
    }
  }
  if (isas == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512";
}

// A and B both written straight into the GEMM's panels (GemmAPanels::at,
// GemmBPanels::at) give the bits of the GEMM packing both, beta 0 and 1, on every
// ISA: a K of two blocks, an M and an N that end in partial panels on every height
// and width, the padding left as zeros. Control: A's last value 0.1% off changes
// bits the comparison sees.
TEST(MatmulCpu, PackedAAndBHaveTheGemmsBits) {
  const RestoreGemmIsa restore;
  const std::int64_t M = 29, N = 37, K = 300;
  const auto a = random_values(std::size_t(M * K), 831), b = random_values(std::size_t(K * N), 832);
  const auto c0 = random_values(std::size_t(M * N), 833);
  int isas = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas;
    const cpu::GemmAPanels a_panels = cpu::gemm_a_panels(M, K);
    const cpu::GemmBPanels b_panels = cpu::gemm_b_panels(K, N);
    EXPECT_EQ(a_panels.isa, isa);
    std::vector<float> packed_a(std::size_t(a_panels.floats()), 0.0f);
    std::vector<float> packed_b(std::size_t(b_panels.floats()), 0.0f);
    for (std::int64_t p = 0; p < K; ++p) {
      for (std::int64_t i = 0; i < M; ++i) {
        packed_a[std::size_t(a_panels.at(i, p))] = a[std::size_t(i * K + p)];
      }
      for (std::int64_t j = 0; j < N; ++j) {
        packed_b[std::size_t(b_panels.at(p, j))] = b[std::size_t(p * N + j)];
      }
    }
    std::vector<float> off_a = packed_a;
    off_a[std::size_t(a_panels.at(M - 1, K - 1))] *= 1.001f;
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(::testing::Message() << "isa " << int(isa) << ", beta " << beta);
      std::vector<float> want = c0, got = c0, control = c0;
      cpu::gemm<float>(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, beta, want.data(), N);
      cpu::gemm_packed_ab(a_panels, packed_a.data(), b_panels, packed_b.data(), beta, got.data(),
                          N);
      EXPECT_EQ(bits(got), bits(want));
      cpu::gemm_packed_ab(a_panels, off_a.data(), b_panels, packed_b.data(), beta, control.data(),
                          N);
      EXPECT_NE(bits(control), bits(want)) << "control";
    }
  }
  EXPECT_GE(isas, 1);
}

// A packed once (PackedA), op(A) transposed or not, against op(B) that the GEMM packs,
// transposed or not, gives the bits of gemm packing both, beta 0 and 1, on every
// ISA: the same sizes as above (M = 29 ends in a partial panel on every MR), and a
// product large enough to be shared among the threads. The panels are a copy: A
// overwritten after packing changes nothing. Control: A's last value 0.1% off before
// packing changes bits the comparison sees.
TEST(MatmulCpu, PackedAHasTheGemmsBits) {
  const RestoreGemmIsa restore;
  const std::int64_t M = 29, N = 37, K = 300;
  const auto a = random_values(std::size_t(M * K), 821), b = random_values(std::size_t(K * N), 822);
  const auto c0 = random_values(std::size_t(M * N), 823);
  // op(X) [rows, cols] stored as is ([rows, cols]) or transposed ([cols, rows]).
  auto stored = [](const std::vector<float>& x, std::int64_t rows, std::int64_t cols, bool t) {
    std::vector<float> out = x;
    if (t) {
      for (std::int64_t i = 0; i < rows; ++i) {
        for (std::int64_t p = 0; p < cols; ++p)
          out[std::size_t(p * rows + i)] = x[std::size_t(i * cols + p)];
      }
    }
    return out;
  };
  int isas = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const std::vector<float> sa = stored(a, M, K, ta), sb = stored(b, K, N, tb);
        const std::int64_t lda = ta ? M : K, ldb = tb ? K : N;
        std::vector<float> copy = sa;
        const cpu::PackedA packed(copy.data(), lda, M, K, ta);
        std::fill(copy.begin(), copy.end(), 7.0f);  // the panels are a copy
        std::vector<float> off_a = sa;
        off_a[ta ? std::size_t((K - 1) * M + M - 1) : std::size_t(M * K - 1)] *= 1.001f;
        const cpu::PackedA off(off_a.data(), lda, M, K, ta);
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE(::testing::Message() << "isa " << int(isa) << (ta ? ", A transposed" : "")
                                            << (tb ? ", B transposed" : "") << ", beta " << beta);
          std::vector<float> want = c0, got = c0, control = c0;
          cpu::gemm<float>(ta, tb, M, N, K, 1.0f, sa.data(), lda, sb.data(), ldb, beta, want.data(),
                           N);
          cpu::gemm_packed_a(packed, tb, N, sb.data(), ldb, beta, got.data(), N);
          EXPECT_EQ(bits(got), bits(want));
          cpu::gemm_packed_a(off, tb, N, sb.data(), ldb, beta, control.data(), N);
          EXPECT_NE(bits(control), bits(want)) << "control";
        }
      }
    }
    // A larger product, which gemm shares among the threads.
    const std::int64_t m = 64, n = 196, k = 576;
    const auto la = random_values(std::size_t(m * k), 824),
               lb = random_values(std::size_t(k * n), 825);
    std::vector<float> want(std::size_t(m * n)), got(std::size_t(m * n), 3.0f);
    cpu::gemm<float>(false, false, m, n, k, 1.0f, la.data(), k, lb.data(), n, 0.0f, want.data(), n);
    cpu::gemm_packed_a(cpu::PackedA(la.data(), k, m, k), false, n, lb.data(), n, 0.0f, got.data(),
                       n);
    EXPECT_EQ(bits(got), bits(want)) << "isa " << int(isa) << ", " << m << " x " << n << " x " << k;
  }
  EXPECT_GE(isas, 1);
}

// A stored [K,M] and B stored [K,N], which gemm packs row by row across their panels
// (eight at a time), give the bits of the same operands packed apart from gemm:
// A by PackedA (panel by panel), B written at GemmBPanels::at. On every ISA, with
// beta 0 and 1, on one thread and shared among three (B's panels then packed in
// ranges that start past the first): a ViT's weight gradient (K = 3136 tokens, 64
// features: a K of many blocks), more than eight panels of each (the groups, then
// A's second row block) with partial last panels, and 49 tokens by 16 features.
// Control: B's last value 0.1% off changes bits the comparison sees.
TEST(MatmulCpu, PanelsPackedAcrossRowsHaveTheGemmsBits) {
  const RestoreGemmIsa restore;
  const int saved = num_threads();
  int isas = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas;
    unsigned seed = 870;
    for (const Dims& d : {Dims{64, 64, 3136}, Dims{160, 200, 300}, Dims{49, 16, 49}}) {
      const auto a_t = random_values(std::size_t(d.k * d.m), seed += 3);  // A stored [K,M]
      const auto b = random_values(std::size_t(d.k * d.n), seed + 1);     // B stored [K,N]
      const auto c0 = random_values(std::size_t(d.m * d.n), seed + 2);
      const cpu::PackedA packed_a(a_t.data(), d.m, d.m, d.k, /*transpose_a=*/true);
      const cpu::GemmBPanels panels = packed_a.b_panels(d.n);
      std::vector<float> packed_b(std::size_t(panels.floats()), 0.0f), off_b = b;
      for (std::int64_t p = 0; p < d.k; ++p) {
        for (std::int64_t j = 0; j < d.n; ++j) {
          packed_b[std::size_t(panels.at(p, j))] = b[std::size_t(p * d.n + j)];
        }
      }
      off_b.back() *= 1.001f;
      for (int threads : {1, 3}) {
        set_num_threads(threads);
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE(::testing::Message()
                       << "isa " << int(isa) << ", " << d.m << " x " << d.n << " x " << d.k << ", "
                       << threads << " threads, beta " << beta);
          std::vector<float> got = c0, want = c0, control = c0;
          cpu::gemm<float>(true, false, d.m, d.n, d.k, 1.0f, a_t.data(), d.m, b.data(), d.n, beta,
                           got.data(), d.n);
          cpu::gemm_packed(packed_a, panels, packed_b.data(), beta, want.data(), d.n);
          ASSERT_EQ(bits(got), bits(want));
          cpu::gemm<float>(true, false, d.m, d.n, d.k, 1.0f, a_t.data(), d.m, off_b.data(), d.n,
                           beta, control.data(), d.n);
          EXPECT_NE(bits(control), bits(want)) << "control";
        }
      }
    }
  }
  set_num_threads(saved);
  EXPECT_GE(isas, 1);
}

// Every micro-kernel this CPU can run (the portable one always) against the reference.
TEST(MatmulCpu, EveryMicroKernelMatchesReference) {
  const Stream& cpu = default_stream(Device::cpu());
  const GemmIsa saved = gemm_isa();
  int ran = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) {
      EXPECT_THROW_WITH(set_gemm_isa(isa), NotSupported, "this CPU does not support");
      continue;
    }
    set_gemm_isa(isa);
    EXPECT_EQ(gemm_isa(), isa);
    ++ran;
    unsigned seed = 500;
    for (const Dims& d : {Dims{1, 1, 1}, Dims{13, 37, 29}, Dims{37, 67, 300}, Dims{128, 96, 64}}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const auto av = random_values(d.m * d.k, seed += 3),
                     bv = random_values(d.k * d.n, seed + 1);
          const auto cv = random_values(d.m * d.n, seed + 2);
          Tensor a = Tensor::from_host<float>(av, a_shape(d, ta), cpu);
          Tensor b = Tensor::from_host<float>(bv, b_shape(d, tb), cpu);
          Tensor c = Tensor::from_host<float>(cv, {d.m, d.n}, cpu);
          matmul(c, a, b, ta, tb, 1.25f, -0.5f, cpu);
          EXPECT_TRUE(
              close_for_k(c.to_host<float>(), reference(av, bv, cv, d, ta, tb, 1.25, -0.5), d.k))
              << "isa " << static_cast<int>(isa) << " " << layout(ta, tb);
        }
      }
    }
  }
  EXPECT_GE(ran, 1);
  set_gemm_isa(GemmIsa::Auto);
  EXPECT_NE(gemm_isa(), GemmIsa::Auto);
  set_gemm_isa(saved);
}

}  // namespace
}  // namespace towerlab::testing
