// Slice copy (kernels/slice_copy.h) on every backend against its reference, and the
// ops it serves, concat, split and slice (autograd/ops.h): every dimension, odd sizes
// and offsets, the untouched rest of dst, 16-bit values, add-versus-assign sentinels
// (a Var given twice to concat), the errors, and float64 gradient checks through the
// tape.
// The files an op takes, in order: the top of kernels/relu.h.
#include <cmath>
#include <limits>
#include <string>

#include "gradcheck.h"
#include "kernels/reference/slice_copy.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One slice copy: dst [O, m, I] at dst_begin <- src [O, n, I] at src_begin, `length`
// entries of dimension `dim` (the middle one of the shapes, written out whole).
struct Case {
  Shape dst, src;
  std::int64_t dim, dst_begin, src_begin, length;
};

class SliceCopyTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(SliceCopyTest);

TEST_P(SliceCopyTest, MatchesReferenceOnEveryDimension) {
  const std::vector<Case> cases = {
      {{7}, {3}, 0, 4, 0, 3},                    // a vector: concat's second piece
      {{5, 9}, {5, 4}, 1, 2, 1, 3},              // the last dimension, offsets on both sides
      {{6, 3, 5}, {2, 3, 5}, 0, 1, 0, 2},        // the first: one run
      {{2, 11, 33}, {2, 70, 33}, 1, 0, 37, 11},  // split's piece from a larger src
      {{3, 4, 5, 6}, {3, 4, 2, 6}, -2, 3, 0, 2},
      {{4, 0, 3}, {4, 5, 3}, 1, 0, 2, 0},  // nothing to copy
  };
  for (const Case& c : cases) {
    const std::int64_t d = c.dim < 0 ? c.dim + std::int64_t(c.dst.size()) : c.dim;
    std::int64_t outer = 1, inner = 1;
    for (std::int64_t k = 0; k < d; ++k) outer *= c.dst[std::size_t(k)];
    for (std::size_t k = std::size_t(d) + 1; k < c.dst.size(); ++k) inner *= c.dst[k];
    const std::int64_t m = c.dst[std::size_t(d)], n = c.src[std::size_t(d)];
    const auto src = random_values(std::size_t(numel_of(c.src)), unsigned(m + n));
    for (GradWrite write : {GradWrite::Assign, GradWrite::Accumulate}) {
      // A sentinel of 0.5 in dst: kept outside the block, added to inside it when
      // accumulating.
      std::vector<float> expected(std::size_t(numel_of(c.dst)), 0.5f);
      Tensor dst = make(expected, c.dst);
      slice_copy(dst, c.dst_begin, make(src, c.src), c.src_begin, c.length, c.dim, write, stream());
      reference::slice_copy(expected.data(), m, c.dst_begin, src.data(), n, c.src_begin, c.length,
                            outer, inner, write);
      EXPECT_EQ(host(dst), expected) << to_string(c.dst) << " <- " << to_string(c.src);
      // Not trivial: the block's first entry moved (or was added to).
      if (c.length > 0) EXPECT_NE(expected[std::size_t(c.dst_begin * inner)], 0.5f);
    }
  }
}

TEST_P(SliceCopyTest, SixteenBitValuesAndAccumulation) {
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    Tensor dst = cast(make({1, 1, 1, 1}, {2, 2}), dtype, stream());
    Tensor src = cast(make({0.25f, 1.0f / 512}, {2, 1}), dtype, stream());
    slice_copy(dst, 1, src, 0, 1, 1, GradWrite::Accumulate, stream());
    // Added in float32 and rounded once: 1 + 2^-9 is 1 in bfloat16 and not in float16.
    EXPECT_EQ(
        host(cast(dst, DType::Float32, stream())),
        (std::vector<float>{1, 1.25f, 1, dtype == DType::BFloat16 ? 1.0f : 1.0f + 1.0f / 512}))
        << dtype_name(dtype);
    slice_copy(dst, 0, src, 0, 1, -1, GradWrite::Assign, stream());
    EXPECT_EQ(host(cast(dst, DType::Float32, stream()))[2], 1.0f / 512) << dtype_name(dtype);
  }
}

TEST_P(SliceCopyTest, RejectsBadArguments) {
  Tensor dst = Tensor::zeros({2, 5}, stream());
  Tensor src = Tensor::zeros({2, 3}, stream());
  EXPECT_THROW_WITH(slice_copy(dst, 0, src, 0, 3, 2, GradWrite::Assign, stream()), InvalidArgument,
                    "slice_copy: dimension 2 is out of range for [2,5] (rank 2: expected -2..1)");
  EXPECT_THROW_WITH(slice_copy(dst, 0, src, 0, 3, -3, GradWrite::Assign, stream()), InvalidArgument,
                    "dimension -3 is out of range");
  EXPECT_THROW_WITH(slice_copy(dst, 0, src, 0, 2, 0, GradWrite::Assign, stream()), ShapeError,
                    "slice_copy: dst float32[2,5] on " + device().str() + " and src float32[2,3]");
  EXPECT_THROW_WITH(
      slice_copy(dst, 3, src, 0, 3, 1, GradWrite::Assign, stream()), InvalidArgument,
      "entries [0, 3) of src float32[2,3] on " + device().str() + " into [3, 6) of dst");
  EXPECT_THROW_WITH(slice_copy(dst, 0, src, 1, 3, 1, GradWrite::Assign, stream()), InvalidArgument,
                    "do not lie inside both");
  EXPECT_THROW_WITH(slice_copy(dst, 0, src, 0, -1, 1, GradWrite::Assign, stream()), InvalidArgument,
                    "do not lie inside both");
  EXPECT_THROW_WITH(
      slice_copy(dst.slice(0, 1), 0, dst.slice(0, 1), 0, 1, 1, GradWrite::Assign, stream()),
      InvalidArgument, "overlaps src");
  EXPECT_THROW_WITH(slice_copy(Tensor::zeros({2, 5}, stream(), DType::Float16), 0, src, 0, 3, 1,
                               GradWrite::Assign, stream()),
                    ShapeError, "slice_copy: src is float32[2,3]");
}

// concat, split and slice on the tape: values by hand, and the gradients of a Var given
// twice (assigned, then added to) against the first-write modes.
TEST_P(SliceCopyTest, ConcatSplitSliceOnTheTape) {
  for (Tape::FirstWrite mode :
       {Tape::FirstWrite::Assign, Tape::FirstWrite::Poisoned, Tape::FirstWrite::Zeroed}) {
    Tape tape(stream());
    tape.set_first_write(mode);
    Tensor grad_a = make(std::vector<float>(4, 0.0f), {2, 2});
    Tensor grad_b = make(std::vector<float>(2, 0.0f), {2, 1});
    Var a = tape.variable(make({1, 2, 3, 4}, {2, 2}), grad_a, "a");
    Var b = tape.variable(make({5, 6}, {2, 1}), grad_b, "b");
    // Intermediates (relu of a positive input is a copy) get tape-made gradients, which
    // the first write may assign.
    const Var ra = ag::relu(a), rb = ag::relu(b);
    const Var y = ag::concat({ra, rb, ra}, -1);  // [2,5]: a0 a1 b0 a0 a1 / a2 a3 b1 a2 a3
    EXPECT_EQ(host(y.value()), (std::vector<float>{1, 2, 5, 1, 2, 3, 4, 6, 3, 4}));
    const std::vector<Var> pieces = ag::split(y, {1, 3, 1}, 1);
    ASSERT_EQ(pieces.size(), 3u);
    EXPECT_EQ(host(pieces[1].value()), (std::vector<float>{2, 5, 1, 4, 6, 3}));
    const Var row = ag::slice(y, 0, 1, 2);  // [1,5]
    EXPECT_EQ(host(row.value()), (std::vector<float>{3, 4, 6, 3, 4}));
    // loss = 10 sum(piece 1) + 100 sum(row); piece 0 and 2 unused.
    const Var loss = ag::add(ag::scale(ag::sum(pieces[1]), 10), ag::scale(ag::sum(row), 100));
    tape.backward(loss);
    // dL/dy: 10 on columns 1..3, 100 more on row 1.
    // a0 (y[0,0], y[0,3]) = 0 + 10; a1 (y[0,1], y[0,4]) = 10 + 0; a2 = 100 + 110; a3 = 110 + 100.
    EXPECT_EQ(host(grad_a), (std::vector<float>{10, 10, 210, 210})) << int(mode);
    EXPECT_EQ(host(grad_b), (std::vector<float>{10, 110})) << int(mode);
  }
}

TEST_P(SliceCopyTest, OpsNameThemselvesInErrors) {
  Tape tape(stream());
  Var a = tape.constant(Tensor::zeros({2, 3}, stream()), "a");
  Var b = tape.constant(Tensor::zeros({3, 3}, stream()), "b");
  EXPECT_THROW_WITH(ag::concat({a, b}, 1), ShapeError,
                    "concat: b float32[3,3] and a float32[2,3] must have one dtype and rank and "
                    "agree in every dimension but 1");
  EXPECT_THROW_WITH(ag::concat({a, b}, 2), InvalidArgument, "concat: dimension 2 is out of range");
  EXPECT_THROW_WITH(ag::concat({}, 0), InvalidArgument, "concat: no inputs");
  EXPECT_THROW_WITH(ag::split(a, {1, 1}, 1), ShapeError,
                    "split: sizes [1,1] do not cut dimension 1 of a float32[2,3]");
  EXPECT_THROW_WITH(ag::split(a, {4, -1}, 1), ShapeError, "split: sizes [4,-1]");
  EXPECT_THROW_WITH(ag::slice(a, -1, 2, 4), InvalidArgument,
                    "slice: [2, 4) is not a range of dimension 1 of a float32[2,3]");
  EXPECT_THROW_WITH(ag::slice(a, 0, 2, 1), InvalidArgument, "slice: [2, 1)");
}

TEST(SliceCopyCpu, Float64IsTheReference) {
  Tensor src = random_double_tensor({3, 8, 5}, 3);
  Tensor dst = random_double_tensor({3, 6, 5}, 4);
  std::vector<double> expected = dst.to_host<double>();
  slice_copy(dst, 2, src, 3, 4, 1, GradWrite::Accumulate, cpu());
  reference::slice_copy(expected.data(), 6, 2, src.data<double>(), 8, 3, 4, 3, 5,
                        GradWrite::Accumulate);
  EXPECT_EQ(dst.to_host<double>(), expected);
}

TEST(SliceCopyGradient, ThroughTheTape) {
  Tensor a = random_double_tensor({2, 3, 4}, 41);
  Tensor b = random_double_tensor({2, 2, 4}, 42);
  Tensor w = random_double_tensor({2, 8, 4}, 43);
  // concat(a, b, a) along 1, then split and slice of it, weighted: a appears twice.
  auto forward = [&](Tape& tape, const Var& va, const Var& vb) {
    const Var y = ag::concat({va, vb, va}, 1);  // [2,8,4]
    const std::vector<Var> parts = ag::split(y, {5, 3}, -2);
    const Var tail = ag::slice(parts[0], 2, 1, 3);  // [2,5,2]
    return ag::add(ag::sum(ag::mul(y, tape.constant(w))),
                   ag::add(ag::sum(ag::mul(parts[1], parts[1])), ag::sum(ag::mul(tail, tail))));
  };
  auto loss_fn = [&](const std::vector<Tensor>& in) {
    Tape tape(cpu());
    return forward(tape, tape.constant(in[0]), tape.constant(in[1])).value().to_host<double>()[0];
  };
  Tensor grad_a = Tensor::zeros({2, 3, 4}, cpu(), DType::Float64);
  Tensor grad_b = Tensor::zeros({2, 2, 4}, cpu(), DType::Float64);
  Tape tape(cpu());
  Var va = tape.variable(a, grad_a, "a");
  Var vb = tape.variable(b, grad_b, "b");
  tape.backward(forward(tape, va, vb));
  EXPECT_TRUE(check_gradient(loss_fn, {a, b}, {grad_a, grad_b}));
}

// Inputs and outputs for tests/ops_vs_torch_test.py (ctest ops_vs_torch): per backend
// and dtype, through the tape: cat of a [2,3,4] and b [2,5,4] along 1 (y, grad_a,
// grad_b), split of x [3,10] into (3, 7) along -1 (each piece, grad_x from both
// pieces' grad_y), and x[:, 1:3] of x [4,6,5] along 1 (y, grad_x).
TEST(SliceCopyVsTorch, WritesCases) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const TorchCaseBackend& backend : torch_case_backends()) {
    const std::string& p = backend.prefix;
    const Stream& stream = backend.stream();
    auto leaf = [&](Tape& tape, const std::string& name, const Shape& shape, unsigned seed,
                    Tensor& grad) {
      const Tensor value = backend.make(random_values(std::size_t(numel_of(shape)), seed), shape);
      grad = Tensor::zeros(shape, stream, backend.dtype);
      out.emplace_back(p + name, value);
      return tape.variable(value, grad, name);
    };
    auto upstream = [&](const std::string& name, const Shape& shape, unsigned seed) {
      const Tensor g = backend.make(random_values(std::size_t(numel_of(shape)), seed), shape);
      out.emplace_back(p + name, g);
      return g;
    };
    {
      Tape tape(stream);
      Tensor grad_a, grad_b;
      const Var a = leaf(tape, "cat/a", {2, 3, 4}, 81, grad_a);
      const Var b = leaf(tape, "cat/b", {2, 5, 4}, 82, grad_b);
      const Var y = ag::concat({a, b}, 1);
      tape.backward(y, upstream("cat/grad_y", {2, 8, 4}, 83));
      out.insert(
          out.end(),
          {{p + "cat/y", y.value()}, {p + "cat/grad_a", grad_a}, {p + "cat/grad_b", grad_b}});
    }
    {
      Tape tape(stream);
      Tensor grad_x;
      const Var x = leaf(tape, "split/x", {3, 10}, 84, grad_x);
      const std::vector<Var> pieces = ag::split(x, {3, 7}, -1);
      const Tensor g0 = upstream("split/grad_y0", {3, 3}, 85);
      const Tensor g1 = upstream("split/grad_y1", {3, 7}, 86);
      // One backward from both pieces: the sum of each weighted by its upstream gradient.
      const Var loss = ag::add(ag::sum(ag::mul(pieces[0], tape.constant(g0))),
                               ag::sum(ag::mul(pieces[1], tape.constant(g1))));
      tape.backward(loss);
      out.insert(out.end(), {{p + "split/y0", pieces[0].value()},
                             {p + "split/y1", pieces[1].value()},
                             {p + "split/grad_x", grad_x}});
    }
    {
      Tape tape(stream);
      Tensor grad_x;
      const Var x = leaf(tape, "slice/x", {4, 6, 5}, 87, grad_x);
      const Var y = ag::slice(x, 1, 1, 3);
      tape.backward(y, upstream("slice/grad_y", {4, 2, 5}, 88));
      out.insert(out.end(), {{p + "slice/y", y.value()}, {p + "slice/grad_x", grad_x}});
    }
  }
  write_torch_cases("slice_copy.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
