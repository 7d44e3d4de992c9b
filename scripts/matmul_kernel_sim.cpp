// Host simulation of towerlab's CUDA GEMM (kernels/cuda/matmul.cu up to its
// cuBLAS section, turned into C++ by scripts/sim_matmul_kernel.sh): the split
// plan, the launcher, gemm_kernel and the split reduction, each block as 256
// std::threads with a std::barrier for __syncthreads (scripts/cuda_sim_shim.h).
// Compared with a double-precision loop:
//   - the plan's invariants over a table of shapes for 8 and 132 SMs;
//   - ragged, padded, misaligned and K = 0 products in all four layouts, with
//     the plans for 8 and for 132 SMs (split and unsplit);
//   - FashionNet's linear layer 3136 -> 128 at batch 128 and 64, in the three
//     layouts its forward and backward use;
//   - forced plans: K not divisible by the splits, K smaller than the splits
//     (empty splits), K = 0 with splits;
//   - beta = 0 over NaN in C and beta != 0 on every case; a split product run
//     twice gives the same bits; a partial tampered with is caught.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "towerlab.h"
// After towerlab.h: the shim's macros stand in for CUDA's keywords.
#include "matmul_sim.inc"

// The launcher under test takes its plan explicitly; the SM count only sizes the
// grid-stride reduction's grid (cuda_sim_shim.h's grid_for), kept small here.
int sim_sms = 8;
namespace towerlab::simcuda {
long sim_blocks_run = 0;
}  // namespace towerlab::simcuda

namespace {

using towerlab::simcuda::GemmPlan;
using towerlab::simcuda::plan_gemm;

struct Product {
  int m, n, k, pad;  // an odd pad also shifts every pointer by one float
  bool ta, tb;
  float beta;  // 0: C starts as NaN and must not be read
};

struct Outcome {
  int bad = 0;             // elements outside tolerance, or padding that changed
  std::vector<float> out;  // C's buffer after the product
};

// C = 1.5 op(A) op(B) + beta C with `plan`, from operands drawn with `seed`.
// `tamper`: add 1 to the last partial after the split GEMM launch (a control).
Outcome run(const Product& d, const GemmPlan& plan, unsigned seed, bool tamper = false) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const std::int64_t a_rows = d.ta ? d.k : d.m, a_cols = d.ta ? d.m : d.k;
  const std::int64_t b_rows = d.tb ? d.n : d.k, b_cols = d.tb ? d.k : d.n;
  const std::int64_t lda = a_cols + d.pad, ldb = b_cols + d.pad, ldc = d.n + d.pad;
  std::vector<float> a_buf(a_rows * lda + 8), b_buf(b_rows * ldb + 8), c_buf(d.m * ldc + 8);
  for (float& x : a_buf) x = uniform(gen);
  for (float& x : b_buf) x = uniform(gen);
  for (float& x : c_buf) x = uniform(gen);
  const int shift = d.pad % 2;
  const float* a = a_buf.data() + shift;
  const float* b = b_buf.data() + shift;
  float* c = c_buf.data() + shift;
  const float alpha = 1.5f;
  if (d.beta == 0.0f) {
    for (std::int64_t i = 0; i < d.m; ++i)
      for (std::int64_t j = 0; j < d.n; ++j) c[i * ldc + j] = NAN;
  }
  const std::vector<float> c_before(c_buf);

  towerlab::simcuda::GemmParams p{};
  p.m = d.m, p.n = d.n, p.k = d.k, p.alpha = alpha, p.a = a, p.lda = lda, p.b = b, p.ldb = ldb;
  p.beta = d.beta, p.c = c, p.ldc = ldc;
  if (tamper) {
    towerlab::simcuda::sim_after_launch = [](std::size_t launch) {
      if (launch != 0) return;
      float* partial = static_cast<float*>(towerlab::simcuda::sim_last_scratch);
      partial[towerlab::simcuda::sim_last_scratch_bytes / sizeof(float) - 1] += 1.0f;
    };
  }
  towerlab::simcuda::sim_grids.clear();
  towerlab::simcuda::gemm_towerlab(d.ta, d.tb, p, plan,
                                   towerlab::default_stream(towerlab::Device::cpu()));
  towerlab::simcuda::sim_after_launch = nullptr;

  Outcome result;
  for (std::int64_t i = 0; i < d.m; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const std::size_t at = static_cast<std::size_t>(shift + i * ldc + j);
      const float got = c_buf[at];
      if (j >= d.n) {  // padding between rows: untouched
        if (!(got == c_before[at] || (std::isnan(got) && std::isnan(c_before[at])))) ++result.bad;
        continue;
      }
      double sum = 0.0;
      for (std::int64_t q = 0; q < d.k; ++q) {
        sum += double(d.ta ? a[q * lda + i] : a[i * lda + q]) *
               double(d.tb ? b[j * ldb + q] : b[q * ldb + j]);
      }
      const double want = alpha * sum + (d.beta == 0.0f ? 0.0 : d.beta * c_before[at]);
      if (!(std::fabs(got - want) <= 1e-4 * (1.0 + std::fabs(want)) + 1e-6 * d.k)) {
        if (result.bad < 3 && !tamper)
          std::printf("  C(%ld,%ld) = %g, expected %g\n", long(i), long(j), got, want);
        ++result.bad;
      }
    }
  }
  result.out = std::move(c_buf);
  return result;
}

int failures = 0;

// One product with one plan; a split plan also runs twice (same bits) and once
// tampered with (must fail).
void check(const char* label, const Product& d, const GemmPlan& plan, unsigned seed) {
  const Outcome first = run(d, plan, seed);
  const std::size_t launches = towerlab::simcuda::sim_grids.size();
  const unsigned grid_z = towerlab::simcuda::sim_grids.front().z;
  std::printf("%-8s %4d x %4d x %4d pad %d %c%c beta %4.1f plan %2d x %4d (%zu launch%s): %s",
              label, d.m, d.n, d.k, d.pad, d.ta ? 'T' : 'N', d.tb ? 'T' : 'N', d.beta, plan.splits,
              plan.k_per_split, launches, launches == 1 ? "" : "es", first.bad ? "FAIL" : "ok");
  int bad = first.bad != 0;
  // The plan that ran is the plan asked for: one launch unsplit, GEMM + reduction split.
  if (grid_z != unsigned(plan.splits) || launches != (plan.splits == 1 ? 1u : 2u)) {
    std::printf(" [ran %u splits in %zu launches]", grid_z, launches);
    ++bad;
  }
  if (plan.splits > 1) {
    const Outcome second = run(d, plan, seed);
    const bool same =
        std::memcmp(first.out.data(), second.out.data(), first.out.size() * sizeof(float)) == 0;
    const bool caught = d.m * d.n > 0 && run(d, plan, seed, true).bad != 0;
    std::printf(", rerun %s, tampered partial %s", same ? "same bits" : "DIFFERENT BITS",
                caught ? "caught" : "NOT CAUGHT");
    bad += !same + !caught;
  }
  std::printf("\n");
  failures += bad != 0;
}

// plan_gemm's promises, for shapes from one tile to many and both SM counts.
void check_plans() {
  int bad = 0, split = 0, total = 0;
  for (int sms : {8, 132}) {
    for (int m : {1, 64, 128, 129, 300, 1000, 3136}) {
      for (int n : {1, 10, 128, 200, 3136}) {
        for (int k : {0, 1, 7, 63, 64, 65, 128, 200, 3136, 100000}) {
          const GemmPlan p = plan_gemm(m, n, k, sms);
          const std::int64_t tiles = std::int64_t{(m + 127) / 128} * ((n + 127) / 128);
          bool ok = p.splits >= 1 && p.splits <= towerlab::simcuda::kMaxSplits;
          if (p.splits == 1) {
            ok = ok && p.k_per_split == k;
          } else {
            ok = ok && tiles < sms && p.k_per_split % 8 == 0 && p.k_per_split >= 64 &&
                 std::int64_t{p.splits} * p.k_per_split >= k &&
                 std::int64_t{p.splits - 1} * p.k_per_split < k;  // no empty split
          }
          if (tiles >= sms) ok = ok && p.splits == 1;
          if (!ok)
            std::printf("  plan %d x %d x %d on %d SMs: %d x %d\n", m, n, k, sms, p.splits,
                        p.k_per_split);
          bad += !ok, split += p.splits > 1, ++total;
        }
      }
    }
  }
  std::printf("plan_gemm invariants: %d plans (%d split), %d violations\n", total, split, bad);
  failures += bad != 0;
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows when piped to a log
  check_plans();
  std::printf("FashionNet fc1 forward on 132 SMs: %d x %d, on 8 SMs: %d x %d\n",
              plan_gemm(128, 128, 3136, 132).splits, plan_gemm(128, 128, 3136, 132).k_per_split,
              plan_gemm(128, 128, 3136, 8).splits, plan_gemm(128, 128, 3136, 8).k_per_split);
  unsigned seed = 1;
  // Odd shapes in all four layouts, planned for 8 and for 132 SMs.
  const int odd[][4] = {{1, 1, 1, 0},      {7, 13, 31, 0},    {128, 128, 8, 0},  {257, 129, 65, 0},
                        {130, 131, 67, 1}, {1, 300, 1, 0},    {200, 4, 0, 0},    {64, 256, 20, 4},
                        {129, 1, 9, 3},    {260, 132, 68, 0}, {300, 200, 36, 0}, {4, 260, 130, 0},
                        {3, 5, 150, 1}};
  for (const auto& s : odd) {
    for (int t = 0; t < 4; ++t) {
      const Product d{s[0], s[1], s[2], s[3], t / 2 == 1, t % 2 == 1, s[0] % 2 ? 0.0f : -0.5f};
      for (int sms : {8, 132}) {
        check(sms == 8 ? "odd/8" : "odd/132", d, plan_gemm(d.m, d.n, d.k, sms), ++seed);
      }
    }
  }
  // FashionNet's fc1 (y = x w^T, w [128,3136]): forward NT [B,128,3136], grad_x NN
  // [B,3136,128], grad_w TN [128,3136,B]; beta 0 forward, 1 for the gradients.
  for (int batch : {128, 64}) {
    const Product shapes[] = {{batch, 128, 3136, 0, false, true, 0.0f},
                              {batch, 3136, 128, 0, false, false, 1.0f},
                              {128, 3136, batch, 0, true, false, 1.0f}};
    for (const Product& d : shapes) {
      for (int sms : {8, 132}) {
        check(sms == 8 ? "fc1/8" : "fc1/132", d, plan_gemm(d.m, d.n, d.k, sms), ++seed);
      }
    }
  }
  // Forced plans: ragged last split, empty splits (K below the splits), K = 0.
  const struct {
    Product d;
    GemmPlan plan;
  } forced[] = {
      {{130, 70, 203, 1, false, false, 0.0f}, {4, 56}},    // last split 35 long
      {{130, 70, 203, 0, true, true, -0.5f}, {4, 56}},     //
      {{67, 129, 3, 0, false, true, 0.0f}, {5, 8}},        // splits 1-4 empty
      {{67, 129, 3, 2, true, false, 2.0f}, {5, 8}},        //
      {{33, 17, 0, 0, false, false, 0.0f}, {3, 8}},        // every split empty
      {{33, 17, 0, 0, true, false, 0.5f}, {3, 8}},         //
      {{128, 128, 3136, 0, false, true, 0.5f}, {64, 56}},  // the most splits, 8 empty
  };
  for (const auto& f : forced) check("forced", f.d, f.plan, ++seed);
  std::printf("blocks simulated: %ld, %d failing cases\n", towerlab::simcuda::sim_blocks_run,
              failures);
  return failures != 0 ? 1 : 0;
}
