// The working dtype between ops on a 16-bit tape (autograd/mixed_precision.h,
// docs/precision.md), on {cpu, cuda:0} x {bfloat16, float16}:
// - the GEMM-class ops write their float32 sums rounded once to the working dtype
//   (the control: some of those sums are not 16-bit values, so the rounding is there);
// - ReLU, bias add (+ ReLU) and the activations keep it, and their gradients are
//   float32 and those of the float32 op on the widened values, bit for bit;
// - a residual's add_relu on two 16-bit operands runs its 16-bit kernel: y the float32
//   op's rounded once, the float32 op's gradients, bit for bit;
// - pooling and batch norm run their 16-bit forward kernels (one record, nothing
//   widened around them) and their float32 backwards: the float32 op's gradients, bit
//   for bit;
// - the fallback: add, dropout and layer norm on a 16-bit input give the float32 op
//   on the widened input, rounded once, and its gradients, bit for bit; softmax, the
//   sum and the loss give the float32 op's float32 output;
// - a trainer's bf16 towers carry bfloat16 logits and still return float32 outputs.
#include <functional>
#include <mutex>
#include <tuple>
#include <vector>

#include "autograd/mixed_precision.h"
#include "cnn_model.h"
#include "kernels/bias.h"
#include "kernels/cast.h"
#include "kernels/conv2d.h"
#include "kernels/matmul.h"
#include "parallel/sync_batchnorm.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class MixedPrecisionTest : public SixteenBitTest {
 protected:
  // A tape in the working dtype, and a float32 one: the reference.
  Tape& lowp() {
    if (!lowp_) {
      lowp_ = std::make_unique<Tape>(stream(), "lowp");
      lowp_->set_compute_dtype(dtype());
    }
    return *lowp_;
  }
  Tape& fp32() {
    if (!fp32_) fp32_ = std::make_unique<Tape>(stream(), "fp32");
    return *fp32_;
  }
  // A leaf with `value` and a float32 gradient (zeros) on `tape`.
  Var leaf(Tape& tape, const Tensor& value, const std::string& name) {
    return tape.variable(value, Tensor::zeros(value.shape(), stream()), name);
  }
  std::vector<float> grad_of(const Var& v) { return v.grad().to_host<float>(stream()); }

  // op on leaves of `values` on `tape` (reset first), backward from a float32
  // upstream gradient: its output and each leaf's float32 gradient.
  using Op = std::function<Var(const std::vector<Var>&)>;
  struct Run {
    Var y;
    std::size_t records;
    std::vector<std::vector<float>> grads;
  };
  Run run(Tape& tape, const std::vector<Tensor>& values, const Op& op) {
    tape.reset();
    std::vector<Var> v;
    for (const Tensor& value : values) {
      v.push_back(leaf(tape, value, "v" + std::to_string(v.size())));
    }
    Run r{op(v), tape.num_records(), {}};
    const Tensor upstream =
        make32(random_values(std::size_t(r.y.value().numel()), 14), r.y.shape());
    tape.backward(r.y, upstream);
    for (const Var& leaf : v) r.grads.push_back(grad_of(leaf));
    EXPECT_NE(r.grads[0], std::vector<float>(r.grads[0].size(), 0.0f)) << "x got no gradient";
    return r;
  }
  // Every leaf's gradient, bit for bit.
  static void expect_same_gradients(const Run& a, const Run& b) {
    ASSERT_EQ(a.grads.size(), b.grads.size());
    for (std::size_t i = 0; i < a.grads.size(); ++i) {
      EXPECT_EQ(bits(a.grads[i]), bits(b.grads[i])) << "the gradient of input " << i;
    }
  }

 private:
  std::unique_ptr<Tape> lowp_, fp32_;
};
TL_INSTANTIATE_SIXTEEN_BIT(MixedPrecisionTest);

// The cases of a choice the CPU makes alone (their CUDA instances could only skip).
class MixedPrecisionCpuTest : public MixedPrecisionTest {};
INSTANTIATE_TEST_SUITE_P(SixteenBit, MixedPrecisionCpuTest,
                         ::testing::Combine(::testing::Values(Device::cpu()),
                                            ::testing::Values(DType::BFloat16, DType::Float16)),
                         sixteen_bit_name);

// y of a 16-bit GEMM is its float32 sums (the kernel with a float32 output) rounded
// once; the gradients are float32.
TEST_P(MixedPrecisionTest, GemmsWriteTheirFloat32SumsRoundedOnce) {
  const Tensor x16 = make(random_values(5 * 7, 1), {5, 7});
  const Tensor w16 = make(random_values(3 * 7, 2), {3, 7});
  const Var x = leaf(lowp(), x16, "x"), w = leaf(lowp(), w16, "w");
  const Var y = ag::matmul(x, w, false, true);
  ASSERT_EQ(y.value().dtype(), dtype());
  Tensor sums = Tensor::empty({5, 3}, stream());
  matmul(sums, x16, w16, false, true, 1.0f, 0.0f, stream());
  EXPECT_EQ(bits(host(y.value())), bits(host(cast(sums, dtype(), stream()))));
  EXPECT_NE(bits(host(y.value())), bits(sums.to_host<float>(stream())))
      << "the control: the float32 sums are not all " << dtype_name(dtype()) << " values";

  const Tensor c16 = make(random_values(2 * 3 * 6 * 5, 3), {2, 3, 6, 5});
  const Tensor k16 = make(random_values(4 * 3 * 3 * 3, 4), {4, 3, 3, 3});
  const Tensor bias = make32(random_values(4, 5), {4});
  const Conv2dParams same{.pad_h = 1, .pad_w = 1};
  const Var c = leaf(lowp(), c16, "c");
  const Var conv = ag::conv2d(c, leaf(lowp(), k16, "k"), leaf(lowp(), bias, "b"), same);
  ASSERT_EQ(conv.value().dtype(), dtype());
  Tensor conv_sums = Tensor::empty(conv.shape(), stream());
  conv2d_forward(conv_sums, c16, k16, bias, same, stream());
  EXPECT_EQ(bits(host(conv.value())), bits(host(cast(conv_sums, dtype(), stream()))));

  const Tensor a16 = make(random_values(2 * 3 * 4, 6), {2, 3, 4});
  const Var bmm = ag::batched_matmul(leaf(lowp(), a16, "a"), leaf(lowp(), a16, "a2"), false, true);
  ASSERT_EQ(bmm.value().dtype(), dtype());

  lowp().backward(y, make32(std::vector<float>(15, 1.0f), {5, 3}));
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
  EXPECT_EQ(w.grad().dtype(), DType::Float32);
  EXPECT_NE(grad_of(x), std::vector<float>(35, 0.0f));
}

// conv2d's gradients on the CPU, where the tape rounds the output gradient and widens
// the operands itself (round_through, autograd/nn.cpp), are the kernel's 16-bit call
// on the output gradient rounded to the working dtype, bit for bit (on CUDA that is
// the call the tape makes); the bias's gradient sums the float32 output gradient. An
// odd shape with stride and padding; the control: the float32 call on the unrounded
// output gradient gives other gradients.
TEST_P(MixedPrecisionTest, Conv2dGradientsAreTheKernelsOnTheRoundedOutputGradient) {
  const Tensor x16 = make(random_values(3 * 3 * 7 * 5, 21), {3, 3, 7, 5});
  const Tensor w16 = make(random_values(5 * 3 * 3 * 3, 22), {5, 3, 3, 3});
  const Tensor bias = make32(random_values(5, 23), {5});
  const Conv2dParams params{.stride_h = 2, .pad_h = 1, .pad_w = 1};
  const Var x = leaf(lowp(), x16, "x"), w = leaf(lowp(), w16, "w"), b = leaf(lowp(), bias, "b");
  const Var y = ag::conv2d(x, w, b, params);
  const Tensor upstream = make32(random_values(std::size_t(y.value().numel()), 24), y.shape());
  lowp().backward(y, upstream);

  Tensor grad_x = Tensor::zeros(x16.shape(), stream()),
         grad_w = Tensor::zeros(w16.shape(), stream());
  Tensor grad_b = Tensor::zeros({5}, stream());
  conv2d_backward(grad_x, grad_w, Tensor(), cast(upstream, dtype(), stream()), x16, w16, params,
                  stream());
  bias_add_backward(grad_b, upstream, stream());
  EXPECT_EQ(bits(grad_of(x)), bits(grad_x.to_host<float>(stream())));
  EXPECT_EQ(bits(grad_of(w)), bits(grad_w.to_host<float>(stream())));
  EXPECT_EQ(bits(grad_of(b)), bits(grad_b.to_host<float>(stream())));

  Tensor unrounded_x = Tensor::zeros(x16.shape(), stream());
  Tensor unrounded_w = Tensor::zeros(w16.shape(), stream());
  conv2d_backward(unrounded_x, unrounded_w, Tensor(), upstream, cast(x16, DType::Float32, stream()),
                  cast(w16, DType::Float32, stream()), params, stream());
  EXPECT_NE(bits(grad_of(x)), bits(unrounded_x.to_host<float>(stream()))) << "the control";
  EXPECT_NE(bits(grad_of(w)), bits(unrounded_w.to_host<float>(stream()))) << "the control";
}

// ReLU, bias add + ReLU and an activation read and write the working dtype; the
// gradient that reaches x is the float32 op's on the widened values.
TEST_P(MixedPrecisionTest, ElementwiseOpsKeepTheWorkingDtypeWithFloat32Gradients) {
  const std::vector<float> xs = random_values(4 * 6, 7, -2.0f, 2.0f);
  const Tensor x16 = make(xs, {4, 6});
  const Tensor x32 = cast(x16, DType::Float32, stream());
  const Tensor bias = make32(random_values(6, 8), {6});
  const Tensor upstream = make32(random_values(4 * 6, 9), {4, 6});
  const auto body = [&](Tape& tape, const Tensor& x_value) {
    const Var x = leaf(tape, x_value, "x");
    const Var b = leaf(tape, bias, "bias");
    const Var y = ag::sigmoid(ag::relu(ag::bias_add(x, b, Activation::ReLU)));
    tape.backward(y, upstream);
    return std::tuple{y, x, b};
  };
  const auto [y16, x_lowp, b_lowp] = body(lowp(), x16);
  const auto [y32, x_fp32, b_fp32] = body(fp32(), x32);
  EXPECT_EQ(y16.value().dtype(), dtype());
  EXPECT_EQ(x_lowp.grad().dtype(), DType::Float32);
  // The 16-bit forward differs from the float32 one only by its roundings.
  EXPECT_TRUE(all_close(host(y16.value()), y32.value().to_host<float>(stream()), 0.0,
                        dtype() == DType::BFloat16 ? 1.6e-2 : 2e-3));
  // Each gradient multiplies by the 16-bit outputs, so they agree to the same
  // roundings, not bit for bit; float32 from end to end.
  EXPECT_TRUE(
      all_close(grad_of(x_lowp), grad_of(x_fp32), 1e-3, dtype() == DType::BFloat16 ? 3e-2 : 4e-3));
  EXPECT_TRUE(
      all_close(grad_of(b_lowp), grad_of(b_fp32), 1e-3, dtype() == DType::BFloat16 ? 3e-2 : 4e-3));
}

// Pooling and (sync) batch norm run their 16-bit forward kernels on a 16-bit x (one record:
// nothing widened or rounded around them) and their float32 backwards beside the
// policy's float32 gradients (batch norm's reading x widened): y is the float32 op's
// output rounded once (max pooling, batch norm: kernels/pool2d.h, kernels/batchnorm.h)
// or within a 16-bit ulp of it (an average, whose 16-bit sum has the reference's
// order), and every gradient is the float32 op's on the widened x, bit for bit.
// (ag::batchnorm_max_pool2d composes the two for a 16-bit x but in training on the
// CPU: below.)
TEST_P(MixedPrecisionTest, PoolingAndBatchNormRunTheirSixteenBitKernels) {
  const Tensor x16 = make(random_values(2 * 3 * 4 * 6, 10, -3.0f, 3.0f), {2, 3, 4, 6});
  const Tensor gamma = make32(random_values(3, 12, 0.5f, 1.5f), {3});
  const Tensor beta = make32(random_values(3, 13), {3});
  const Pool2dParams pool = Pool2dParams::square(2, 2);
  const auto bn = [&](const std::vector<Var>& v) {
    const Tensor mean = Tensor::zeros({3}, stream()), var = make32({1, 1, 1}, {3});
    return ag::batchnorm(v[0], v[1], v[2], mean, var, true, 0.9, 1e-3, Activation::ReLU);
  };
  TowerBatchNormSync one_tower({0});  // alone: its exchanges leave the partials as they are
  const auto sync_bn = [&](const std::vector<Var>& v) {
    const Tensor mean = Tensor::zeros({3}, stream()), var = make32({1, 1, 1}, {3});
    return ag::sync_batchnorm(v[0], v[1], v[2], mean, var, one_tower, 0, 0.9, 1e-3,
                              Activation::ReLU);
  };
  const double ulp = dtype() == DType::BFloat16 ? 0x1p-7 : 0x1p-10;
  // name, op, whether y is the float32 output rounded once, bit for bit
  const std::vector<std::tuple<const char*, Op, bool>> cases = {
      {"max_pool2d", [&](const auto& v) { return ag::max_pool2d(v[0], pool); }, true},
      {"avg_pool2d", [&](const auto& v) { return ag::avg_pool2d(v[0], pool); }, false},
      {"global_avg_pool2d", [](const auto& v) { return ag::global_avg_pool2d(v[0]); }, false},
      {"batchnorm", bn, true},
      {"sync_batchnorm", sync_bn, true}};
  for (const auto& [name, op, exact] : cases) {
    SCOPED_TRACE(name);
    const Run r16 = run(lowp(), {x16, gamma, beta}, op);
    const Run r32 = run(fp32(), {cast(x16, DType::Float32, stream()), gamma, beta}, op);
    ASSERT_EQ(r16.y.value().dtype(), dtype());
    EXPECT_EQ(r16.records, 1u);
    const Tensor rounded = cast(r32.y.value(), dtype(), stream());
    if (exact) {
      EXPECT_EQ(bits(host(r16.y.value())), bits(host(rounded)));
    } else {
      EXPECT_TRUE(all_close(host(r16.y.value()), host(rounded), 0.0, ulp));
    }
    expect_same_gradients(r16, r32);
  }
}

// Batch norm + max pool in training on the CPU: a 16-bit x runs the fused kernels in
// its dtype, one record with no cast around it (the backward widens the saved x):
// y the float32 op's rounded once, every gradient the float32 op's, bit for bit, as
// the fallback gave. (Elsewhere it composes the two ops above, as a float32 x does.)
TEST_P(MixedPrecisionCpuTest, BatchNormMaxPoolRunsTheFusedKernelsInSixteenBits) {
  const Tensor x16 = make(random_values(2 * 3 * 4 * 6, 10, -3.0f, 3.0f), {2, 3, 4, 6});
  const Tensor gamma = make32(random_values(3, 12, 0.5f, 1.5f), {3});
  const Tensor beta = make32(random_values(3, 13), {3});
  const Op op = [&](const std::vector<Var>& v) {
    const Tensor mean = Tensor::zeros({3}, stream()), var = make32({1, 1, 1}, {3});
    return ag::batchnorm_max_pool2d(v[0], v[1], v[2], mean, var, true, Pool2dParams::square(2, 2),
                                    0.9, 1e-3, Activation::ReLU);
  };
  const Run r16 = run(lowp(), {x16, gamma, beta}, op);
  const Run r32 = run(fp32(), {cast(x16, DType::Float32, stream()), gamma, beta}, op);
  ASSERT_EQ(r16.y.value().dtype(), dtype());
  EXPECT_EQ(r32.records, 1u);  // fused
  EXPECT_EQ(r16.records, 1u);  // the fused op, no widen or round around it
  EXPECT_EQ(bits(host(r16.y.value())), bits(host(cast(r32.y.value(), dtype(), stream()))));
  expect_same_gradients(r16, r32);
}

// A residual's end, add_relu, on two 16-bit operands runs its 16-bit kernel (one
// record: nothing widened or rounded around it): y is the float32 op's output on the
// widened operands rounded once, and both gradients are the float32 op's, bit for bit.
// A 16-bit operand beside a float32 one takes the fallback (widened first).
TEST_P(MixedPrecisionTest, AddReluRunsItsSixteenBitKernel) {
  const Tensor a16 = make(random_values(2 * 3 * 4 * 6, 15, -3.0f, 3.0f), {2, 3, 4, 6});
  const Tensor b16 = make(random_values(2 * 3 * 4 * 6, 16, -3.0f, 3.0f), {2, 3, 4, 6});
  const Op op = [](const auto& v) { return ag::add_relu(v[0], v[1]); };
  const Run r16 = run(lowp(), {a16, b16}, op);
  const Run r32 =
      run(fp32(), {cast(a16, DType::Float32, stream()), cast(b16, DType::Float32, stream())}, op);
  EXPECT_EQ(r16.records, 1u) << "nothing widened around the op";
  ASSERT_EQ(r16.y.value().dtype(), dtype());
  const std::vector<float> y32 = host(r32.y.value());
  EXPECT_EQ(bits(host(r16.y.value())), bits(host(cast(r32.y.value(), dtype(), stream()))));
  // Control: some float32 outputs are not 16-bit values, so the rounding is there.
  EXPECT_NE(bits(host(r16.y.value())), bits(y32));
  expect_same_gradients(r16, r32);
  EXPECT_NE(r16.grads[0], std::vector<float>(r16.grads[0].size(), 0.0f));

  const Run mixed = run(lowp(), {a16, cast(b16, DType::Float32, stream())}, op);
  EXPECT_GT(mixed.records, 1u) << "a float32 operand: the fallback";
  EXPECT_EQ(bits(host(mixed.y.value())), bits(host(r16.y.value())));
  expect_same_gradients(mixed, r32);
}

// Each op without a 16-bit kernel is the float32 op on the widened inputs, its
// output rounded once (or left float32), its gradients the float32 op's, bit for bit.
TEST_P(MixedPrecisionTest, TheFallbackIsTheFloat32OpOnTheWidenedInputs) {
  const Tensor x16 = make(random_values(2 * 3 * 4 * 6, 10, -3.0f, 3.0f), {2, 3, 4, 6});
  const Tensor other16 = make(random_values(2 * 3 * 4 * 6, 11), {2, 3, 4, 6});
  // x, other -> the op's output.
  const std::vector<std::tuple<const char*, ag::FallbackOutput, Op>> cases = {
      {"add", ag::FallbackOutput::Working, [](const auto& v) { return ag::add(v[0], v[1]); }},
      {"mul", ag::FallbackOutput::Working, [](const auto& v) { return ag::mul(v[0], v[1]); }},
      {"dropout", ag::FallbackOutput::Working,
       [](const auto& v) {
         return ag::dropout(v[0], 0.3, DropoutKey{3, 5, 0});
       }},
      {"layer_norm", ag::FallbackOutput::Working,
       [](const auto& v) { return ag::layer_norm(v[0]); }},
      {"permute", ag::FallbackOutput::Working,
       [](const auto& v) {
         return ag::permute(v[0], {0, 2, 3, 1});
       }},
      {"softmax", ag::FallbackOutput::Float32, [](const auto& v) { return ag::softmax(v[0]); }},
      {"sum", ag::FallbackOutput::Float32, [](const auto& v) { return ag::sum(v[0]); }},
      {"softmax_cross_entropy", ag::FallbackOutput::Float32, [](const auto& v) {
         Tape& tape = v[0].tape();
         const Var labels = tape.constant(Tensor::from_host<float>({1, 5}, {2}, tape.stream()));
         return ag::softmax_cross_entropy(ag::reshape(v[0], {2, 72}), labels);
       }}};
  for (const auto& [name, output, op] : cases) {
    SCOPED_TRACE(name);
    const Run r16 = run(lowp(), {x16, other16}, op);
    const Run r32 = run(
        fp32(), {cast(x16, DType::Float32, stream()), cast(other16, DType::Float32, stream())}, op);
    EXPECT_GT(r16.records, 1u) << "the widening is recorded (control for the count above)";
    if (output == ag::FallbackOutput::Working) {
      ASSERT_EQ(r16.y.value().dtype(), dtype());
      EXPECT_EQ(bits(host(r16.y.value())), bits(host(cast(r32.y.value(), dtype(), stream()))));
    } else {
      ASSERT_EQ(r16.y.value().dtype(), DType::Float32);
      EXPECT_EQ(bits(host(r16.y.value())), bits(host(r32.y.value())));
    }
    expect_same_gradients(r16, r32);
  }
}

// A bf16 tower's logits are bfloat16 (the last linear layer writes the working
// dtype); the trainer hands its outputs back in float32.
TEST(MixedPrecisionTrainer, Bf16TowersCarryBfloat16LogitsAndReturnFloat32Outputs) {
  const CnnModel model;
  std::vector<DType> logits_dtypes;
  std::mutex mutex;
  const TowerFn fn = [&](const Tower& tower, const std::vector<Tensor>& batch) {
    const Var logits = model.net(tower.context(), tower.input(batch[0], "images"));
    {
      const std::lock_guard<std::mutex> lock(mutex);
      logits_dtypes.push_back(logits.value().dtype());
    }
    return TowerResult{
        ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels")), {logits}, {}};
  };
  TrainerOptions options;
  options.devices = {Device::cpu(), Device::cpu()};
  options.precision = Precision::Bf16;
  Trainer trainer(model.vars, fn, Optimizer::by_name("sgd", 0.1), options);
  const StepResult result = trainer.step(small_image_batch(7, 40, 7));
  EXPECT_EQ(logits_dtypes, (std::vector<DType>{DType::BFloat16, DType::BFloat16}));
  ASSERT_EQ(result.outputs.size(), 1u);
  EXPECT_EQ(result.outputs[0].dtype(), DType::Float32);
  EXPECT_EQ(result.outputs[0].shape(), (Shape{7, 3}));
}

}  // namespace
}  // namespace towerlab::testing
