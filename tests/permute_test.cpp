// Permute and transpose, forward and backward, on every backend against their
// reference: every permutation of a 4-D tensor, odd sizes through the CPU's tiles and
// CUDA's shared-memory transpose, the merged layout, 16-bit values moved bit for bit,
// add-versus-assign sentinels, the errors, and float64 gradient checks through the
// tape.
// The files an op takes, in order: the top of kernels/relu.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "gradcheck.h"
#include "kernels/permute_plan.h"
#include "kernels/reference/permute.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string str(const Shape& shape, const std::vector<std::int64_t>& dims) {
  return to_string(shape) + " by " + to_string(dims);
}

std::vector<float> reference_permute(std::vector<float> y, const std::vector<float>& x,
                                     const Shape& shape, const std::vector<std::int64_t>& dims,
                                     GradWrite write) {
  reference::permute(y.data(), x.data(), shape, dims, write);
  return y;
}

class PermuteTest : public BackendTest {
 protected:
  // Forward against the reference (a copy: exactly), then the backward added onto a
  // sentinel of 0.5 and assigned over NaN, against the reference's.
  void check(const Shape& shape, const std::vector<std::int64_t>& dims) {
    const std::int64_t n = numel_of(shape);
    std::vector<std::int64_t> resolved = dims;  // the reference takes no negative entries
    for (std::int64_t& d : resolved) d += d < 0 ? std::int64_t(shape.size()) : 0;
    const auto values = random_values(std::size_t(n), unsigned(n + dims[0]));
    const Shape y_shape = permuted_shape("test", shape, dims);
    Tensor y = Tensor::empty(y_shape, stream());
    permute_forward(y, make(values, shape), dims, stream());
    const auto expected = reference_permute(std::vector<float>(values.size()), values, shape,
                                            resolved, GradWrite::Assign);
    EXPECT_EQ(host(y), expected) << str(shape, dims);
    // The backward takes y's shape back to x's: the reference on y with the inverse.
    const auto grad_y = random_values(std::size_t(n), unsigned(n + 5));
    const std::vector<std::int64_t> inverse = inverse_permutation(dims);
    const std::vector<float> sentinel(values.size(), 0.5f);
    Tensor grad_x = make(sentinel, shape);
    permute_backward(grad_x, make(grad_y, y_shape), dims, stream());
    EXPECT_EQ(host(grad_x),
              reference_permute(sentinel, grad_y, y_shape, inverse, GradWrite::Accumulate))
        << "backward " << str(shape, dims);
    Tensor assigned = make(std::vector<float>(values.size(), kNaN), shape);
    permute_backward(assigned, make(grad_y, y_shape), dims, stream(), GradWrite::Assign);
    EXPECT_EQ(host(assigned), reference_permute(std::vector<float>(values.size()), grad_y, y_shape,
                                                inverse, GradWrite::Assign))
        << "assigned " << str(shape, dims);
  }
};
TL_INSTANTIATE_BACKENDS(PermuteTest);

TEST_P(PermuteTest, EveryPermutationOfFourDimensions) {
  std::vector<std::int64_t> dims = {0, 1, 2, 3};
  int count = 0;
  do {
    check({2, 3, 5, 7}, dims);
    ++count;
  } while (std::next_permutation(dims.begin(), dims.end()));
  EXPECT_EQ(count, 24);
}

TEST_P(PermuteTest, OddSizesAndTiles) {
  // Transposes of the last two dimensions past one tile and at ragged edges (the CPU's
  // 32 x 32 tiles, CUDA's shared-memory tiles), with and without a batch.
  check({1}, {0});
  check({5, 7}, {1, 0});
  check({130, 257}, {1, 0});
  check({3, 33, 65}, {0, 2, 1});
  check({2, 70, 31}, {1, 0, 2});            // keeps the last dimension: whole rows
  check({3, 49, 4, 16}, {0, 2, 1, 3});      // a multi-head split's rows (the ViT's)
  check({3, 4, 49, 16}, {0, 2, 1, 3});      // and their merge
  check({2, 5, 3, 7, 3}, {2, 0, 3, 1, 4});  // rows through an odometer of four dimensions
  check({7, 1, 9, 3}, {3, 1, 0, 2});        // a size-1 dimension dropped
  check({4, 1}, {1, 0});                    // a transpose that moves nothing
  check({2, 3, 4, 5, 6}, {4, 2, 0, 3, 1});
  check({2, 3, 4}, {-1, 0, -2});  // entries counted from the end
  // Not trivial: a transpose moves values.
  Tensor y = Tensor::empty({3, 2}, stream());
  permute_forward(y, make({1, 2, 3, 4, 5, 6}, {2, 3}), {1, 0}, stream());
  EXPECT_EQ(host(y), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

TEST_P(PermuteTest, EmptyAndScalarTensors) {
  Tensor y = Tensor::empty({0, 3}, stream());
  permute_forward(y, Tensor::empty({3, 0}, stream()), {1, 0}, stream());
  EXPECT_EQ(y.numel(), 0);
  Tensor s = Tensor::empty({}, stream());
  permute_forward(s, make({2.5f}, {}), {}, stream());
  EXPECT_EQ(host(s), std::vector<float>{2.5f});
}

TEST_P(PermuteTest, SixteenBitValuesMoveBitForBit) {
  const Shape shape = {3, 40, 33};
  const auto values = random_values(std::size_t(numel_of(shape)), 17);
  const std::vector<std::int64_t> dims = {0, 2, 1};
  const auto expected =
      reference_permute(std::vector<float>(values.size()), values, shape, dims, GradWrite::Assign);
  auto widened = [&](const Tensor& t) { return host(cast(t, DType::Float32, stream())); };
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    Tensor x = cast(make(values, shape), dtype, stream());
    Tensor y = Tensor::empty({3, 33, 40}, stream(), dtype);
    permute_forward(y, x, dims, stream());
    // Rounded once either way: the moved 16-bit values widen to the rounded reference.
    EXPECT_EQ(widened(y), widened(cast(make(expected, {3, 33, 40}), dtype, stream())))
        << dtype_name(dtype);
    // Accumulating adds in float32 and rounds once: 1 + 2^-9 is 1 in bfloat16 and not in
    // float16.
    Tensor acc = cast(make(std::vector<float>(2, 1.0f), {2, 1}), dtype, stream());
    permute_backward(acc, cast(make(std::vector<float>(2, 1.0f / 512), {1, 2}), dtype, stream()),
                     {1, 0}, stream());
    EXPECT_EQ(widened(acc)[0], dtype == DType::BFloat16 ? 1.0f : 1.0f + 1.0f / 512)
        << dtype_name(dtype);
  }
}

TEST_P(PermuteTest, RejectsBadDimsAndShapes) {
  Tensor x = Tensor::zeros({2, 3}, stream());
  Tensor y = Tensor::zeros({3, 2}, stream());
  EXPECT_THROW_WITH(permute_forward(y, x, {0, 0}, stream()), InvalidArgument,
                    "permute_forward: dims (0,0) are not a permutation of the 2 dimensions of "
                    "[2,3]");
  EXPECT_THROW_WITH(permute_forward(y, x, {1}, stream()), InvalidArgument,
                    "permute_forward: dims (1) are not a permutation");
  EXPECT_THROW_WITH(permute_forward(y, x, {1, 2}, stream()), InvalidArgument,
                    "dims (1,2) are not a permutation");
  EXPECT_THROW_WITH(permute_forward(y, x, {-3, 0}, stream()), InvalidArgument,
                    "dims (-3,0) are not a permutation");
  EXPECT_THROW_WITH(permute_forward(x, x, {1, 0}, stream()), ShapeError,
                    "permute_forward: the output is float32[2,3]");
  Tensor square = Tensor::zeros({3, 3}, stream());
  EXPECT_THROW_WITH(permute_forward(square, square, {1, 0}, stream()), InvalidArgument,
                    "overlaps the input");
  EXPECT_THROW_WITH(permute_backward(y, y, {1, 0}, stream()), ShapeError,
                    "permute_backward: the output is float32[3,2]");
  Tensor h = Tensor::zeros({3, 2}, stream(), DType::BFloat16);
  EXPECT_THROW_WITH(permute_forward(h, x, {1, 0}, stream()), ShapeError,
                    "permute_forward: x is float32[2,3]");
  EXPECT_THROW_WITH(
      transpose_dims("transpose", 3, 0, 3), InvalidArgument,
      "transpose: dimension 3 is out of range for a tensor of rank 3 (expected -3..2)");
}

// The merged layout the backends move (kernels/permute_plan.h).
TEST(PermutePlan, MergesDimensionsThatStayTogether) {
  const PermutePlan swap_last = plan_permute("test", {2, 3, 4, 5}, {0, 1, 3, 2});
  EXPECT_EQ(swap_last.rank, 3);
  EXPECT_EQ((std::vector<std::int64_t>(swap_last.shape, swap_last.shape + 3)),
            (std::vector<std::int64_t>{6, 5, 4}));
  EXPECT_EQ((std::vector<std::int64_t>(swap_last.x_stride, swap_last.x_stride + 3)),
            (std::vector<std::int64_t>{20, 1, 5}));
  EXPECT_TRUE(swap_last.is_batched_transpose());
  const PermutePlan identity = plan_permute("test", {2, 3, 4}, {0, 1, 2});
  EXPECT_EQ(identity.rank, 1);
  EXPECT_EQ(identity.shape[0], 24);
  const PermutePlan heads =
      plan_permute("test", {2, 7, 4, 8}, {0, 2, 1, 3});  // [B,T,H,D] -> [B,H,T,D]
  EXPECT_EQ(heads.rank, 4);
  EXPECT_FALSE(heads.is_batched_transpose());
  EXPECT_EQ(heads.x_contiguous_dim(), 3);
  const PermutePlan ones = plan_permute("test", {1, 5, 1}, {2, 1, 0});
  EXPECT_EQ(ones.rank, 1);  // only the 5 is left
  const Shape nine(9, 2);
  EXPECT_THROW_WITH(plan_permute("permute_forward", nine, {8, 7, 6, 5, 4, 3, 2, 1, 0}),
                    NotSupported, "moves 9 separate dimensions; at most 8");
}

TEST(PermuteCpu, Float64IsTheReference) {
  Tensor x = random_double_tensor({3, 4, 5}, 7);
  Tensor y = Tensor::empty({5, 3, 4}, cpu(), DType::Float64);
  permute_forward(y, x, {2, 0, 1}, cpu());
  std::vector<double> expected(60);
  reference::permute(expected.data(), x.data<double>(), {3, 4, 5}, {2, 0, 1}, GradWrite::Assign);
  EXPECT_EQ(y.to_host<double>(), expected);
}

// The CPU's threads each take rows or tile strips: the same bits on 1 and 2 threads.
TEST(PermuteCpu, SameBitsOnAnyNumberOfThreads) {
  const int saved = num_threads();
  const Shape shape = {4, 300, 129};
  const auto values = random_values(std::size_t(numel_of(shape)), 23);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor y = Tensor::empty({4, 129, 300}, cpu());
    permute_forward(y, Tensor::from_host<float>(values, shape, cpu()), {0, 2, 1}, cpu());
    results.push_back(y.to_host<float>());
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
}

// Rows copied whole: each thread finds its first row's place in x by division and
// the next ones by counting (kernels/cpu/permute.cpp); on 1, 2 and 3 threads, whose
// ranges start at different places of the count, the reference's values.
TEST(PermuteCpu, RowsOnAnyNumberOfThreads) {
  const int saved = num_threads();
  const Shape shape = {3, 7, 5, 9};
  const std::vector<std::int64_t> dims = {2, 0, 1, 3};
  const auto values = random_values(std::size_t(numel_of(shape)), 29);
  const auto expected =
      reference_permute(std::vector<float>(values.size()), values, shape, dims, GradWrite::Assign);
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor y = Tensor::empty({5, 3, 7, 9}, cpu());
    permute_forward(y, Tensor::from_host<float>(values, shape, cpu()), dims, cpu());
    EXPECT_EQ(y.to_host<float>(), expected) << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(PermuteGradient, ThroughTheTape) {
  Tensor x = random_double_tensor({2, 3, 4}, 31);
  Tensor w = random_double_tensor({4, 3, 2}, 32);
  // x is used three times: permuted, transposed and as itself; the contributions add.
  auto forward = [&](Tape& tape, const std::vector<Var>& in) {
    const Var& v = in[0];
    const Var p = ag::permute(v, {2, 1, 0});
    const Var t = ag::transpose(v, -1, 0);
    return ag::add(ag::sum(ag::mul(ag::mul(p, t), tape.constant(w))), ag::sum(ag::mul(v, v)));
  };
  EXPECT_TRUE(check_tape_gradient(forward, {x}));
  Tape tape(cpu());
  EXPECT_THROW_WITH(ag::transpose(tape.constant(x), 0, 3), InvalidArgument,
                    "transpose: dimension 3 is out of range for a tensor of rank 3");
  EXPECT_THROW_WITH(ag::permute(tape.constant(x), {0, 1}), InvalidArgument,
                    "permute: dims (0,1) are not a permutation of the 3 dimensions of [2,3,4]");
}

// Inputs and outputs for tests/ops_vs_torch_test.py (ctest ops_vs_torch): per backend
// and dtype, x [2,3,4,5] and each case's grad_y, then y and grad_x (through the tape)
// of permute (0,2,3,1), of the head split (0,2,1,3) and of transpose(-1, -2).
TEST(PermuteVsTorch, WritesCases) {
  std::vector<std::pair<std::string, Tensor>> out;
  const Shape shape = {2, 3, 4, 5};
  const auto x_values = random_values(120, 71);
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> cases = {
      {"permute_0231", {0, 2, 3, 1}}, {"permute_0213", {0, 2, 1, 3}}, {"transpose", {0, 1, 3, 2}}};
  for (const TorchCaseBackend& backend : torch_case_backends()) {
    const Tensor x = backend.make(x_values, shape);
    out.emplace_back(backend.prefix + "x", x);
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const auto& [name, dims] = cases[c];
      const Shape y_shape = permuted_shape("test", shape, dims);
      const Tensor gy = backend.make(random_values(120, unsigned(72 + c)), y_shape);
      Tape tape(backend.stream());
      Tensor grad = Tensor::zeros(shape, backend.stream(), backend.dtype);
      Var v = tape.variable(x, grad, "x");
      const Var y = name == "transpose" ? ag::transpose(v, -1, -2) : ag::permute(v, dims);
      tape.backward(y, gy);
      const std::string op = backend.prefix + name;
      out.insert(out.end(), {{op + "/grad_y", gy}, {op + "/y", y.value()}, {op + "/grad_x", grad}});
    }
  }
  write_torch_cases("permute.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
