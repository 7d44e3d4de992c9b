// The fused residual add + ReLU (kernels/add_relu.h) on every backend: the forward
// against add() then relu_forward and the reference, the backward against
// relu_backward into the sum's gradient then that gradient added into each operand's,
// bit for bit, with add-versus-assign sentinels, an operand without a gradient, one
// gradient for both operands, odd sizes and the typed errors; each comparison with a
// control that would catch a missing mask. In bfloat16 and float16, both directions
// against the reference bit for bit, on every CPU instruction set and the emulated
// GPUs. Then float64 gradients through the tape,
// and a small ResNet whose blocks end in the fused op against the same blocks ending
// in add and a ReLU layer: the same loss and gradients, bit for bit.
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "kernels/reference/add_relu.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class AddReluTest : public BackendTest {
 protected:
  // grad_a [n] after the unfused backward: relu_backward assigns the sum's gradient,
  // then it is added into grad_a as the tape's add_to_grad does (a copy when the write
  // assigns, axpy with 1 otherwise).
  std::vector<float> unfused_backward(const std::vector<float>& grad_a, GradWrite write,
                                      const Tensor& grad_y, const Tensor& y) {
    const Shape shape = y.shape();
    Tensor grad_sum = Tensor::empty(shape, stream());
    relu_backward(grad_sum, grad_y, y, stream(), GradWrite::Assign);
    Tensor out = make(grad_a, shape);
    if (write == GradWrite::Assign) {
      scale(out, grad_sum, 1.0, stream());
    } else {
      axpy(out, 1.0, grad_sum, stream());
    }
    return host(out);
  }
};
TL_INSTANTIATE_BACKENDS(AddReluTest);

TEST_P(AddReluTest, ForwardIsAddThenReluBitForBit) {
  for (std::int64_t n : {0, 1, 7, 257, 1000003}) {
    const auto a = random_values(static_cast<std::size_t>(n), 1, -2.0f, 2.0f);
    const auto b = random_values(static_cast<std::size_t>(n), 2, -2.0f, 2.0f);
    Tensor y = make(std::vector<float>(a.size(), -7.0f), {n});
    add_relu_forward(y, make(a, {n}), make(b, {n}), stream());
    Tensor sum = Tensor::empty({n}, stream());
    add(sum, make(a, {n}), make(b, {n}), stream());
    Tensor unfused = Tensor::empty({n}, stream());
    relu_forward(unfused, sum, stream());
    std::vector<float> expected(a.size());
    reference::add_relu_forward(expected.data(), a.data(), b.data(), n);
    const auto got = host(y);
    EXPECT_EQ(bits(got), bits(host(unfused))) << "n = " << n;
    EXPECT_EQ(bits(got), bits(expected)) << "n = " << n;
    if (n > 1) {  // control: the sum alone has negatives, which the ReLU clamps
      EXPECT_NE(got, host(sum)) << "n = " << n;
    }
  }
}

TEST_P(AddReluTest, ForwardKeepsNaNAndMayWriteInPlace) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Tensor a = make({nan, -inf, inf, 1.0f, -3.0f}, {5});
  Tensor b = make({1.0f, 1.0f, -1.0f, -1.0f, 2.0f}, {5});
  add_relu_forward(a, a, b, stream());  // y aliases a
  const auto v = host(a);
  EXPECT_TRUE(std::isnan(v[0])) << "a ReLU that drops NaN hides a broken input";
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_EQ(v[2], inf);
  EXPECT_EQ(v[3], 0.0f);
  EXPECT_EQ(v[4], 0.0f);
}

// Each operand's gradient, accumulated into a sentinel and assigned over NaN, is
// the unfused composition's, bit for bit; a control without the mask differs.
TEST_P(AddReluTest, BackwardIsReluBackwardThenTheSumsGradientAdded) {
  for (std::int64_t n : {1, 7, 257, 100003}) {
    const auto a = random_values(static_cast<std::size_t>(n), 3, -2.0f, 2.0f);
    const auto b = random_values(static_cast<std::size_t>(n), 4, -2.0f, 2.0f);
    Tensor y = Tensor::empty({n}, stream());
    add_relu_forward(y, make(a, {n}), make(b, {n}), stream());
    Tensor grad_y = make(random_values(static_cast<std::size_t>(n), 5), {n});
    const std::vector<float> sentinel_a(a.size(), 1.0f), sentinel_b(a.size(), -0.5f);
    const std::vector<float> poison(a.size(), std::nanf(""));
    for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
      const bool assign = write == GradWrite::Assign;
      Tensor grad_a = make(assign ? poison : sentinel_a, {n});
      Tensor grad_b = make(assign ? poison : sentinel_b, {n});
      add_relu_backward({.grad_a = grad_a,
                         .grad_b = grad_b,
                         .grad_y = grad_y,
                         .y = y,
                         .grad_a_write = write,
                         .grad_b_write = write},
                        stream());
      const auto expected_a = unfused_backward(assign ? poison : sentinel_a, write, grad_y, y);
      const auto expected_b = unfused_backward(assign ? poison : sentinel_b, write, grad_y, y);
      const std::string where = "n = " + std::to_string(n) + (assign ? ", assign" : ", accumulate");
      EXPECT_EQ(bits(host(grad_a)), bits(expected_a)) << where;
      EXPECT_EQ(bits(host(grad_b)), bits(expected_b)) << where;
      // Control: the gradient added without ReLU's mask is another one.
      Tensor unmasked = make(assign ? poison : sentinel_a, {n});
      axpy(unmasked, 1.0, grad_y, stream());
      if (!assign && n > 1) EXPECT_NE(host(unmasked), expected_a) << where;
    }
  }
}

TEST_P(AddReluTest, BackwardSkipsAMissingGradientAndSharesOne) {
  const std::int64_t n = 33;
  Tensor y = make(random_values(n, 6, -1.0f, 1.0f), {n});  // the forward's output, any signs
  Tensor grad_y = make(random_values(n, 7), {n});
  Tensor grad_sum = Tensor::empty({n}, stream());
  relu_backward(grad_sum, grad_y, y, stream(), GradWrite::Assign);
  const auto g = host(grad_sum);

  Tensor only_b = make(std::vector<float>(n, 2.0f), {n});  // sentinel: added to
  add_relu_backward({.grad_b = only_b, .grad_y = grad_y, .y = y}, stream());
  std::vector<float> expected(n);
  for (std::int64_t i = 0; i < n; ++i) expected[i] = 2.0f + g[i];
  EXPECT_EQ(host(only_b), expected);

  // add_relu(x, x): the one gradient is assigned by a's write, then b's is added.
  Tensor shared = make(std::vector<float>(n, std::nanf("")), {n});
  add_relu_backward({.grad_a = shared,
                     .grad_b = shared,
                     .grad_y = grad_y,
                     .y = y,
                     .grad_a_write = GradWrite::Assign},
                    stream());
  for (std::int64_t i = 0; i < n; ++i) expected[i] = g[i] + g[i];
  EXPECT_EQ(host(shared), expected);
}

TEST_P(AddReluTest, RejectsMismatchedShapesAndDtypes) {
  Tensor a = Tensor::zeros({2, 3}, stream());
  EXPECT_THROW_WITH(add_relu_forward(a, a, Tensor::zeros({3, 2}, stream()), stream()), ShapeError,
                    "add_relu_forward: b is float32[3,2]");
  EXPECT_THROW_WITH(
      add_relu_backward({.grad_a = Tensor::zeros({6}, stream()), .grad_y = a, .y = a}, stream()),
      ShapeError, "add_relu_backward: grad_a is float32[6]");
  Tensor half = Tensor::zeros({2, 3}, stream(), DType::Float16);
  EXPECT_THROW_WITH(add_relu_forward(half, half, a, stream()), ShapeError,
                    "add_relu_forward: b is float32[2,3]");
  EXPECT_THROW_WITH(add_relu_backward({.grad_a = a, .grad_y = half, .y = half}, stream()),
                    ShapeError, "add_relu_backward: grad_a is float32[2,3]");
  Tape tape(stream());
  EXPECT_THROW_WITH(ag::add_relu(tape.constant(a, "body"),
                                 tape.constant(Tensor::zeros({2, 1}, stream()), "skip")),
                    ShapeError,
                    "add_relu: body float32[2,3] and skip float32[2,1] differ in shape");
}

// --- bfloat16 and float16 --------------------------------------------------------

class AddReluSixteenBitTest : public SixteenBitTest {};
TL_INSTANTIATE_SIXTEEN_BIT(AddReluSixteenBitTest);

// The sum in float32 rounded once, NaN and infinities among the operands: the
// reference's bits on odd sizes and in place; the control, the operands' own sum
// rounded without the ReLU, differs.
TEST_P(AddReluSixteenBitTest, ForwardIsTheReferenceBitForBit) {
  for_each_cpu_isa([&](const std::string& isa) {
    SCOPED_TRACE(isa);
    for (std::int64_t n : {1, 7, 1025, 4099}) {
      const auto av = values_with_specials(static_cast<std::size_t>(n), 21);
      const auto bv = random_values(static_cast<std::size_t>(n), 22, -2.0f, 2.0f);
      Tensor a = make(av, {n}), b = make(bv, {n});
      Tensor y = make(std::vector<float>(av.size(), -7.0f), {n});
      add_relu_forward(y, a, b, stream());
      typed([&]<typename T>() {
        const std::vector<T> a16 = narrow<T>(av), b16 = narrow<T>(bv);
        std::vector<T> expected(a16.size());
        reference::add_relu_forward(expected.data(), a16.data(), b16.data(), n);
        EXPECT_EQ(bits(host(y)), bits(widen(expected))) << "n = " << n;
        if (n > 1) {
          std::vector<float> sums(a16.size());
          for (std::size_t i = 0; i < sums.size(); ++i) {
            sums[i] = static_cast<float>(T(float(a16[i]) + float(b16[i])));
          }
          EXPECT_NE(bits(host(y)), bits(sums)) << "control, n = " << n;
        }
      });
      EXPECT_TRUE(std::isnan(host(y)[0])) << "a ReLU that drops NaN hides a broken input";
      add_relu_forward(a, a, b, stream());  // y aliases a
      EXPECT_EQ(bits(host(a)), bits(host(y))) << "in place, n = " << n;
    }
    // Signed zeros: -0 + -0 is -0, which is not below 0 and stays -0; the other sums
    // of zeros are +0. Twenty values: a whole vector and a part of one.
    std::vector<float> av, bv;
    for (int i = 0; i < 5; ++i) {
      av.insert(av.end(), {-0.0f, -0.0f, 0.0f, -1.0f});
      bv.insert(bv.end(), {-0.0f, 0.0f, -0.0f, 1.0f});
    }
    const std::int64_t n = std::int64_t(av.size());
    Tensor y = make(std::vector<float>(av.size(), 5.0f), {n});
    add_relu_forward(y, make(av, {n}), make(bv, {n}), stream());
    typed([&]<typename T>() {
      const std::vector<T> a16 = narrow<T>(av), b16 = narrow<T>(bv);
      std::vector<T> expected(a16.size());
      reference::add_relu_forward(expected.data(), a16.data(), b16.data(), n);
      EXPECT_EQ(bits(host(y)), bits(widen(expected))) << "signed zeros";
      EXPECT_TRUE(std::signbit(host(y)[0]) && std::signbit(host(y)[16])) << "-0 + -0 stays -0";
    });
  });
}

// Both gradients accumulated onto sentinels in float32 and rounded once, or assigned
// over NaN, and one gradient shared by both operands (assigned by a's write, then
// b's added): the reference's bits. The control: accumulating and assigning differ.
TEST_P(AddReluSixteenBitTest, BackwardAccumulatesOrAssignsAsTheReference) {
  for_each_cpu_isa([&](const std::string& isa) {
    SCOPED_TRACE(isa);
    for (std::int64_t n : {1, 9, 1031, 3000}) {
      const auto yv = values_with_specials(static_cast<std::size_t>(n), 23);
      const auto gyv = random_values(static_cast<std::size_t>(n), 24, -3.0f, 3.0f);
      const auto sentinel = random_values(static_cast<std::size_t>(n), 25, -100.0f, 100.0f);
      const std::vector<float> poison(sentinel.size(), std::nanf(""));
      Tensor y = make(yv, {n}), grad_y = make(gyv, {n});
      typed([&]<typename T>() {
        const std::vector<T> y16 = narrow<T>(yv), gy16 = narrow<T>(gyv);
        for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
          const bool assign = write == GradWrite::Assign;
          const std::vector<float>& start = assign ? poison : sentinel;
          Tensor grad_a = make(start, {n}), grad_b = make(start, {n});
          add_relu_backward({.grad_a = grad_a,
                             .grad_b = grad_b,
                             .grad_y = grad_y,
                             .y = y,
                             .grad_a_write = write,
                             .grad_b_write = GradWrite::Accumulate},
                            stream());
          std::vector<T> expected_a = narrow<T>(start), expected_b = expected_a;
          reference::add_relu_backward(expected_a.data(), write, expected_b.data(),
                                       GradWrite::Accumulate, gy16.data(), y16.data(), n);
          const std::string where =
              "n = " + std::to_string(n) + (assign ? ", assign" : ", accumulate");
          EXPECT_EQ(bits(host(grad_a)), bits(widen(expected_a))) << where;
          EXPECT_EQ(bits(host(grad_b)), bits(widen(expected_b))) << where;
        }
        // One gradient for both: a's assignment, then b's add, rounded each time.
        Tensor shared = make(poison, {n});
        add_relu_backward({.grad_a = shared,
                           .grad_b = shared,
                           .grad_y = grad_y,
                           .y = y,
                           .grad_a_write = GradWrite::Assign},
                          stream());
        std::vector<T> expected = narrow<T>(poison);
        reference::add_relu_backward(expected.data(), GradWrite::Assign, expected.data(),
                                     GradWrite::Accumulate, gy16.data(), y16.data(), n);
        EXPECT_EQ(bits(host(shared)), bits(widen(expected))) << "shared, n = " << n;
        std::vector<T> added = narrow<T>(sentinel), assigned = added;
        reference::add_relu_backward(added.data(), GradWrite::Accumulate, static_cast<T*>(nullptr),
                                     GradWrite::Accumulate, gy16.data(), y16.data(), n);
        reference::add_relu_backward(assigned.data(), GradWrite::Assign, static_cast<T*>(nullptr),
                                     GradWrite::Accumulate, gy16.data(), y16.data(), n);
        EXPECT_NE(bits(widen(added)), bits(widen(assigned))) << "control, n = " << n;
      });
    }
  });
}

// Float32 gradients beside a 16-bit y (the precision policy's backward on the CPU):
// the float32 call's bits on the widened y, accumulated, assigned and shared; on
// cuda NotSupported, and a grad_a or shape that disagrees a typed error. The
// control: a y whose negatives were not masked (widened with its sign dropped)
// gives other bits.
TEST_P(AddReluSixteenBitTest, Float32GradientsBesideA16BitYAreTheWidenedYsCall) {
  const Tensor y16 = make(values_with_specials(12, 31), {3, 4});
  const Tensor grad_y = make32(random_values(12, 32), {3, 4});
  if (device().is_cuda()) {
    EXPECT_THROW_WITH(
        add_relu_backward(
            {.grad_a = make32(std::vector<float>(12, 0.0f), {3, 4}), .grad_y = grad_y, .y = y16},
            stream()),
        NotSupported, "add_relu_backward: grad_y is float32[3,4] on cuda:0 beside y");
    return;
  }
  EXPECT_THROW_WITH(add_relu_backward({.grad_a = make32(std::vector<float>(12, 0.0f), {3, 4}),
                                       .grad_y = make32(random_values(12, 32), {4, 3}),
                                       .y = y16},
                                      stream()),
                    ShapeError, "add_relu_backward: grad_y is float32[4,3] on cpu but y is");
  EXPECT_THROW_WITH(
      add_relu_backward(
          {.grad_a = make(std::vector<float>(12, 0.0f), {3, 4}), .grad_y = grad_y, .y = y16},
          stream()),
      ShapeError, "add_relu_backward: grad_a is");
  for_each_cpu_isa([&](const std::string& isa) {
    for (std::int64_t n : {1, 9, 1031, 3000}) {
      const auto yv = values_with_specials(static_cast<std::size_t>(n), 23);
      const auto sentinel = random_values(static_cast<std::size_t>(n), 25, -100.0f, 100.0f);
      const std::vector<float> poison(sentinel.size(), std::nanf(""));
      const Tensor y = make(yv, {n}), gy = make32(random_values(yv.size(), 24, -3.0f, 3.0f), {n});
      const Tensor wide = cast(y, DType::Float32, stream());
      const std::string where = isa + ", n = " + std::to_string(n);
      for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
        const std::vector<float>& start = write == GradWrite::Assign ? poison : sentinel;
        // (grad_a, grad_b) from the 16-bit y and from its widening; then one shared.
        auto run = [&](const Tensor& out, bool shared) {
          Tensor a = make32(start, {n}), b = shared ? a : make32(sentinel, {n});
          add_relu_backward(
              {.grad_a = a, .grad_b = b, .grad_y = gy, .y = out, .grad_a_write = write}, stream());
          return std::pair{host(a), host(b)};
        };
        for (const bool shared : {false, true}) {
          const auto [a16, b16] = run(y, shared);
          const auto [a32, b32] = run(wide, shared);
          EXPECT_EQ(bits(a16), bits(a32)) << where << (shared ? ", shared" : "");
          EXPECT_EQ(bits(b16), bits(b32)) << where << (shared ? ", shared" : "");
        }
      }
      if (n > 1) {
        const Tensor unmasked =
            cast(make(std::vector<float>(yv.size(), 1.0f), {n}), DType::Float32, stream());
        Tensor a = make32(sentinel, {n}), control = make32(sentinel, {n});
        add_relu_backward({.grad_a = a, .grad_y = gy, .y = y}, stream());
        add_relu_backward({.grad_a = control, .grad_y = gy, .y = unmasked}, stream());
        EXPECT_NE(bits(host(a)), bits(host(control))) << "control, " << where;
      }
    }
  });
}

// --- float64 on the CPU --------------------------------------------------------

// Keeps a + b away from ReLU's kink at 0, where the derivative is undefined.
void away_from_the_kink(Tensor& a, const Tensor& b) {
  double* pa = a.data<double>();
  const double* pb = b.data<double>();
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    if (std::abs(pa[i] + pb[i]) < 0.05) pa[i] += 0.3;
  }
}

TEST(AddReluGradient, ThroughTheTape) {
  Tensor a = random_double_tensor({4, 5}, 21), b = random_double_tensor({4, 5}, 22);
  away_from_the_kink(a, b);
  Tensor g = random_double_tensor({4, 5}, 23);
  const auto loss = [&](Tape& tape, const std::vector<Var>& in) {
    return ag::sum(ag::mul(ag::add_relu(in[0], in[1]), tape.constant(g)));
  };
  EXPECT_TRUE(check_tape_gradient(loss, {a, b}));
  // One value as both operands: relu(2x), its two contributions summed.
  const auto twice = [&](Tape& tape, const std::vector<Var>& in) {
    return ag::sum(ag::mul(ag::add_relu(in[0], in[0]), tape.constant(g)));
  };
  Tensor x = random_double_tensor({4, 5}, 24);
  away_from_the_kink(x, x);
  EXPECT_TRUE(check_tape_gradient(twice, {x}));
}

// --- in a model ------------------------------------------------------------------

// A stem, an identity block and a projection block, global pooling and a linear
// layer, named as models::resnet's; each block ends in Residual's fused add + ReLU
// (fused) or in add and a ReLU layer (the unfused composition), or in the add alone
// (the control).
enum class BlockEnd { Fused, AddThenRelu, AddOnly };

Sequential small_resnet(VariableSet& vars, BlockEnd end) {
  const Conv2dParams same{.pad_h = 1, .pad_w = 1};
  const Conv2dParams down{.stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
  Sequential net;
  net.add<Conv2d>(vars, "stem/conv", 1, 4, 3, same, false);
  net.add<BatchNorm>(vars, "stem/bn", 4, 0.99, 1e-3, Activation::ReLU);
  for (const std::string name : {"block1", "block2"}) {
    const bool project = name == "block2";
    const std::int64_t out = project ? 8 : 4;
    Sequential body;
    body.add<Conv2d>(vars, name + "/conv1", 4, out, 3, project ? down : same, false);
    body.add<BatchNorm>(vars, name + "/bn1", out, 0.99, 1e-3, Activation::ReLU);
    body.add<Conv2d>(vars, name + "/conv2", out, out, 3, same, false);
    body.add<BatchNorm>(vars, name + "/bn2", out, 0.99, 1e-3);
    std::optional<Sequential> shortcut;
    if (project) {
      shortcut.emplace();
      shortcut->add<Conv2d>(vars, name + "/shortcut/conv", 4, out, 1,
                            Conv2dParams{.stride_h = 2, .stride_w = 2}, false);
      shortcut->add<BatchNorm>(vars, name + "/shortcut/bn", out, 0.99, 1e-3);
    }
    net.add<Residual>(name, std::move(body), std::move(shortcut),
                      end == BlockEnd::Fused ? Activation::ReLU : Activation::None);
    if (end == BlockEnd::AddThenRelu) net.add<ReLU>();
  }
  net.add<GlobalAvgPool2d>();
  net.add<Linear>(vars, "fc", 8, 3);
  return net;
}

struct LossAndGradients {
  float loss;
  std::vector<std::string> names;         // the trainable variables, in order
  std::vector<std::vector<float>> grads;  // their gradients
};

LossAndGradients train_pass(const Sequential& net, const VariableSet& vars) {
  const Stream& s = cpu();
  VariableStore store(vars, s);
  store.initialize(5, s);
  Tensor images = Tensor::empty({6, 1, 9, 9}, s);
  random_normal(images, 8, 0, 0.0f, 1.0f, s);
  Tensor labels = Tensor::from_host<float>({0, 1, 2, 0, 1, 2}, {6}, s);
  Tape tape(s);
  Var loss = ag::softmax_cross_entropy(net(Context{tape, store, true}, tape.constant(images)),
                                       tape.constant(labels));
  store.zero_grad(s);
  tape.backward(loss);
  LossAndGradients out{loss.value().to_host<float>()[0], {}, {}};
  for (const VariableSpec& spec : vars.specs()) {
    if (!spec.trainable) continue;
    out.names.push_back(spec.name);
    out.grads.push_back(store.grad(spec.name).to_host<float>());
  }
  return out;
}

TEST(AddReluLayers, ResidualBlocksEqualAddThenRelu) {
  VariableSet vars;
  const Sequential fused = small_resnet(vars, BlockEnd::Fused);
  const Sequential unfused = small_resnet(vars, BlockEnd::AddThenRelu);  // the same variables
  const Sequential control = small_resnet(vars, BlockEnd::AddOnly);
  EXPECT_EQ(fused.size() + 2, unfused.size());
  const LossAndGradients f = train_pass(fused, vars), u = train_pass(unfused, vars);
  EXPECT_EQ(bits({f.loss}), bits({u.loss}));
  ASSERT_EQ(f.grads.size(), u.grads.size());
  for (std::size_t i = 0; i < f.grads.size(); ++i) {
    EXPECT_EQ(bits(f.grads[i]), bits(u.grads[i])) << f.names[i];
  }
  EXPECT_NE(f.grads.front(), std::vector<float>(f.grads.front().size(), 0.0f));
  EXPECT_NE(train_pass(control, vars).loss, f.loss) << "the control drops the ReLUs";
}

}  // namespace
}  // namespace towerlab::testing
