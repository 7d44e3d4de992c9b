// The precision policy (parallel/precision.h, docs/precision.md).
//
// Kernels, on the CPU and cuda:0 (the emulated GPUs): conv2d's three passes and
// matmul's three layouts of a linear layer with bfloat16 operands against the
// reference in double on the bfloat16-rounded values, at odd sizes, with a control
// that the rounding is there (the unrounded reference is further off than the
// tolerance), accumulate-versus-assign sentinels and the typed errors.
//
// The trainer, on CPU towers: Fp32 (and Tf32 on the CPU) is a trainer without the
// option, bit for bit; Bf16 on 2 and 3 towers, even and uneven batches, takes one
// tower's steps to kTowerTolerance, and the fp32 run is further from it than that
// (the control); the same run repeats its bits, and a sharded master gives them
// too; a tower multiplies the master rounded to bfloat16, once per step; the flat
// gradient is float32 from the sums, not rounded; a bf16 checkpoint restores under
// fp32 (fp16: tests/loss_scale_test.cpp). On cuda:0 (the emulated GPUs in CI), tf32
// towers take one tf32 tower's steps to kTf32Tolerance, and fp32 there is further
// (the control), also on a model whose only product is a convolution (which tf32
// multiplies in TF32). With two CUDA devices, bf16 towers there take the CPU's bf16
// step.
#include <cmath>
#include <mutex>
#include <vector>

#include "cnn_model.h"
#include "conv2d_case.h"
#include "engine/half.h"
#include "file_test_util.h"
#include "kernels/cast.h"
#include "kernels/matmul.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

float round_bf16(float v) {
  return float(bfloat16(v));
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// --- kernels -------------------------------------------------------------------

class PrecisionKernelTest : public BackendTest {
 protected:
  // A float32 host vector as a bfloat16 tensor on the stream (rounded by cast()).
  Tensor bf16(const std::vector<float>& v, const Shape& shape) {
    return cast(make(v, shape), DType::BFloat16, stream());
  }
  // A float32 tensor of NaN: an output that must be assigned.
  Tensor nans(const Shape& shape) {
    return make(std::vector<float>(std::size_t(numel_of(shape)), std::nanf("")), shape);
  }
};
TL_INSTANTIATE_BACKENDS(PrecisionKernelTest);

// Every pass of conv2d with bfloat16 x, weight and grad_y against the reference on
// the rounded values, accumulating onto a sentinel (and grad_x assigned over NaN).
// The tolerance is conv2d_test.cpp's for the float32 paths (kernels/conv2d.h).
TEST_P(PrecisionKernelTest, Conv2dBf16MatchesTheReferenceOnRoundedInputs) {
  const std::vector<ConvCase> cases = {
      {"odd_3x3_pad1", 3, 5, 7, 9, 6, 3, 3, make_params(1, 1, 1, 1)},
      {"stride2_5x3", 2, 3, 11, 8, 7, 5, 3, make_params(2, 1, 2, 0)},
      {"winograd_sized", 2, 17, 6, 6, 19, 3, 3, make_params(1, 1, 1, 1)},
      {"one_channel", 5, 1, 28, 28, 4, 3, 3, make_params(1, 1, 1, 1)},
  };
  unsigned seed = 70;
  for (const ConvCase& k : cases) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), ++seed);
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), ++seed);
    const auto bv = random_values(std::size_t(k.K), ++seed);
    const auto gv = random_values(std::size_t(numel_of(ys)), ++seed);
    const Reference ref =
        reference(k, widen(rounded(xv)), widen(rounded(wv)), widen(bv), widen(rounded(gv)));
    Tensor y = nans(ys);
    conv2d_forward(y, bf16(xv, k.x_shape()), bf16(wv, k.w_shape()), make(bv, {k.K}), k.params,
                   stream());
    EXPECT_TRUE(all_close(host(y), narrow(ref.y), 1e-4, 1e-4)) << "y";
    // Control: the reference on the unrounded inputs is further off than that.
    const Reference exact = reference(k, widen(xv), widen(wv), widen(bv), widen(gv));
    EXPECT_FALSE(all_close(host(y), narrow(exact.y), 1e-4, 1e-4)) << "the inputs were not rounded";

    const std::vector<float> sentinel_w(wv.size(), 0.5f), sentinel_b(bv.size(), -0.25f);
    Tensor grad_w = make(sentinel_w, k.w_shape()), grad_b = make(sentinel_b, {k.K});
    Tensor grad_x = nans(k.x_shape());
    conv2d_backward(grad_x, grad_w, grad_b, bf16(gv, ys), bf16(xv, k.x_shape()),
                    bf16(wv, k.w_shape()), k.params, stream(), GradWrite::Assign);
    EXPECT_TRUE(all_close(host(grad_x), narrow(ref.grad_x), 1e-4, 1e-4)) << "grad_x (assigned)";
    EXPECT_TRUE(all_close(host(grad_w), plus(sentinel_w, ref.grad_w), 2e-4, 1e-4)) << "grad_w";
    EXPECT_TRUE(all_close(host(grad_b), plus(sentinel_b, ref.grad_b), 2e-4, 1e-4)) << "grad_b";
  }
}

// The three products of a linear layer (kernels/matmul.h) with bfloat16 operands and
// a float32 c, within E = 2 (K + 2) 2^-24 (S + |beta c0|) of the reference on the
// rounded values; beta = 1 over a sentinel. On CUDA this is the tensor-core GEMM.
TEST_P(PrecisionKernelTest, MatmulBf16WithinTheHeadersBound) {
  const std::int64_t m = 13, n = 7, k = 29;
  struct Layout {
    bool ta, tb;
  };
  unsigned seed = 90;
  for (const Layout l : {Layout{false, false}, Layout{false, true}, Layout{true, false}}) {
    SCOPED_TRACE(std::string(l.ta ? "T" : "N") + (l.tb ? "T" : "N"));
    const auto av = rounded(random_values(std::size_t(m * k), ++seed));
    const auto bv = rounded(random_values(std::size_t(k * n), ++seed));
    const std::vector<float> c0(std::size_t(m * n), 0.75f);
    Tensor c = make(c0, {m, n});
    matmul(c, bf16(av, l.ta ? Shape{k, m} : Shape{m, k}),
           bf16(bv, l.tb ? Shape{n, k} : Shape{k, n}), l.ta, l.tb, 1.0f, 1.0f, stream());
    const auto got = host(c);
    int checked = 0;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = c0[std::size_t(i * n + j)], s = std::fabs(sum);
        for (std::int64_t p = 0; p < k; ++p) {
          const double a = av[std::size_t(l.ta ? p * m + i : i * k + p)];
          const double b = bv[std::size_t(l.tb ? j * k + p : p * n + j)];
          sum += a * b;
          s += std::fabs(a * b);
        }
        const double bound = 2.0 * double(k + 2) * std::ldexp(1.0, -24) * s;
        EXPECT_LE(std::fabs(got[std::size_t(i * n + j)] - sum), bound) << i << "," << j;
        ++checked;
      }
    }
    EXPECT_EQ(checked, m * n);
  }
}

TEST_P(PrecisionKernelTest, MixedOperandsAreRefused) {
  Tensor x16 = bf16(random_values(2 * 3 * 5 * 5, 1), {2, 3, 5, 5});
  Tensor w32 = make(random_values(4 * 3 * 3 * 3, 2), {4, 3, 3, 3});
  Tensor y = Tensor::empty({2, 4, 3, 3}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y, x16, w32, Tensor(), {}, stream()), NotSupported,
                    "conv2d_forward: weight is float32[4,3,3,3] but x is bfloat16[2,3,5,5]");
  // y is float32 or the operands' dtype (tests/conv2d_sixteen_bit_output_test.cpp).
  Tensor w16 = cast(w32, DType::BFloat16, stream());
  Tensor y16 = Tensor::empty({2, 4, 3, 3}, stream(), DType::Float16);
  EXPECT_THROW_WITH(conv2d_forward(y16, x16, w16, Tensor(), {}, stream()), NotSupported,
                    "conv2d_forward: y is float16[2,4,3,3] but with bfloat16 operands y is "
                    "float32 or bfloat16");
}

// --- the trainer ---------------------------------------------------------------

// How far N bf16 towers may be from one bf16 tower after three SGD steps at rate
// 0.1, for every variable (absolute, in the variables' units, around 0.1-1): the
// towers' float32 sums differ in order, which can move a value across a bfloat16
// rounding boundary (one bfloat16 ulp, 2^-8 relative, of one activation or output
// gradient element); each such flip moves a weight by about lr * 2^-8 * |x gy|,
// some 1e-5 here. These batches happen to flip none (the towers then differ by
// float32 order alone, near 1e-7), and fp32 is about 1e-3 from bf16 (the control).
constexpr double kTowerTolerance = 1e-4;

// A tower of `net` classifying small_image_batch's images.
TowerFn classifier(const Sequential& net) {
  return [&net](const Tower& tower, const std::vector<Tensor>& batch) {
    Var logits = net(tower.context(), tower.input(batch[0], "images"));
    return TowerResult{
        ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels")), {logits}, {}};
  };
}

struct Model : CnnModel {
  TowerFn tower_fn() const { return classifier(net); }
};

// A classifier whose only product is a convolution: an 8x8 kernel over the whole
// [N,1,8,8] image gives the 3 logits ([N,3,1,1], flattened).
struct ConvOnlyModel {
  VariableSet vars;
  Sequential net;
  ConvOnlyModel() {
    net.add<Conv2d>(vars, "conv", 1, 3, 8);
    net.add<Flatten>();
  }
  TowerFn tower_fn() const { return classifier(net); }
};

TrainerOptions towers(int n, Precision precision, Device device = Device::cpu()) {
  TrainerOptions o;
  o.devices.assign(std::size_t(n), device);
  o.seed = 5;
  o.precision = precision;
  return o;
}

// The master's values after three SGD steps on batches of `batch` samples.
template <class M>
std::vector<float> three_steps(const M& model, const TrainerOptions& options, std::int64_t batch) {
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1), options);
  for (unsigned s = 0; s < 3; ++s) trainer.step(small_image_batch(batch, 40 + s, 7));
  return trainer.master().flat_values().to_host<float>();
}

TEST(Precision, Fp32IsATrainerWithoutTheOptionBitForBit) {
  const Model model;
  TrainerOptions plain;
  plain.devices = {Device::cpu(), Device::cpu()};
  plain.seed = 5;
  const auto expected = three_steps(model, plain, 7);
  EXPECT_EQ(three_steps(model, towers(2, Precision::Fp32), 7), expected);
  // The CPU has no TF32 arithmetic: tf32 there is float32.
  EXPECT_EQ(three_steps(model, towers(2, Precision::Tf32), 7), expected);
}

TEST(Precision, Bf16TowersTakeOneTowersStepsToTheRoundingsTolerance) {
  const Model model;
  for (std::int64_t batch : {7, 8}) {
    const auto one = three_steps(model, towers(1, Precision::Bf16), batch);
    for (int n : {2, 3}) {
      EXPECT_LE(max_difference(three_steps(model, towers(n, Precision::Bf16), batch), one),
                kTowerTolerance)
          << n << " towers, batch " << batch;
    }
    // Control: float32 is further from bf16 than five tolerances, so a tower that
    // multiplied unrounded values would fail the comparison above.
    EXPECT_GT(max_difference(three_steps(model, towers(1, Precision::Fp32), batch), one),
              5 * kTowerTolerance)
        << "batch " << batch;
  }
}

TEST(Precision, Bf16RepeatsItsBits) {
  const Model model;
  EXPECT_EQ(three_steps(model, towers(3, Precision::Bf16), 7),
            three_steps(model, towers(3, Precision::Bf16), 7));
}

// A sharded master (docs/master_placement.md) gives the bits of one master under
// bf16 too: the replicas' float32 values are the same, and so their rounding.
TEST(Precision, Bf16WithAShardedMasterGivesTheOneMastersBits) {
  const Model model;
  TrainerOptions sharded = towers(3, Precision::Bf16);
  sharded.master_placement = MasterPlacement::Sharded;
  EXPECT_EQ(three_steps(model, sharded, 7), three_steps(model, towers(3, Precision::Bf16), 7));
}

// What a tower multiplies is the master rounded to bfloat16 (the values before the
// step's update), rounded once: the Var's working copy is the replica's, and the
// replica's float32 values stay the master's.
TEST(Precision, TowersMultiplyTheMasterRoundedOncePerStep) {
  const Model model;
  std::mutex mutex;
  std::vector<std::vector<float>> seen(2);
  std::vector<DType> compute(2, DType::Float64);
  TowerFn fn = [&](const Tower& tower, const std::vector<Tensor>& batch) {
    const Context ctx = tower.context();
    const Var w = ctx.variable("conv1/weight");
    {
      std::lock_guard lock(mutex);
      seen[std::size_t(tower.index)] =
          cast(w.working(), DType::Float32, tower.stream).to_host<float>(tower.stream);
      compute[std::size_t(tower.index)] = ctx.compute_dtype();
      EXPECT_EQ(w.working().raw_data(), tower.variables.working("conv1/weight").raw_data());
    }
    return model.tower_fn()(tower, batch);
  };
  Trainer trainer(model.vars, fn, Optimizer::by_name("sgd", 0.1), towers(2, Precision::Bf16));
  for (unsigned s = 0; s < 2; ++s) {
    const auto master = trainer.master().value("conv1/weight").to_host<float>();
    trainer.step(small_image_batch(6, 60 + s, 7));
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(compute[i], DType::BFloat16);
      EXPECT_EQ(seen[i], rounded(master)) << "tower " << i << ", step " << s;
      EXPECT_NE(seen[i], master) << "control: rounding changes some weight";
      EXPECT_EQ(trainer.replica(i).flat_values().to_host<float>(),
                trainer.master().flat_values().to_host<float>());
    }
  }
}

// The flat gradient holds the GEMMs' float32 sums: not bfloat16-rounded values.
TEST(Precision, Bf16GradientsReachTheFlatBufferInFloat32) {
  const Model model;
  Trainer trainer(model.vars, model.tower_fn(), Optimizer::by_name("sgd", 0.1),
                  towers(2, Precision::Bf16));
  trainer.step(small_image_batch(8, 70, 7));
  const auto grads = trainer.gradients().to_host<float>();
  std::size_t not_bf16 = 0;
  for (float g : grads) not_bf16 += round_bf16(g) != g ? 1 : 0;
  EXPECT_GT(not_bf16, grads.size() / 2) << "of " << grads.size() << " gradient elements";
}

TEST(Precision, ABf16CheckpointRestoresUnderFp32) {
  const Model model;
  ScratchDir dir;
  Trainer bf16(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
               towers(2, Precision::Bf16));
  for (unsigned s = 0; s < 2; ++s) bf16.step(small_image_batch(7, 80 + s, 7));
  bf16.save_state(dir.file("state.safetensors"));
  Trainer fp32(model.vars, model.tower_fn(), Optimizer::by_name("adam", 1e-2),
               towers(1, Precision::Fp32));
  fp32.restore_state(dir.file("state.safetensors"));
  EXPECT_EQ(fp32.master().flat_values().to_host<float>(),
            bf16.master().flat_values().to_host<float>());
  EXPECT_EQ(fp32.optimizer().steps(), 2);
  const double loss = fp32.step(small_image_batch(7, 82, 7)).loss;
  EXPECT_TRUE(std::isfinite(loss));
}

// How far N tf32 towers on cuda:0 may be from one tf32 tower there, as
// kTowerTolerance: the towers' float32 sums differ in order (conv2d's weight
// gradient, the ring), which can move a value of a convolution's or the linear
// layer's operands across a TF32 rounding boundary; TF32 keeps float16's 10 mantissa bits, so the
// bound is fp16's (kTowerTolerance scaled by 2^-11 / 2^-8).
constexpr double kTf32Tolerance = 1.25e-5;

TEST(Precision, Tf32CudaTowersTakeOneDevicesStepsToTheRoundingsTolerance) {
  skip_without_cuda_device();
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  const Model model;
  const Device gpu = Device::cuda(0);
  for (std::int64_t batch : {7, 8}) {
    const auto one = three_steps(model, towers(1, Precision::Tf32, gpu), batch);
    for (int n : {2, 3}) {
      EXPECT_LE(max_difference(three_steps(model, towers(n, Precision::Tf32, gpu), batch), one),
                kTf32Tolerance)
          << n << " towers, batch " << batch;
    }
    // Control: fp32 on the same device is further than four tolerances, so a tower
    // whose linear layer multiplied float32 would fail the comparison above.
    EXPECT_GT(max_difference(three_steps(model, towers(1, Precision::Fp32, gpu), batch), one),
              4 * kTf32Tolerance)
        << "batch " << batch;
  }
}

// A tf32 tower's convolutions multiply in TF32 (ag::conv2d passes the tape's
// Float32Math): on a model whose only product is a convolution, one tf32 tower on
// cuda:0 is further than two tolerances from fp32 there (so a tower whose
// convolution ran in float32 would fail the comparison), and N tf32 towers still
// take its steps to kTf32Tolerance.
TEST(Precision, Tf32CudaTowersConvolveInTf32) {
  skip_without_cuda_device();
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  const ConvOnlyModel model;
  const Device gpu = Device::cuda(0);
  for (std::int64_t batch : {7, 8}) {
    const auto one = three_steps(model, towers(1, Precision::Tf32, gpu), batch);
    EXPECT_GT(max_difference(three_steps(model, towers(1, Precision::Fp32, gpu), batch), one),
              2 * kTf32Tolerance)
        << "batch " << batch;
    for (int n : {2, 3}) {
      EXPECT_LE(max_difference(three_steps(model, towers(n, Precision::Tf32, gpu), batch), one),
                kTf32Tolerance)
          << n << " towers, batch " << batch;
    }
  }
}

TEST(Precision, Bf16OnTwoGpusTakesTheCpusSteps) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Model model;
  TrainerOptions gpus = towers(1, Precision::Bf16);
  gpus.devices = {Device::cuda(0), Device::cuda(1)};
  EXPECT_LE(max_difference(three_steps(model, gpus, 7),
                           three_steps(model, towers(1, Precision::Bf16), 7)),
            kTowerTolerance);
}

}  // namespace
}  // namespace towerlab::testing
