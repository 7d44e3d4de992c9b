// batched_matmul (kernels/batched_matmul.h) on every backend against its reference
// within matmul's stated tolerance: every layout, odd sizes, a shared 2-D operand on
// either side, the 2-D sum over the batch, empty batches and K = 0, beta's assign and
// accumulate (NaN and a sentinel in c), the CPU's entries on threads bit for bit,
// the CPU's batch path against one matmul per entry on every ISA (float32, 16-bit, float64),
// 16-bit inputs on the CPU, the errors, and float64 gradient checks through the tape.
#include <cmath>
#include <limits>
#include <string>

#include "cpu_isa.h"
#include "gradcheck.h"
#include "kernels/reference/batched_matmul.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A product's layout: B entries of op(A) [M,K] times op(B) [K,N], each operand 3-D or
// shared (2-D); `summed`: the 2-D c that sums over the batch.
struct Product {
  std::int64_t batch, m, n, k;
  bool transpose_a = false, transpose_b = false;
  bool shared_a = false, shared_b = false, summed = false;

  Shape a_shape() const {
    const Shape matrix = transpose_a ? Shape{k, m} : Shape{m, k};
    return shared_a ? matrix : Shape{batch, matrix[0], matrix[1]};
  }
  Shape b_shape() const {
    const Shape matrix = transpose_b ? Shape{n, k} : Shape{k, n};
    return shared_b ? matrix : Shape{batch, matrix[0], matrix[1]};
  }
  Shape c_shape() const { return summed ? Shape{m, n} : Shape{batch, m, n}; }
  std::string str() const {
    return "B " + std::to_string(batch) + ", " + std::to_string(m) + "x" + std::to_string(n) + "x" +
           std::to_string(k) + (transpose_a ? ", a^T" : "") + (transpose_b ? ", b^T" : "") +
           (shared_a ? ", shared a" : "") + (shared_b ? ", shared b" : "") +
           (summed ? ", summed" : "");
  }
};

// The reference in double on float values, with alpha, beta.
std::vector<double> reference_product(const Product& p, const std::vector<float>& a,
                                      const std::vector<float>& b, const std::vector<float>& c0,
                                      double alpha, double beta) {
  const std::vector<double> da(a.begin(), a.end()), db(b.begin(), b.end());
  std::vector<double> c(c0.begin(), c0.end());
  reference::batched_matmul(p.transpose_a, p.transpose_b, p.batch, p.m, p.n, p.k, alpha, da.data(),
                            p.shared_a ? 0 : p.m * p.k, db.data(), p.shared_b ? 0 : p.k * p.n, beta,
                            c.data(), p.summed ? 0 : p.m * p.n);
  return c;
}

std::vector<float> absolute(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// kernels/batched_matmul.h's bound, each element: 2 (K' + 2) 2^-24 (|alpha| S + |beta c0|),
// K' = K (B K for the sum), S the product of |a| and |b| (summed over the batch too).
::testing::AssertionResult within_matmul_tolerance(
    const Product& p, const std::vector<float>& actual, const std::vector<float>& a,
    const std::vector<float>& b, const std::vector<float>& c0, double alpha, double beta) {
  const std::vector<double> expected = reference_product(p, a, b, c0, alpha, beta);
  const std::vector<double> s =
      reference_product(p, absolute(a), absolute(b), std::vector<float>(c0.size()), 1.0, 0.0);
  const double k = double(p.summed ? p.batch * p.k : p.k);
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double c_before = beta == 0.0 ? 0.0 : std::fabs(beta * c0[i]);
    const double bound = 2 * (k + 2) * std::ldexp(1.0, -24) * (std::fabs(alpha) * s[i] + c_before);
    if (!(std::fabs(actual[i] - expected[i]) <= bound)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << actual[i] << ", the reference has " << expected[i]
             << " (bound " << bound << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

class BatchedMatmulTest : public BackendTest {
 protected:
  // The product with beta 0 over a NaN c (assigned: not read) and beta 1 over a
  // random c (accumulated), against the reference.
  void check(const Product& p, float alpha = 1.0f) {
    const auto a = random_values(std::size_t(numel_of(p.a_shape())), unsigned(p.m + p.k));
    const auto b = random_values(std::size_t(numel_of(p.b_shape())), unsigned(p.n + p.k + 1));
    const std::size_t nc = std::size_t(numel_of(p.c_shape()));
    for (float beta : {0.0f, 1.0f}) {
      const auto c0 = beta == 0.0f ? std::vector<float>(nc, kNaN) : random_values(nc, 3);
      Tensor c = make(c0, p.c_shape());
      batched_matmul(c, make(a, p.a_shape()), make(b, p.b_shape()), p.transpose_a, p.transpose_b,
                     alpha, beta, stream());
      const auto out = host(c);
      EXPECT_TRUE(within_matmul_tolerance(p, out, a, b, c0, alpha, beta))
          << p.str() << ", beta " << beta;
      // Not trivial: some output is away from zero where there is something to sum.
      if (p.k > 0 && p.batch > 0 && nc > 0 && beta == 0.0f) {
        float largest = 0;
        for (float v : out) largest = std::max(largest, std::fabs(v));
        EXPECT_GT(largest, 0.0f) << p.str();
      }
    }
  }
};
TL_INSTANTIATE_BACKENDS(BatchedMatmulTest);

TEST_P(BatchedMatmulTest, EveryLayoutOnOddSizes) {
  for (const Product& size : {Product{1, 1, 1, 1}, Product{3, 17, 5, 33}, Product{4, 65, 70, 31}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Product p = size;
        p.transpose_a = ta, p.transpose_b = tb;
        check(p);
        Product shared_b = p;
        shared_b.shared_b = true;
        check(shared_b, 0.5f);
        Product shared_a = p;
        shared_a.shared_a = true;
        check(shared_a);
        Product summed = p;
        summed.summed = true;
        check(summed);
      }
    }
  }
}

TEST_P(BatchedMatmulTest, EmptyBatchesAndEmptySums) {
  check(Product{0, 3, 4, 5});  // nothing to write
  check(Product{2, 0, 4, 5});
  check(Product{2, 3, 4, 0});  // K = 0: C = beta C
  Product summed{0, 3, 4, 5};
  summed.summed = true;  // an empty sum: C = beta C
  check(summed);
  // beta 0 over NaN gives zeros, not NaN.
  Tensor c = make(std::vector<float>(12, kNaN), {3, 4});
  batched_matmul(c, Tensor::empty({0, 3, 5}, stream()), Tensor::empty({0, 5, 4}, stream()), false,
                 false, 1.0f, 0.0f, stream());
  EXPECT_EQ(host(c), std::vector<float>(12, 0.0f));
}

TEST_P(BatchedMatmulTest, RejectsBadShapes) {
  auto zeros = [&](const Shape& s) { return Tensor::zeros(s, stream()); };
  auto call = [&](const Tensor& c, const Tensor& a, const Tensor& b) {
    batched_matmul(c, a, b, false, false, 1.0f, 0.0f, stream());
  };
  EXPECT_THROW_WITH(call(zeros({2, 3, 5}), zeros({2, 3, 4}), zeros({2, 5, 5})), ShapeError,
                    "batched_matmul: a float32[2,3,4], b float32[2,5,5], c float32[2,3,5]: inner "
                    "dimensions 4 and 5 differ");
  EXPECT_THROW_WITH(call(zeros({2, 3, 5}), zeros({2, 3, 4}), zeros({3, 4, 5})), ShapeError,
                    "batch sizes differ");
  EXPECT_THROW_WITH(call(zeros({2, 3, 6}), zeros({2, 3, 4}), zeros({2, 4, 5})), ShapeError,
                    "c must be [B,3x5]");
  EXPECT_THROW_WITH(call(zeros({2, 3, 5}), zeros({3, 4}), zeros({4, 5})), ShapeError,
                    "a 3-D c needs a or b 3-D");
  EXPECT_THROW_WITH(call(zeros({3, 5}), zeros({3, 4}), zeros({2, 4, 5})), ShapeError,
                    "a 2-D c is the sum over the batch, which needs a and b 3-D");
  EXPECT_THROW_WITH(call(zeros({1, 2, 3, 5}), zeros({2, 3, 4}), zeros({2, 4, 5})), ShapeError,
                    "each must be 3-D [B, rows, cols] or 2-D");
  Tensor a = zeros({2, 3, 3});
  EXPECT_THROW_WITH(call(a, a, zeros({2, 3, 3})), InvalidArgument, "c overlaps an operand");
  EXPECT_THROW_WITH(call(zeros({2, 3, 5}), zeros({2, 3, 4}), Tensor()), InvalidArgument,
                    "batched_matmul: b is undefined");
}

// The CPU shares the entries among its threads: each GEMM then runs on one thread, with
// the bits it has on any number, and the same bits as one matmul per entry.
TEST(BatchedMatmulCpu, EntriesOnThreadsGiveMatmulsBits) {
  const int saved = num_threads();
  const Product p{8, 33, 17, 40};
  const auto a = random_values(std::size_t(numel_of(p.a_shape())), 5);
  const auto b = random_values(std::size_t(numel_of(p.b_shape())), 6);
  const Tensor ta = Tensor::from_host<float>(a, p.a_shape(), cpu());
  const Tensor tb = Tensor::from_host<float>(b, p.b_shape(), cpu());
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 8}) {
    set_num_threads(threads);
    Tensor c = Tensor::empty(p.c_shape(), cpu());
    batched_matmul(c, ta, tb, false, false, 1.0f, 0.0f, cpu());
    results.push_back(c.to_host<float>());
  }
  set_num_threads(saved);
  std::vector<float> one_by_one;
  for (std::int64_t i = 0; i < p.batch; ++i) {
    Tensor c = Tensor::empty({p.m, p.n}, cpu());
    matmul(c, ta.view(i * p.m * p.k, {p.m, p.k}), tb.view(i * p.k * p.n, {p.k, p.n}), false, false,
           1.0f, 0.0f, cpu());
    const auto entry = c.to_host<float>();
    one_by_one.insert(one_by_one.end(), entry.begin(), entry.end());
  }
  EXPECT_EQ(results[0], one_by_one);
  EXPECT_EQ(results[1], one_by_one);
  EXPECT_EQ(results[2], one_by_one);
}

// The CPU hands the whole batch to its GEMM at once (cpu::gemm_batched): on every ISA,
// every layout, a shared operand on either side and the sum, odd sizes and an attention
// head's (49 keys, width 16), assigned over NaN and added onto c, in float32 and with
// 16-bit operands into a float32 or 16-bit c, each entry gives the bits of matmul on its
// views, which the tests above and kernels/matmul.h hold to the reference.
TEST(BatchedMatmulCpu, EveryIsaGivesOneMatmulPerEntrysBits) {
  const auto one_per_entry = [](const Product& p, const Tensor& a, const Tensor& b, Tensor c,
                                float beta) {
    for (std::int64_t i = 0; i < std::max<std::int64_t>(p.batch, p.summed ? 1 : 0); ++i) {
      const auto entry = [&](const Tensor& x, bool shared, const Shape& matrix) {
        return shared ? x : x.view(i * matrix[0] * matrix[1], matrix);
      };
      const Shape am = p.transpose_a ? Shape{p.k, p.m} : Shape{p.m, p.k};
      const Shape bm = p.transpose_b ? Shape{p.n, p.k} : Shape{p.k, p.n};
      const bool none = p.batch == 0;  // an empty sum: K = 0, C = beta C
      const Tensor ai = none ? a.view(0, p.transpose_a ? Shape{0, p.m} : Shape{p.m, 0})
                             : entry(a, p.shared_a, am);
      const Tensor bi = none ? b.view(0, p.transpose_b ? Shape{p.n, 0} : Shape{0, p.n})
                             : entry(b, p.shared_b, bm);
      const Tensor ci = p.summed ? c : c.view(i * p.m * p.n, {p.m, p.n});
      matmul(ci, ai, bi, p.transpose_a, p.transpose_b, 0.75f, p.summed && i > 0 ? 1.0f : beta,
             cpu());
    }
    return c;
  };
  const auto bits = [](const Tensor& t) { return cast(t, DType::Float32, cpu()).to_host<float>(); };
  for_each_cpu_isa(Device::cpu(), [&](const std::string& where) {
    int compared = 0;
    for (const Product& size : {Product{1, 1, 1, 1}, Product{5, 49, 49, 16}, Product{4, 49, 16, 49},
                                Product{3, 13, 7, 300}, Product{0, 3, 4, 5}}) {
      for (int layout = 0; layout < 4; ++layout) {
        for (int form = 0; form < 4; ++form) {  // 3-D operands, shared b, shared a, the sum
          Product p = size;
          p.transpose_a = layout & 1, p.transpose_b = layout & 2;
          p.shared_b = form == 1, p.shared_a = form == 2, p.summed = form == 3;
          if (p.batch == 0 && form != 3) continue;
          for (DType in : {DType::Float32, DType::BFloat16, DType::Float16}) {
            // A 16-bit c beside 16-bit operands, never for the sum (refused).
            std::vector<DType> outs{DType::Float32};
            if (in != DType::Float32 && !p.summed) outs.push_back(in);
            for (DType out : outs) {
              const unsigned seed = unsigned(p.m * 7 + p.k * 3 + layout * 11 + form);
              const Tensor a = cast(
                  Tensor::from_host<float>(random_values(std::size_t(numel_of(p.a_shape())), seed),
                                           p.a_shape(), cpu()),
                  in, cpu());
              const Tensor b = cast(Tensor::from_host<float>(
                                        random_values(std::size_t(numel_of(p.b_shape())), seed + 1),
                                        p.b_shape(), cpu()),
                                    in, cpu());
              const std::size_t nc = std::size_t(numel_of(p.c_shape()));
              for (float beta : {0.0f, 1.0f}) {
                const auto c0 = beta == 0.0f ? std::vector<float>(nc, kNaN) : random_values(nc, 9);
                const Tensor start =
                    cast(Tensor::from_host<float>(c0, p.c_shape(), cpu()), out, cpu());
                Tensor batched = start.clone(cpu());
                batched_matmul(batched, a, b, p.transpose_a, p.transpose_b, 0.75f, beta, cpu());
                const Tensor expected = one_per_entry(p, a, b, start.clone(cpu()), beta);
                EXPECT_EQ(bits(batched), bits(expected))
                    << where << ", " << p.str() << ", " << dtype_name(in) << " into "
                    << dtype_name(out) << ", beta " << beta;
                ++compared;
              }
            }
          }
        }
      }
    }
    EXPECT_GT(compared, 400) << where;
  });
}

// The control: the comparison above sees a wrong entry. Entry 1 with beta 1 where the
// batch assigns differs from the batch's bits (c held random values, not NaN).
TEST(BatchedMatmulCpu, EveryIsaComparisonCanFail) {
  const Product p{3, 49, 49, 16};
  const Tensor a = Tensor::from_host<float>(random_values(std::size_t(numel_of(p.a_shape())), 1),
                                            p.a_shape(), cpu());
  const Tensor b = Tensor::from_host<float>(random_values(std::size_t(numel_of(p.b_shape())), 2),
                                            p.b_shape(), cpu());
  const Tensor start = Tensor::from_host<float>(
      random_values(std::size_t(numel_of(p.c_shape())), 3), p.c_shape(), cpu());
  Tensor batched = start.clone(cpu()), wrong = start.clone(cpu());
  batched_matmul(batched, a, b, false, false, 1.0f, 0.0f, cpu());
  for (std::int64_t i = 0; i < p.batch; ++i) {
    const auto view = [&](const Tensor& x, std::int64_t rows, std::int64_t cols) {
      return x.view(i * rows * cols, {rows, cols});
    };
    matmul(view(wrong, p.m, p.n), view(a, p.m, p.k), view(b, p.k, p.n), false, false, 1.0f,
           i == 1 ? 1.0f : 0.0f, cpu());
  }
  EXPECT_NE(batched.to_host<float>(), wrong.to_host<float>());
}

TEST(BatchedMatmulCpu, Float64SumAndSharedOperandAreTheReference) {
  Tensor a = random_double_tensor({3, 6, 4}, 13), b = random_double_tensor({6, 5}, 14);
  Tensor c = Tensor::empty({3, 4, 5}, cpu(), DType::Float64);
  batched_matmul(c, a, b, true, false, 1.0f, 0.0f, cpu());
  std::vector<double> expected(60);
  reference::batched_matmul(true, false, 3, 4, 5, 6, 1.0, a.data<double>(), 24, b.data<double>(), 0,
                            0.0, expected.data(), 20);
  EXPECT_EQ(c.to_host<double>(), expected);
  Tensor b3 = random_double_tensor({3, 6, 5}, 15);
  Tensor sum = random_double_tensor({4, 5}, 16);
  std::vector<double> expected_sum = sum.to_host<double>();
  batched_matmul(sum, a, b3, true, false, 1.0f, 1.0f, cpu());
  reference::batched_matmul(true, false, 3, 4, 5, 6, 1.0, a.data<double>(), 24, b3.data<double>(),
                            30, 1.0, expected_sum.data(), 0);
  EXPECT_EQ(sum.to_host<double>(), expected_sum);
}

TEST(BatchedMatmulCpu, Float64IsTheReference) {
  Tensor a = random_double_tensor({3, 4, 6}, 11), b = random_double_tensor({6, 5}, 12);
  Tensor c = Tensor::empty({3, 4, 5}, cpu(), DType::Float64);
  batched_matmul(c, a, b, false, false, 1.0f, 0.0f, cpu());
  std::vector<double> expected(60);
  reference::batched_matmul(false, false, 3, 4, 5, 6, 1.0, a.data<double>(), 24, b.data<double>(),
                            0, 0.0, expected.data(), 20);
  EXPECT_EQ(c.to_host<double>(), expected);
  // a^T is [3,6,4]: its K = 4 against b's 6.
  EXPECT_THROW_WITH(batched_matmul(c, a, b, true, false, 1.0f, 0.0f, cpu()), ShapeError,
                    "inner dimensions 4 and 6 differ");
}

// bfloat16 and float16 a and b (matmul's 16-bit path per entry: on CUDA the inputs
// widened to float32), within the same bound from the widened values.
TEST_P(BatchedMatmulTest, SixteenBitInputs) {
  const Product p{3, 5, 4, 7};
  const auto a = random_values(std::size_t(numel_of(p.a_shape())), 21);
  const auto b = random_values(std::size_t(numel_of(p.b_shape())), 22);
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    const Tensor a16 = cast(make(a, p.a_shape()), dtype, stream());
    const Tensor b16 = cast(make(b, p.b_shape()), dtype, stream());
    Tensor c = Tensor::empty(p.c_shape(), stream());
    batched_matmul(c, a16, b16, false, false, 1.0f, 0.0f, stream());
    const auto wa = host(cast(a16, DType::Float32, stream()));
    const auto wb = host(cast(b16, DType::Float32, stream()));
    EXPECT_TRUE(within_matmul_tolerance(p, host(c), wa, wb, std::vector<float>(60), 1.0, 0.0))
        << dtype_name(dtype);
    Tensor summed = Tensor::empty({5, 4}, stream(), dtype);
    EXPECT_THROW_WITH(batched_matmul(summed, a16, b16, false, false, 1.0f, 0.0f, stream()),
                      NotSupported, "the sum over the batch takes a float32 or float64 c");
  }
}

TEST(BatchedMatmulGradient, ThroughTheTape) {
  // Every layout, b 3-D and shared, a shared; the loss weights the product.
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (int shared : {0, 1, 2}) {  // none, b, a
        Product p{3, 4, 5, 2, ta, tb, shared == 2, shared == 1};
        Tensor a = random_double_tensor(p.a_shape(), 51);
        Tensor b = random_double_tensor(p.b_shape(), 52);
        Tensor w = random_double_tensor(p.c_shape(), 53);
        auto forward = [&](Tape& tape, const std::vector<Var>& v) {
          return ag::sum(ag::mul(ag::batched_matmul(v[0], v[1], ta, tb), tape.constant(w)));
        };
        EXPECT_TRUE(check_tape_gradient(forward, {a, b})) << p.str();
      }
    }
  }
}

// One Var on both sides, a a^T (self-attention's scores): the two gradients add, into a
// tape-made gradient that the first write assigns (poisoned with NaN if it read it).
TEST(BatchedMatmulGradient, OneVarOnBothSidesAddsUp) {
  Tensor x = random_double_tensor({2, 3, 4}, 61);
  Tensor w = random_double_tensor({2, 3, 3}, 62);
  auto forward = [&](Tape& tape, const std::vector<Var>& v) {
    const Var h = ag::scale(v[0], 1.0);  // an intermediate: its gradient is the tape's
    return ag::sum(ag::mul(ag::batched_matmul(h, h, false, true), tape.constant(w)));
  };
  EXPECT_TRUE(check_tape_gradient(forward, {x}));
  Tape tape(cpu());
  EXPECT_THROW_WITH(ag::batched_matmul(tape.constant(w.reshape({18})), tape.constant(x)),
                    ShapeError, "must be 3-D [B, rows, cols], or one of them 2-D");
}

// Inputs and outputs for tests/ops_vs_torch_test.py (ctest ops_vs_torch): per backend
// and dtype, through the tape, a [3,5,7] times b [3,7,4] ("bmm"), times b^T stored
// [3,4,7] ("bmm_bt"), and times a shared b [7,4] ("shared_b"): grad_y, y, grad_a, grad_b.
TEST(BatchedMatmulVsTorch, WritesCases) {
  std::vector<std::pair<std::string, Tensor>> out;
  const auto a_values = random_values(105, 101);
  const std::vector<std::tuple<std::string, Shape, bool>> cases = {
      {"bmm", {3, 7, 4}, false}, {"bmm_bt", {3, 4, 7}, true}, {"shared_b", {7, 4}, false}};
  for (const TorchCaseBackend& backend : torch_case_backends()) {
    const Stream& stream = backend.stream();
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const auto& [name, b_shape, tb] = cases[i];
      const std::string op = backend.prefix + name;
      const Tensor a = backend.make(a_values, {3, 5, 7});
      const Tensor b =
          backend.make(random_values(std::size_t(numel_of(b_shape)), unsigned(102 + i)), b_shape);
      const Tensor gy = backend.make(random_values(60, unsigned(110 + i)), {3, 5, 4});
      Tensor grad_a = Tensor::zeros(a.shape(), stream, backend.dtype);
      Tensor grad_b = Tensor::zeros(b.shape(), stream, backend.dtype);
      Tape tape(stream);
      const Var y = ag::batched_matmul(tape.variable(a, grad_a, "a"), tape.variable(b, grad_b, "b"),
                                       false, tb);
      tape.backward(y, gy);
      out.insert(out.end(), {{op + "/a", a},
                             {op + "/b", b},
                             {op + "/grad_y", gy},
                             {op + "/y", y.value()},
                             {op + "/grad_a", grad_a},
                             {op + "/grad_b", grad_b}});
    }
  }
  write_torch_cases("batched_matmul.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
