// Optimizer updates (kernels/optimizer.h) on every backend: steps worked out by
// hand, several steps against a plain double-precision loop written here from the
// formulas of PyTorch and TensorFlow, odd sizes and unaligned views (the CUDA
// kernel's scalar path), Adam's rounded copy, and the argument errors.
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "cpu_isa.h"
#include "kernels/cast.h"
#include "kernels/optimizer.h"
#include "kernels/reference/optimizer.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

using Values = std::vector<double>;

class OptimizerTest : public BackendTest {
 protected:
  Tensor make_from(const Values& v) {
    std::vector<float> f(v.begin(), v.end());
    return make(f, {static_cast<std::int64_t>(f.size())});
  }
  // A view of n elements starting one element into a larger buffer: not 16-byte
  // aligned, so CUDA takes its scalar path.
  Tensor unaligned(const Values& v) {
    std::vector<float> f(v.size() + 1, 0.0f);
    std::copy(v.begin(), v.end(), f.begin() + 1);
    return make(f, {static_cast<std::int64_t>(f.size())})
        .view(1, {static_cast<std::int64_t>(v.size())});
  }
  std::vector<float> floats(const Values& v) { return {v.begin(), v.end()}; }
};
TL_INSTANTIATE_BACKENDS(OptimizerTest);

// The references (kernels/reference/optimizer.h): one element at a time, in double,
// straight from the formulas.
void sgd_reference(Values& p, const Values& g, Values& v, const SgdParams& h) {
  reference::sgd_update(p.data(), g.data(), v.data(), std::int64_t(p.size()), h);
}

void rmsprop_reference(Values& p, const Values& g, Values& ms, Values& mom, Values& mg,
                       const RmspropParams& h) {
  reference::rmsprop_update(p.data(), g.data(), ms.data(), mom.data(), mg.data(),
                            std::int64_t(p.size()), h);
}

void adam_reference(Values& p, const Values& grad, Values& m, Values& v, int t, const AdamParams& h,
                    bool decoupled) {
  const auto update = decoupled ? reference::adamw_update : reference::adam_update;
  update(p.data(), grad.data(), m.data(), v.data(), std::int64_t(p.size()), t, h);
}

Values random_doubles(std::size_t n, unsigned seed, float low = -1, float high = 1) {
  auto f = random_values(n, seed, low, high);
  return {f.begin(), f.end()};
}

// --- steps by hand ------------------------------------------------------------

TEST_P(OptimizerTest, SgdStepsByHand) {
  Tensor p = make({1.0f, -2.0f}, {2}), g = make({0.5f, 0.25f}, {2});
  SgdParams h{.lr = 0.1};
  sgd_update(p, g, Tensor(), h, stream());
  EXPECT_TRUE(all_close(host(p), {0.95f, -2.025f}));
  sgd_update(p, g, Tensor(), h, stream());
  EXPECT_TRUE(all_close(host(p), {0.9f, -2.05f}));
  // Weight decay 0.5: d = g + 0.5 p = {0.95, -0.775}.
  sgd_update(p, g, Tensor(), {.lr = 0.1, .weight_decay = 0.5}, stream());
  EXPECT_TRUE(all_close(host(p), {0.805f, -1.9725f}));
}

TEST_P(OptimizerTest, SgdMomentumAndNesterovByHand) {
  // g = 1, lr 0.1, momentum 0.9: v = 1, 1.9, 2.71 and p = 0.9, 0.71, 0.439.
  Tensor p = make({1.0f}, {1}), g = make({1.0f}, {1}), v = make({0.0f}, {1});
  const SgdParams h{.lr = 0.1, .momentum = 0.9};
  for (float expected : {0.9f, 0.71f, 0.439f}) {
    sgd_update(p, g, v, h, stream());
    EXPECT_NEAR(host(p)[0], expected, 1e-6);
  }
  EXPECT_NEAR(host(v)[0], 2.71f, 1e-6);
  // Nesterov: p -= 0.1 * (1 + 0.9 v) with v = 1, then 1.9: p = 0.81, 0.539.
  Tensor q = make({1.0f}, {1}), w = make({0.0f}, {1});
  SgdParams n = h;
  n.nesterov = true;
  for (float expected : {0.81f, 0.539f}) {
    sgd_update(q, g, w, n, stream());
    EXPECT_NEAR(host(q)[0], expected, 1e-6);
  }
}

// TensorFlow starts ms at 1. g = 2, lr 0.01, decay 0.9, momentum 0.5:
//   ms = 1.3,  mom = 0.02 / sqrt(1.3) = 0.01754116,  p = 0.98245884
//   ms = 1.57, mom = 0.5 * 0.01754116 + 0.02 / sqrt(1.57) = 0.02473232,  p = 0.95772652
TEST_P(OptimizerTest, RmspropStepsByHand) {
  Tensor p = make({1.0f}, {1}), g = make({2.0f}, {1});
  Tensor ms = make({1.0f}, {1}), mom = make({0.0f}, {1});
  const RmspropParams h{.lr = 0.01, .decay = 0.9, .momentum = 0.5};
  rmsprop_update(p, g, ms, mom, Tensor(), h, stream());
  EXPECT_NEAR(host(ms)[0], 1.3f, 1e-6);
  EXPECT_NEAR(host(mom)[0], 0.01754116f, 1e-7);
  EXPECT_NEAR(host(p)[0], 0.98245884f, 1e-6);
  rmsprop_update(p, g, ms, mom, Tensor(), h, stream());
  EXPECT_NEAR(host(mom)[0], 0.02473232f, 1e-7);
  EXPECT_NEAR(host(p)[0], 0.95772652f, 1e-6);
}

// With bias correction the first steps of Adam move each parameter by lr against
// the sign of a constant gradient: m_hat = g and v_hat = g^2 at every step.
TEST_P(OptimizerTest, AdamStepsByHand) {
  Tensor p = make({1.0f, -1.0f}, {2}), g = make({0.5f, -2.0f}, {2});
  Tensor m = Tensor::zeros({2}, stream()), v = Tensor::zeros({2}, stream());
  const AdamParams h{.lr = 0.1};
  adam_update(p, g, m, v, 1, h, stream());
  EXPECT_TRUE(all_close(host(p), {0.9f, -0.9f}));
  EXPECT_TRUE(all_close(host(m), {0.05f, -0.2f}));
  EXPECT_TRUE(all_close(host(v), {0.00025f, 0.004f}));
  adam_update(p, g, m, v, 2, h, stream());
  EXPECT_TRUE(all_close(host(p), {0.8f, -0.8f}));
  // AdamW with weight decay 0.5 first scales p by 1 - 0.1 * 0.5 = 0.95.
  adamw_update(p, g, m, v, 3, {.lr = 0.1, .weight_decay = 0.5}, stream());
  EXPECT_TRUE(all_close(host(p), {0.8f * 0.95f - 0.1f, -0.8f * 0.95f + 0.1f}));
}

// --- several steps against the double reference, odd sizes, unaligned views ----

TEST_P(OptimizerTest, SgdMatchesReference) {
  for (std::size_t n : {1, 5, 1027, 430000}) {
    for (bool nesterov : {false, true}) {
      for (bool aligned : {true, false}) {
        const SgdParams h{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov};
        Values p = random_doubles(n, 1), v(n, 0.0);
        Tensor tp = aligned ? make_from(p) : unaligned(p);
        Tensor tv = aligned ? make_from(v) : unaligned(v);
        for (unsigned step = 0; step < 3; ++step) {
          Values g = random_doubles(n, 10 + step);
          sgd_update(tp, make_from(g), tv, h, stream());
          sgd_reference(p, g, v, h);
        }
        EXPECT_TRUE(all_close(host(tp), floats(p), 1e-6, 1e-5))
            << "n = " << n << " nesterov " << nesterov << " aligned " << aligned;
        EXPECT_TRUE(all_close(host(tv), floats(v), 1e-6, 1e-5)) << "n = " << n;
      }
    }
  }
}

TEST_P(OptimizerTest, RmspropMatchesReference) {
  for (std::size_t n : {1, 5, 1027, 430000}) {
    for (bool centered : {false, true}) {
      for (bool aligned : {true, false}) {
        const RmspropParams h{
            .lr = 0.01, .decay = 0.9, .momentum = 0.9, .epsilon = 1e-6, .centered = centered};
        Values p = random_doubles(n, 2), ms(n, 1.0), mom(n, 0.0), mg(n, 0.0);
        auto put = [&](const Values& x) { return aligned ? make_from(x) : unaligned(x); };
        Tensor tp = put(p), tms = put(ms), tmom = put(mom);
        Tensor tmg = centered ? put(mg) : Tensor();
        for (unsigned step = 0; step < 3; ++step) {
          Values g = random_doubles(n, 20 + step);
          rmsprop_update(tp, make_from(g), tms, tmom, tmg, h, stream());
          rmsprop_reference(p, g, ms, mom, mg, h);
        }
        const std::string what = "n = " + std::to_string(n) + " centered " +
                                 std::to_string(centered) + " aligned " + std::to_string(aligned);
        EXPECT_TRUE(all_close(host(tp), floats(p), 1e-6, 1e-5)) << what;
        EXPECT_TRUE(all_close(host(tms), floats(ms), 1e-6, 1e-5)) << what;
        EXPECT_TRUE(all_close(host(tmom), floats(mom), 1e-6, 1e-4)) << what;
        if (centered) EXPECT_TRUE(all_close(host(tmg), floats(mg), 1e-6, 1e-5)) << what;
      }
    }
  }
}

TEST_P(OptimizerTest, AdamAndAdamWMatchReference) {
  for (std::size_t n : {1, 5, 1027, 430000}) {
    for (bool decoupled : {false, true}) {
      for (bool aligned : {true, false}) {
        const AdamParams h{.lr = 0.01, .weight_decay = 0.1};
        Values p = random_doubles(n, 3), m(n, 0.0), v(n, 0.0);
        auto put = [&](const Values& x) { return aligned ? make_from(x) : unaligned(x); };
        Tensor tp = put(p), tm = put(m), tv = put(v);
        for (int t = 1; t <= 3; ++t) {
          Values g = random_doubles(n, 30 + t);
          if (decoupled) {
            adamw_update(tp, make_from(g), tm, tv, t, h, stream());
          } else {
            adam_update(tp, make_from(g), tm, tv, t, h, stream());
          }
          adam_reference(p, g, m, v, t, h, decoupled);
        }
        const std::string what = "n = " + std::to_string(n) + " decoupled " +
                                 std::to_string(decoupled) + " aligned " + std::to_string(aligned);
        EXPECT_TRUE(all_close(host(tp), floats(p), 1e-6, 1e-5)) << what;
        EXPECT_TRUE(all_close(host(tm), floats(m), 1e-6, 1e-5)) << what;
        EXPECT_TRUE(all_close(host(tv), floats(v), 1e-9, 1e-5)) << what;
      }
    }
  }
}

// Adam and AdamW with a rounded copy (a mixed-precision working copy): p, m and v
// as without it, and the copy the cast of the updated p, bit for bit, in bfloat16
// and float16, on every CPU ISA (the CPU rounds block by block inside the update:
// lengths around its 1024-value blocks and the threads' split) and on CUDA (a cast
// after the kernel). Control: a copy that was not written holds its sentinel.
TEST_P(OptimizerTest, AdamsRoundedCopyIsTheCastOfTheUpdatedValues) {
  // A 16-bit tensor's bit patterns.
  auto bits = [&](const Tensor& t) {
    std::vector<std::uint16_t> out(std::size_t(t.numel()));
    if (t.dtype() == DType::BFloat16) {
      const std::vector<bfloat16> v = t.to_host<bfloat16>(stream());
      std::memcpy(out.data(), v.data(), out.size() * 2);
    } else {
      const std::vector<float16> v = t.to_host<float16>(stream());
      std::memcpy(out.data(), v.data(), out.size() * 2);
    }
    return out;
  };
  for_each_cpu_isa(device(), [&](const std::string& where) {
    for (std::int64_t n : {std::int64_t(3), std::int64_t(1024), std::int64_t(40013)}) {
      for (DType half : {DType::BFloat16, DType::Float16}) {
        for (bool decoupled : {false, true}) {
          SCOPED_TRACE(where + ", n = " + std::to_string(n) + ", " + dtype_name(half) +
                       (decoupled ? ", AdamW" : ", Adam"));
          const Shape shape{n};
          const AdamParams h{.lr = 0.01, .weight_decay = 0.1};
          const std::vector<float> p0 = random_values(std::size_t(n), 61);
          Tensor p = make(p0, shape), m = Tensor::zeros(shape, stream());
          Tensor v = Tensor::zeros(shape, stream());
          Tensor q = make(p0, shape), qm = Tensor::zeros(shape, stream());
          Tensor qv = Tensor::zeros(shape, stream());
          Tensor rounded =
              cast(make(std::vector<float>(std::size_t(n), 7.0f), shape), half, stream());
          const auto update = decoupled ? adamw_update : adam_update;
          for (int t = 1; t <= 2; ++t) {
            const Tensor g = make(random_values(std::size_t(n), 62 + t), shape);
            update(p, g, m, v, t, h, stream(), rounded);
            update(q, g, qm, qv, t, h, stream(), Tensor());
          }
          EXPECT_EQ(host(p), host(q));
          EXPECT_EQ(host(m), host(qm));
          EXPECT_EQ(host(v), host(qv));
          const Tensor want = cast(q, half, stream());
          EXPECT_EQ(bits(rounded), bits(want));
          const Tensor unwritten =
              cast(make(std::vector<float>(std::size_t(n), 7.0f), shape), half, stream());
          EXPECT_NE(bits(unwritten), bits(want)) << "control";
        }
      }
    }
  });
}

TEST_P(OptimizerTest, EmptyBuffersAreANoOp) {
  Tensor e = Tensor::zeros({0}, stream());
  Tensor e2 = Tensor::zeros({0}, stream()), e3 = Tensor::zeros({0}, stream());
  sgd_update(e, e2, e3, {.momentum = 0.9}, stream());
  rmsprop_update(e, e2, e3, Tensor::zeros({0}, stream()), Tensor(), {}, stream());
  adam_update(e, e2, e3, Tensor::zeros({0}, stream()), 1, {}, stream());
}

TEST_P(OptimizerTest, RejectsBadArguments) {
  Tensor p = Tensor::zeros({4}, stream()), g = Tensor::zeros({4}, stream());
  Tensor s1 = Tensor::zeros({4}, stream()), s2 = Tensor::zeros({4}, stream());
  EXPECT_THROW_WITH(sgd_update(p, Tensor::zeros({3}, stream()), Tensor(), {}, stream()), ShapeError,
                    "sgd_update: grad is float32[3]");
  EXPECT_THROW_WITH(sgd_update(p, g, Tensor(), {.momentum = 0.9}, stream()), InvalidArgument,
                    "sgd_update: momentum 0.9 needs a velocity buffer of param's shape");
  EXPECT_THROW_WITH(sgd_update(p, g, s1, {.nesterov = true}, stream()), InvalidArgument,
                    "sgd_update: nesterov needs a momentum > 0, got momentum 0");
  EXPECT_THROW_WITH(sgd_update(p, g, s1, {.lr = -1}, stream()), InvalidArgument,
                    "sgd_update: lr must be a finite value >= 0, got -1");
  EXPECT_THROW_WITH(sgd_update(p, g, p, {.momentum = 0.9}, stream()), InvalidArgument,
                    "sgd_update: param and velocity overlap in memory");
  // Two views of one buffer that share elements 2..3.
  Tensor flat = Tensor::zeros({6}, stream());
  EXPECT_THROW_WITH(sgd_update(flat.view(0, {4}), flat.view(2, {4}), Tensor(), {}, stream()),
                    InvalidArgument, "sgd_update: param and grad overlap in memory");
  sgd_update(flat.view(0, {3}), flat.view(3, {3}), Tensor(), {}, stream());  // disjoint: fine
  EXPECT_THROW_WITH(rmsprop_update(p, g, s1, s2, Tensor(), {.centered = true}, stream()),
                    InvalidArgument, "rmsprop_update: centered RMSProp needs a mean_grad buffer");
  EXPECT_THROW_WITH(rmsprop_update(p, g, s1, s2, Tensor(), {.decay = 1.5}, stream()),
                    InvalidArgument, "rmsprop_update: decay must be in [0, 1], got 1.5");
  EXPECT_THROW_WITH(
      adam_update(p, g, s1, s2, 0, {}, stream()), InvalidArgument,
      "adam_update: step is the 1-based count of this update (1 on the first), got 0");
  EXPECT_THROW_WITH(adamw_update(p, g, s1, s2, 1, {.beta2 = 1.0}, stream()), InvalidArgument,
                    "adamw_update: beta2 must be in [0, 1), got 1");
  EXPECT_THROW_WITH(adam_update(p, g, s1, Tensor::zeros({2, 2}, stream()), 1, {}, stream()),
                    ShapeError, "adam_update: v is float32[2,2]");
  EXPECT_THROW_WITH(adam_update(p, g, s1, s2, 1, {}, stream(), Tensor::zeros({4}, stream())),
                    InvalidArgument,
                    "adam_update: a rounded copy is a bfloat16 or float16 copy of float32 values");
  EXPECT_THROW_WITH(
      adamw_update(p, g, s1, s2, 1, {}, stream(), Tensor::zeros({3}, stream(), DType::BFloat16)),
      ShapeError, "adamw_update: rounded is bfloat16[3]");
}

// float64 on the CPU follows the reference to rounding: the formulas are the same.
TEST(OptimizerFloat64, AdamMatchesReferenceToRounding) {
  const Stream& cpu = default_stream(Device::cpu());
  const std::size_t n = 101;
  const AdamParams h{.lr = 0.01, .weight_decay = 0.1};
  Values p = random_doubles(n, 4), m(n, 0.0), v(n, 0.0);
  const Shape shape{static_cast<std::int64_t>(n)};
  Tensor tp = Tensor::from_host<double>(p, shape, cpu);
  Tensor tm = Tensor::zeros(shape, cpu, DType::Float64),
         tv = Tensor::zeros(shape, cpu, DType::Float64);
  for (int t = 1; t <= 5; ++t) {
    Values g = random_doubles(n, 40 + t);
    adam_update(tp, Tensor::from_host<double>(g, shape, cpu), tm, tv, t, h, cpu);
    adam_reference(p, g, m, v, t, h, false);
  }
  const Values got = tp.to_host<double>(cpu);
  for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], p[i], 1e-14) << i;
}

// The Optimizer makes its slots in the store's dtype, so Adam runs on a float64
// store, and a checkpoint's float32 slots restore into one.
TEST(OptimizerFloat64, AdamOnAFloat64StoreKeepsItsSlotsInFloat64) {
  const Stream& cpu = default_stream(Device::cpu());
  VariableSet set;
  set.get("w", {5}, Initializer::constant(0.5f));
  VariableStore store(set, cpu, true, DType::Float64);
  store.initialize(1, cpu);
  const Values g{0.3, -0.02, 4.0, -1e-3, 0.0};
  Optimizer adam = Optimizer::adam({}, LearningRate::constant(0.01));
  adam.step(store, Tensor::from_host<double>(g, {5}, cpu), cpu);
  ASSERT_EQ(adam.slots().size(), 2u);
  for (const auto& [name, slot] : adam.slots()) EXPECT_EQ(slot.dtype(), DType::Float64) << name;
  // Adam's first step is p -= lr * g / (|g| + epsilon). The tolerance is far below
  // float32's rounding (3e-8 here): float32 arithmetic anywhere would fail it.
  const Values p = store.flat_values().to_host<double>(cpu);
  for (std::size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(p[i], 0.5 - 0.01 * g[i] / (std::abs(g[i]) + 1e-8), 1e-15) << i;

  std::map<std::string, Tensor> float32_slots;
  for (const auto& [name, slot] : adam.slots()) float32_slots[name] = slot.to(DType::Float32, cpu);
  Optimizer restored = Optimizer::adam({}, LearningRate::constant(0.01));
  restored.restore(float32_slots, adam.steps(), store, cpu);
  EXPECT_EQ(restored.slots().at("m").dtype(), DType::Float64);
  EXPECT_EQ(restored.slots().at("m").to_host<double>(cpu)[0],
            double(float(adam.slots().at("m").to_host<double>(cpu)[0])));
  EXPECT_NO_THROW(restored.step(store, Tensor::from_host<double>(g, {5}, cpu), cpu));
}

// The CPU's float32 Adam runs four, eight or sixteen lanes at a time (baseline,
// AVX2, AVX-512): the same IEEE operations in the same order, so the same bits on
// every ISA this CPU has, for Adam and AdamW, over several steps, with a length
// that leaves a tail and splits over threads.
TEST(OptimizerAdam, EveryIsaGivesTheSameBits) {
  const RestoreGemmIsa restore;
  const Stream& cpu = default_stream(Device::cpu());
  const std::int64_t n = 40013;
  const Shape shape{n};
  // p, then m and v, after three steps of Adam (decoupled: AdamW) on `isa`.
  auto run = [&](GemmIsa isa, bool decoupled, float nudge) {
    set_gemm_isa(isa);
    std::vector<float> p0 = random_values(std::size_t(n), 51);
    p0.back() *= nudge;
    Tensor p = Tensor::from_host<float>(p0, shape, cpu);
    Tensor m = Tensor::zeros(shape, cpu), v = Tensor::zeros(shape, cpu);
    const AdamParams h{.lr = 0.01, .weight_decay = 0.1};
    for (int t = 1; t <= 3; ++t) {
      const Tensor g = Tensor::from_host<float>(random_values(std::size_t(n), 52 + t), shape, cpu);
      if (decoupled) {
        adamw_update(p, g, m, v, t, h, cpu);
      } else {
        adam_update(p, g, m, v, t, h, cpu);
      }
    }
    std::vector<float> all = p.to_host<float>(cpu);
    for (const Tensor* slot : {&m, &v}) {
      const std::vector<float> s = slot->to_host<float>(cpu);
      all.insert(all.end(), s.begin(), s.end());
    }
    return all;
  };
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    const std::vector<float> baseline = run(GemmIsa::Portable, decoupled, 1.0f);
    for (const GemmIsa isa : {GemmIsa::Avx2, GemmIsa::Avx512}) {
      if (!gemm_isa_supported(isa)) continue;
      EXPECT_TRUE(same_bits(run(isa, decoupled, 1.0f), baseline)) << int(isa);
    }
    // Control: the last parameter 0.1% off changes the bits the comparison sees.
    EXPECT_FALSE(same_bits(run(GemmIsa::Portable, decoupled, 1.001f), baseline)) << "control";
  }
}

}  // namespace
}  // namespace towerlab::testing
