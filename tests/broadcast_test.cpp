// Broadcasting add, sub and mul and sum_to_shape on every backend against the reference,
// bit for bit, over many shape pairs (a [1] operand, [D] against [N,D], [N,1,W]
// against [1,C,1], rank differences, odd sizes), add-versus-assign sentinels, equal
// shapes keeping the elementwise kernels' bits, the errors, float64 gradient checks
// of ag::add, ag::sub and ag::mul through the tape, and the cases tests/ops_vs_torch_test.py
// compares with PyTorch.
// The files an op takes, in order: the top of kernels/relu.h.
#include <limits>
#include <string>
#include <utility>

#include "gradcheck.h"
#include "kernels/reference/broadcast.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Pairs of shapes that broadcast, each with a repeated dimension somewhere.
const std::vector<std::pair<Shape, Shape>> kPairs = {
    {{1}, {5, 3}},                 // a scalar-like operand
    {{3}, {4, 3}},                 // a bias: [D] against [N,D]
    {{4, 1, 5}, {1, 3, 1}},        // [N,1,W] against [1,C,1]: both repeated
    {{2, 3, 4}, {3, 1}},           // a rank difference and a repeated last dimension
    {{6, 1}, {1, 7}},              // an outer product
    {{2, 1, 3, 1}, {4, 1, 5}},     // rank 4 against rank 3
    {{33, 1, 17}, {1, 19, 1}},     // odd sizes
    {{5, 4, 3, 2, 1}, {1, 1}},     // rank 5 against ones
    {{2, 3, 4, 5}, {2, 1, 4, 1}},  // every other dimension repeated
    {{7, 1}, {7, 9}},              // a column
    {{}, {2, 2}},                  // a rank-0 operand
    {{1, 1}, {1}},                 // one value: no dimension is left to walk
};

std::string describe(const Shape& a, const Shape& b) {
  return to_string(a) + " and " + to_string(b);
}

constexpr BroadcastOp kOps[] = {BroadcastOp::Add, BroadcastOp::Sub, BroadcastOp::Mul};

const char* name(BroadcastOp op) {
  return op == BroadcastOp::Add ? "add" : op == BroadcastOp::Sub ? "sub" : "mul";
}

void forward(BroadcastOp op, const Tensor& out, const Tensor& a, const Tensor& b,
             const Stream& stream) {
  (op == BroadcastOp::Add   ? broadcast_add
   : op == BroadcastOp::Sub ? broadcast_sub
                            : broadcast_mul)(out, a, b, stream);
}

// The op through the tape.
Var through_tape(BroadcastOp op, const Var& a, const Var& b) {
  return op == BroadcastOp::Add   ? ag::add(a, b)
         : op == BroadcastOp::Sub ? ag::sub(a, b)
                                  : ag::mul(a, b);
}

class BroadcastTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(BroadcastTest);

TEST_P(BroadcastTest, ForwardMatchesReferenceBitForBit) {
  unsigned seed = 1;
  for (const auto& [sa, sb] : kPairs) {
    for (const auto& [first, second] : {std::pair{sa, sb}, std::pair{sb, sa}}) {
      const Shape shape = broadcast_shape("test", first, second);
      const auto a = random_values(std::size_t(numel_of(first)), ++seed, -2.0f, 2.0f);
      const auto b = random_values(std::size_t(numel_of(second)), ++seed, -2.0f, 2.0f);
      for (BroadcastOp op : kOps) {
        Tensor out = Tensor::empty(shape, stream());
        forward(op, out, make(a, first), make(b, second), stream());
        std::vector<float> expected(std::size_t(numel_of(shape)));
        reference::broadcast_binary(expected.data(), shape, a.data(), first, b.data(), second, op,
                                    0, numel_of(shape));
        EXPECT_EQ(host(out), expected) << name(op) << " of " << describe(first, second);
      }
    }
  }
}

TEST_P(BroadcastTest, RepeatsTheSmallerOperand) {
  // [3] + [2,3]: each row of b plus the same a; [2,1] * [1,3]: the outer product.
  Tensor out = Tensor::empty({2, 3}, stream());
  broadcast_add(out, make({1, 2, 3}, {3}), make({10, 20, 30, 40, 50, 60}, {2, 3}), stream());
  EXPECT_EQ(host(out), (std::vector<float>{11, 22, 33, 41, 52, 63}));
  broadcast_mul(out, make({2, 3}, {2, 1}), make({1, 10, 100}, {1, 3}), stream());
  EXPECT_EQ(host(out), (std::vector<float>{2, 20, 200, 3, 30, 300}));
  broadcast_sub(out, make({1, 2, 3}, {3}), make({10, 20, 30, 40, 50, 60}, {2, 3}), stream());
  EXPECT_EQ(host(out), (std::vector<float>{-9, -18, -27, -39, -48, -57}));  // a - b, not b - a
}

TEST_P(BroadcastTest, EqualShapesAreTheElementwiseKernels) {
  const auto a = random_values(300, 3), b = random_values(300, 4);
  for (BroadcastOp op : kOps) {
    Tensor out = Tensor::empty({10, 30}, stream()), plain = Tensor::empty({10, 30}, stream());
    forward(op, out, make(a, {10, 30}), make(b, {10, 30}), stream());
    (op == BroadcastOp::Add   ? add
     : op == BroadcastOp::Sub ? sub
                              : mul)(plain, make(a, {10, 30}), make(b, {10, 30}), stream());
    EXPECT_EQ(host(out), host(plain)) << name(op);
  }
}

TEST_P(BroadcastTest, SumToShapeMatchesReferenceBitForBit) {
  unsigned seed = 100;
  for (const auto& [sa, sb] : kPairs) {
    const Shape shape = broadcast_shape("test", sa, sb);
    for (const Shape& target : {sa, sb}) {
      // Mixed magnitudes, so that a sum's order would show in its bits.
      auto x = random_values(std::size_t(numel_of(shape)), ++seed, -1.0f, 1.0f);
      for (std::size_t i = 0; i < x.size(); i += 5) x[i] *= 3e4f;
      const std::size_t n = std::size_t(numel_of(target));
      const auto sentinel = random_values(n, ++seed, 5.0f, 6.0f);
      Tensor accumulated = make(sentinel, target);
      sum_to_shape(accumulated, make(x, shape), stream());
      std::vector<float> expected = sentinel;
      reference::sum_to_shape(expected.data(), target, x.data(), shape, 0, std::int64_t(n),
                              GradWrite::Accumulate);
      EXPECT_EQ(host(accumulated), expected) << describe(target, shape) << ", accumulated";
      Tensor assigned = make(std::vector<float>(n, kNaN), target);  // must not be read
      sum_to_shape(assigned, make(x, shape), stream(), GradWrite::Assign);
      std::vector<float> sums(n, kNaN);
      reference::sum_to_shape(sums.data(), target, x.data(), shape, 0, std::int64_t(n),
                              GradWrite::Assign);
      EXPECT_EQ(host(assigned), sums) << describe(target, shape) << ", assigned";
    }
  }
  // The sums by hand: [2,3] to [3] (columns), to [2,1] (rows) and to [1] (all).
  const std::vector<float> x = {1, 2, 3, 10, 20, 30};
  Tensor columns = Tensor::empty({3}, stream()), rows = Tensor::empty({2, 1}, stream()),
         all = Tensor::empty({1}, stream());
  sum_to_shape(columns, make(x, {2, 3}), stream(), GradWrite::Assign);
  sum_to_shape(rows, make(x, {2, 3}), stream(), GradWrite::Assign);
  sum_to_shape(all, make(x, {2, 3}), stream(), GradWrite::Assign);
  EXPECT_EQ(host(columns), (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(host(rows), (std::vector<float>{6, 60}));
  EXPECT_EQ(host(all), (std::vector<float>{66}));
}

TEST_P(BroadcastTest, SumsInDouble) {
  // 2^24 and then 4095 ones: a float running sum stays at 2^24 (each 1 is half an
  // ulp there, and the tie rounds to even); the double sum keeps them all and
  // rounds once. The control: the float sum differs.
  std::vector<float> x(4096, 1.0f);
  x[0] = 0x1p24f;
  Tensor sum = Tensor::empty({1}, stream());
  sum_to_shape(sum, make(x, {64, 64}), stream(), GradWrite::Assign);
  const float expected = static_cast<float>(0x1p24 + 4095.0);
  EXPECT_EQ(host(sum)[0], expected);
  float running = 0.0f;
  for (float v : x) running += v;
  EXPECT_NE(running, expected);
}

TEST_P(BroadcastTest, RejectsShapesThatDoNotBroadcast) {
  Tensor a = Tensor::zeros({2, 3}, stream()), b = Tensor::zeros({4}, stream());
  EXPECT_THROW_WITH(
      broadcast_add(Tensor::empty({2, 3}, stream()), a, b, stream()), ShapeError,
      "broadcast_add: shapes [2,3] and [4] do not broadcast (dimension -1: 3 against 4)");
  EXPECT_THROW_WITH(
      broadcast_sub(Tensor::empty({2, 3}, stream()), a, b, stream()), ShapeError,
      "broadcast_sub: shapes [2,3] and [4] do not broadcast (dimension -1: 3 against 4)");
  EXPECT_THROW_WITH(
      broadcast_mul(Tensor::empty({2, 4}, stream()), a, Tensor::zeros({3}, stream()), stream()),
      ShapeError,
      "broadcast_mul: out is float32[2,4] on " + device().str() + " but a float32[2,3] on " +
          device().str());
  EXPECT_THROW_WITH(
      broadcast_add(Tensor::empty({5, 1, 2}, stream()), Tensor::zeros({5, 1, 2}, stream()),
                    Tensor::zeros({3, 1, 1}, stream()), stream()),
      ShapeError, "(dimension -3: 5 against 3)");
  EXPECT_THROW_WITH(
      sum_to_shape(Tensor::empty({2, 1}, stream()), Tensor::zeros({1, 3}, stream()), stream()),
      ShapeError,
      "sum_to_shape: out float32[2,1] on " + device().str() +
          " does not broadcast to x float32[1,3]");
  Tensor h = Tensor::zeros({2, 2}, stream(), DType::Float16);
  EXPECT_THROW_WITH(broadcast_add(h, h, Tensor::zeros({2}, stream(), DType::Float16), stream()),
                    NotSupported, "broadcast_add: float16 is not supported");
  const Shape deep(9, 1);
  EXPECT_THROW_WITH(broadcast_add(Tensor::empty(deep, stream()), Tensor::zeros(deep, stream()),
                                  Tensor::zeros({1}, stream()), stream()),
                    NotSupported, "broadcasting takes ranks up to 8");
}

TEST(BroadcastCpu, Float64IsTheReference) {
  Tensor a = random_double_tensor({4, 1, 5}, 1), b = random_double_tensor({3, 1}, 2);
  Tensor out = Tensor::empty({4, 3, 5}, cpu(), DType::Float64);
  broadcast_mul(out, a, b, cpu());
  std::vector<double> expected(60);
  reference::broadcast_binary(expected.data(), {4, 3, 5}, a.data<double>(), {4, 1, 5},
                              b.data<double>(), {3, 1}, BroadcastOp::Mul, 0, 60);
  EXPECT_EQ(out.to_host<double>(), expected);
  Tensor sum = Tensor::zeros({3, 1}, cpu(), DType::Float64);
  sum_to_shape(sum, out, cpu());
  std::vector<double> sums(3, 0.0);
  reference::sum_to_shape(sums.data(), {3, 1}, expected.data(), {4, 3, 5}, 0, 3,
                          GradWrite::Accumulate);
  EXPECT_EQ(sum.to_host<double>(), sums);
}

// ag::add, ag::sub and ag::mul on every pair (and swapped), a and b both variables:
// the gradients of the loss sum(g * op(a, b)) against central differences.
TEST(BroadcastGradient, AddSubAndMulThroughTheTape) {
  unsigned seed = 200;
  for (const auto& [sa, sb] : kPairs) {
    if (numel_of(broadcast_shape("test", sa, sb)) > 200) continue;  // keep the check quick
    for (BroadcastOp kind : kOps) {
      auto op = [kind](const Var& x, const Var& y) { return through_tape(kind, x, y); };
      Tensor a = random_double_tensor(sa, ++seed), b = random_double_tensor(sb, ++seed);
      Tensor g = random_double_tensor(broadcast_shape("test", sa, sb), ++seed);
      auto loss_fn = [&](const std::vector<Tensor>& in) {
        Tape tape(cpu());
        Var y = op(tape.constant(in[0]), tape.constant(in[1]));
        return weighted_sum(g, y.value());
      };
      Tensor grad_a = Tensor::zeros(sa, cpu(), DType::Float64);
      Tensor grad_b = Tensor::zeros(sb, cpu(), DType::Float64);
      Tape tape(cpu());
      tape.set_first_write(Tape::FirstWrite::Poisoned);
      Var y = op(tape.variable(a, grad_a, "a"), tape.variable(b, grad_b, "b"));
      tape.backward(y, g);
      EXPECT_TRUE(check_gradient(loss_fn, {a, b}, {grad_a, grad_b}))
          << name(kind) << " of " << describe(sa, sb);
    }
  }
}

// An intermediate broadcast operand (its gradient is the tape's first write, which
// sum_to_shape assigns) used twice: x * (x + bias) with bias [D].
TEST(BroadcastGradient, IntermediateOperandUsedTwice) {
  Tensor x = random_double_tensor({4, 3}, 301), bias = random_double_tensor({3}, 302);
  auto forward = [](Tape&, const std::vector<Var>& v) {
    Var scaled = ag::scale(v[1], 2.0);  // [3], an intermediate: its gradient is handed out
    return ag::sum(ag::mul(ag::add(v[0], scaled), ag::mul(scaled, v[0])));
  };
  EXPECT_TRUE(check_tape_gradient(forward, {x, bias}));
}

// Inputs and outputs for tests/ops_vs_torch_test.py (ctest ops_vs_torch): per
// backend and dtype and per shape pair k, a<k>, b<k> and grad_y<k>, then for add,
// sub and mul through ag:: (the tape) y, grad_a and grad_b.
TEST(BroadcastVsTorch, WritesCases) {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{1}, {5, 3}}, {{3}, {4, 3}}, {{4, 1, 5}, {1, 3, 1}}, {{2, 3, 4}, {3, 1}}, {{2, 3}, {2, 3}}};
  std::vector<std::pair<std::string, Tensor>> out;
  for (const TorchCaseBackend& backend : torch_case_backends()) {
    for (std::size_t k = 0; k < pairs.size(); ++k) {
      const auto& [sa, sb] = pairs[k];
      const Shape shape = broadcast_shape("test", sa, sb);
      const std::string p = backend.prefix + std::to_string(k) + "/";
      const Tensor a = backend.make(random_values(std::size_t(numel_of(sa)), 400 + k), sa);
      const Tensor b = backend.make(random_values(std::size_t(numel_of(sb)), 500 + k), sb);
      const Tensor gy = backend.make(random_values(std::size_t(numel_of(shape)), 600 + k), shape);
      out.insert(out.end(), {{p + "a", a}, {p + "b", b}, {p + "grad_y", gy}});
      for (BroadcastOp kind : kOps) {
        const Stream& stream = backend.stream();
        Tensor grad_a = Tensor::zeros(sa, stream, backend.dtype);
        Tensor grad_b = Tensor::zeros(sb, stream, backend.dtype);
        Tape tape(stream);
        Var va = tape.variable(a, grad_a, "a"), vb = tape.variable(b, grad_b, "b");
        Var y = through_tape(kind, va, vb);
        tape.backward(y, gy);
        const std::string q = p + name(kind);
        out.insert(out.end(),
                   {{q + "/y", y.value()}, {q + "/grad_a", grad_a}, {q + "/grad_b", grad_b}});
      }
    }
  }
  write_torch_cases("broadcast.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
