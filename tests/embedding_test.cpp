// Embedding forward and backward on every backend against the reference, bit for
// bit (odd sizes, ids of rank 1 to 3, repeated ids, add-versus-assign sentinels),
// the backward's summation order (with a control that another order changes the
// bits), bad ids (the CPU's errors, CUDA's poisoning and validate_embedding_ids),
// the shape errors, float64 gradient checks through the kernels and the tape, the
// layer, and the cases tests/ops_vs_torch_test.py compares with PyTorch.
// The files an op takes, in order: the top of kernels/relu.h.
#include <cmath>
#include <limits>
#include <string>

#include "gradcheck.h"
#include "kernels/reference/embedding.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// `count` ids in [0, rows) from a fixed seed, with repeats whenever count > rows
// and on purpose otherwise (every third id is the first one).
std::vector<float> random_ids(std::size_t count, std::int64_t rows, unsigned seed) {
  std::vector<float> ids = random_values(count, seed, 0.0f, float(rows));
  for (std::size_t i = 0; i < count; ++i) ids[i] = i % 3 == 2 ? ids[0] : std::floor(ids[i]);
  return ids;
}

Shape with_width(Shape shape, std::int64_t cols) {
  shape.push_back(cols);
  return shape;
}

std::vector<float> reference_forward(const std::vector<float>& ids, const std::vector<float>& table,
                                     std::int64_t cols) {
  std::vector<float> y(ids.size() * std::size_t(cols));
  reference::embedding_forward(y.data(), ids.data(), table.data(), 0, std::int64_t(ids.size()),
                               cols);
  return y;
}

std::vector<float> reference_backward(std::vector<float> grad_table,
                                      const std::vector<float>& grad_y,
                                      const std::vector<float>& ids, std::int64_t cols,
                                      GradWrite write) {
  const std::int64_t rows = std::int64_t(grad_table.size()) / cols;
  reference::embedding_backward(grad_table.data(), grad_y.data(), ids.data(),
                                std::int64_t(ids.size()), cols, 0, rows, write);
  return grad_table;
}

class EmbeddingTest : public BackendTest {
 protected:
  // The forward, the backward into a sentinel (accumulated) and into NaN (assigned),
  // each equal to the reference bit for bit.
  void check_all(std::int64_t rows, std::int64_t cols, const Shape& ids_shape,
                 const std::string& what) {
    const std::size_t count = std::size_t(numel_of(ids_shape));
    const auto ids = random_ids(count, rows, unsigned(rows * 7 + cols));
    const auto table = random_values(std::size_t(rows * cols), unsigned(rows + cols));
    const auto grad_y = random_values(count * std::size_t(cols), unsigned(cols * 3 + 1));
    const Shape y_shape = with_width(ids_shape, cols);
    Tensor y = Tensor::empty(y_shape, stream());
    embedding_forward(y, make(ids, ids_shape), make(table, {rows, cols}), stream());
    const auto out = host(y);
    EXPECT_EQ(out, reference_forward(ids, table, cols)) << what;
    // Not trivial: the rows differ, and a repeated id repeats its row.
    if (count > 3 && rows > 1) {
      EXPECT_EQ(std::vector<float>(out.begin() + 2 * cols, out.begin() + 3 * cols),
                std::vector<float>(out.begin(), out.begin() + cols))
          << what;
    }

    const auto sentinel = random_values(std::size_t(rows * cols), 5, 10.0f, 20.0f);
    Tensor grad_table = make(sentinel, {rows, cols});
    embedding_backward(grad_table, make(grad_y, y_shape), make(ids, ids_shape), stream());
    EXPECT_EQ(host(grad_table),
              reference_backward(sentinel, grad_y, ids, cols, GradWrite::Accumulate))
        << what << " (accumulated)";
    Tensor assigned = make(std::vector<float>(std::size_t(rows * cols), kNaN), {rows, cols});
    embedding_backward(assigned, make(grad_y, y_shape), make(ids, ids_shape), stream(),
                       GradWrite::Assign);
    const auto expected = reference_backward(std::vector<float>(std::size_t(rows * cols), kNaN),
                                             grad_y, ids, cols, GradWrite::Assign);
    EXPECT_EQ(host(assigned), expected) << what << " (assigned)";
  }
};
TL_INSTANTIATE_BACKENDS(EmbeddingTest);

TEST_P(EmbeddingTest, MatchesReferenceBitForBitOnOddSizes) {
  for (std::int64_t rows : {1, 7, 300}) {
    for (std::int64_t cols : {1, 3, 257}) {
      for (const Shape& ids_shape : {Shape{5}, Shape{3, 4}, Shape{2, 3, 5}, Shape{700}}) {
        check_all(
            rows, cols, ids_shape,
            std::to_string(rows) + "x" + std::to_string(cols) + " by " + to_string(ids_shape));
      }
    }
  }
}

TEST_P(EmbeddingTest, RepeatedIdsAddTheirRows) {
  // ids [4] = {2, 0, 2, 2} into a [3, 2] table: row 2 gets rows 0, 2 and 3 of grad_y,
  // row 0 gets row 1, row 1 none.
  const std::vector<float> ids = {2, 0, 2, 2};
  const std::vector<float> grad_y = {1, 2, 10, 20, 100, 200, 1000, 2000};
  Tensor grad_table = make({0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, {3, 2});  // added to
  embedding_backward(grad_table, make(grad_y, {4, 2}), make(ids, {4}), stream());
  EXPECT_EQ(host(grad_table), (std::vector<float>{10.5f, 20.5f, 0.5f, 0.5f, 1101.5f, 2202.5f}));
  Tensor assigned = make(std::vector<float>(6, kNaN), {3, 2});  // must not be read
  embedding_backward(assigned, make(grad_y, {4, 2}), make(ids, {4}), stream(), GradWrite::Assign);
  EXPECT_EQ(host(assigned), (std::vector<float>{10, 20, 0, 0, 1101, 2202}));
  // No ids: accumulating leaves grad_table alone, assigning zeroes it.
  Tensor none = make(std::vector<float>(6, kNaN), {3, 2});
  embedding_backward(none, Tensor::empty({0, 2}, stream()), Tensor::empty({0}, stream()), stream(),
                     GradWrite::Assign);
  EXPECT_EQ(host(none), std::vector<float>(6, 0.0f));
}

TEST_P(EmbeddingTest, BackwardAddsInIndexOrderEveryRun) {
  // 4000 ids over 3 rows: each row sums about 1300 rows of grad_y of mixed
  // magnitudes, where the order of the additions shows in the bits.
  const std::int64_t rows = 3, cols = 33, count = 4000;
  const auto ids = random_ids(count, rows, 17);
  auto grad_y = random_values(std::size_t(count * cols), 18);
  for (std::size_t i = 0; i < grad_y.size(); i += 7) grad_y[i] *= 1e4f;
  const auto expected = reference_backward(std::vector<float>(std::size_t(rows * cols), 0.0f),
                                           grad_y, ids, cols, GradWrite::Assign);
  for (int run = 0; run < 3; ++run) {
    Tensor grad_table = Tensor::empty({rows, cols}, stream());
    embedding_backward(grad_table, make(grad_y, {count, cols}), make(ids, {count}), stream(),
                       GradWrite::Assign);
    EXPECT_EQ(host(grad_table), expected) << "run " << run;
  }
  // Control: the same additions in reverse index order give other bits, so the
  // equality above says something about the order.
  std::vector<float> reversed(expected.size(), 0.0f);
  for (std::int64_t m = count - 1; m >= 0; --m) {
    const auto v = std::int64_t(ids[std::size_t(m)]);
    for (std::int64_t j = 0; j < cols; ++j)
      reversed[std::size_t(v * cols + j)] += grad_y[std::size_t(m * cols + j)];
  }
  EXPECT_NE(reversed, expected);
}

TEST_P(EmbeddingTest, BadIds) {
  const std::vector<float> table = {1, 2, 3, 4, 5, 6};    // [3, 2]
  const std::vector<float> ids = {0, 2, 1, 7.5f, 2, -1};  // [2, 3]: ids[1][0], ids[1][2] bad
  Tensor y = Tensor::empty({2, 3, 2}, stream());
  Tensor grad_table = make(std::vector<float>(6, 0.0f), {3, 2});
  const Tensor grad_y = make(std::vector<float>(12, 1.0f), {2, 3, 2});
  const char* message = "ids[1][0] = 7.5 is not a row id in [0, 3) (ids float32[2,3] on ";
  if (device().is_cpu()) {
    EXPECT_THROW_WITH(embedding_forward(y, make(ids, {2, 3}), make(table, {3, 2}), stream()),
                      SampleError, std::string("embedding_forward: ") + message);
    EXPECT_THROW_WITH(embedding_backward(grad_table, grad_y, make(ids, {2, 3}), stream()),
                      SampleError, std::string("embedding_backward: ") + message);
    EXPECT_EQ(host(grad_table), std::vector<float>(6, 0.0f));  // nothing written
    for (float bad : {kNaN, std::numeric_limits<float>::infinity(), 3.0f, 0.5f}) {
      EXPECT_THROW_WITH(embedding_forward(Tensor::empty({1, 2}, stream()), make({bad}, {1}),
                                          make(table, {3, 2}), stream()),
                        SampleError, "is not a row id in [0, 3)");
    }
  } else {
    // CUDA poisons: the bad ids' rows of y are NaN, their grad_y rows go nowhere.
    embedding_forward(y, make(ids, {2, 3}), make(table, {3, 2}), stream());
    const auto out = host(y);
    for (std::size_t i = 0; i < 12; ++i) {
      const bool bad = i / 2 == 3 || i / 2 == 5;
      EXPECT_EQ(std::isnan(out[i]), bad) << i;
    }
    EXPECT_EQ(out[2], 5.0f);
    embedding_backward(grad_table, grad_y, make(ids, {2, 3}), stream());
    EXPECT_EQ(host(grad_table), (std::vector<float>{1, 1, 1, 1, 2, 2}));
  }
  // On every device, validate_embedding_ids names the first bad id.
  EXPECT_THROW_WITH(validate_embedding_ids(make(ids, {2, 3}), 3, stream()), SampleError,
                    std::string("validate_embedding_ids: ") + message);
  EXPECT_NO_THROW(validate_embedding_ids(make({0, 2, 1, 7, 2, 5}, {2, 3}), 8, stream()));
  EXPECT_THROW_WITH(validate_embedding_ids(make({1, 2, 3.25f}, {3}), 8, stream()), SampleError,
                    "validate_embedding_ids: ids[2] = 3.25 is not a row id in [0, 8)");
  // A rank-0 ids has no row to name: InvalidArgument with the value.
  EXPECT_THROW_WITH(validate_embedding_ids(make({9}, {}), 8, stream()), InvalidArgument,
                    "validate_embedding_ids: ids = 9 is not a row id in [0, 8) (ids float32[] on ");
}

TEST_P(EmbeddingTest, RejectsBadShapesAndDtypes) {
  Tensor table = Tensor::zeros({4, 3}, stream());
  Tensor ids = Tensor::zeros({2, 5}, stream());
  EXPECT_THROW_WITH(
      embedding_forward(Tensor::empty({2, 5, 4}, stream()), ids, table, stream()), ShapeError,
      "embedding_forward: y is float32[2,5,4] on " + device().str() + " but ids float32[2,5] on " +
          device().str() + " and table float32[4,3] on " + device().str() + " need [2,5,3]");
  EXPECT_THROW_WITH(embedding_forward(Tensor::empty({2, 5, 3}, stream()), ids,
                                      Tensor::zeros({12}, stream()), stream()),
                    ShapeError, "embedding_forward: table must be [V, D] (rows, width), got");
  EXPECT_THROW_WITH(embedding_backward(table, Tensor::zeros({2, 4, 3}, stream()), ids, stream()),
                    ShapeError, "embedding_backward: grad_y is float32[2,4,3]");
  Tensor h = Tensor::zeros({4, 3}, stream(), DType::BFloat16);
  EXPECT_THROW_WITH(
      embedding_forward(Tensor::empty({2, 5, 3}, stream(), DType::BFloat16),
                        Tensor::zeros({2, 5}, stream(), DType::BFloat16), h, stream()),
      NotSupported, "embedding_forward: bfloat16 is not supported");
  // float32 ids name rows up to 2^24 exactly, no more.
  Tensor huge = Tensor::empty({(std::int64_t{1} << 24) + 1, 0}, stream());
  EXPECT_THROW_WITH(embedding_forward(Tensor::empty({2, 5, 0}, stream()), ids, huge, stream()),
                    NotSupported, "has more rows than float32 ids can name exactly (2^24)");
}

TEST(EmbeddingCpu, Float64IsTheReference) {
  const std::int64_t rows = 11, cols = 6;
  std::vector<double> ids;
  for (int m = 0; m < 40; ++m) ids.push_back(double((m * 7) % rows));
  Tensor id = Tensor::from_host<double>(ids, {5, 8}, cpu());
  Tensor table = random_double_tensor({rows, cols}, 3);
  Tensor y = Tensor::empty({5, 8, cols}, cpu(), DType::Float64);
  embedding_forward(y, id, table, cpu());
  std::vector<double> expected(40 * cols);
  reference::embedding_forward(expected.data(), ids.data(), table.data<double>(), 0, 40, cols);
  EXPECT_EQ(y.to_host<double>(), expected);
  Tensor grad_y = random_double_tensor({5, 8, cols}, 4);
  Tensor grad_table = random_double_tensor({rows, cols}, 5);
  std::vector<double> grad_expected = grad_table.to_host<double>();
  embedding_backward(grad_table, grad_y, id, cpu());
  reference::embedding_backward(grad_expected.data(), grad_y.data<double>(), ids.data(), 40, cols,
                                0, rows, GradWrite::Accumulate);
  EXPECT_EQ(grad_table.to_host<double>(), grad_expected);
}

// The CPU's backward splits the table's rows over the thread pool: the same bits
// with every thread count (a table large enough to be split).
TEST(EmbeddingCpu, ThreadCountDoesNotChangeTheBits) {
  const std::int64_t rows = 3000, cols = 40, count = 5000;
  const auto ids = random_ids(count, rows, 8);
  const auto grad_y = random_values(std::size_t(count * cols), 9);
  const int saved = num_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    Tensor grad_table = Tensor::empty({rows, cols}, cpu());
    embedding_backward(grad_table, Tensor::from_host<float>(grad_y, {count, cols}, cpu()),
                       Tensor::from_host<float>(ids, {count}, cpu()), cpu(), GradWrite::Assign);
    results.push_back(grad_table.to_host<float>());
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST(EmbeddingGradient, MatchesCentralDifferences) {
  const std::vector<double> ids = {3, 0, 3, 1, 4, 3, 0};  // 2 never named, 3 three times
  Tensor id = Tensor::from_host<double>(ids, {7}, cpu());
  Tensor table = random_double_tensor({5, 4}, 21);
  Tensor g = random_double_tensor({7, 4}, 22);
  auto loss = [&](const std::vector<Tensor>& in) {
    Tensor y = Tensor::empty({7, 4}, cpu(), DType::Float64);
    embedding_forward(y, id, in[0], cpu());
    return weighted_sum(g, y);
  };
  Tensor grad_table = Tensor::zeros({5, 4}, cpu(), DType::Float64);
  embedding_backward(grad_table, g, id, cpu());
  EXPECT_TRUE(check_gradient(loss, {table}, {grad_table}));
}

TEST(EmbeddingGradient, ThroughTheTape) {
  // The table used twice (two embeddings of different ids, then their product):
  // the two contributions must add up.
  Tensor ids_a = Tensor::from_host<double>({1, 0, 1}, {3}, cpu());
  Tensor ids_b = Tensor::from_host<double>({2, 2, 0}, {3}, cpu());
  Tensor table = random_double_tensor({3, 5}, 31);
  auto forward = [&](Tape& tape, const std::vector<Var>& t) {
    return ag::sum(ag::mul(ag::embedding(tape.constant(ids_a), t[0]),
                           ag::embedding(tape.constant(ids_b), t[0])));
  };
  EXPECT_TRUE(check_tape_gradient(forward, {table}));
}

TEST(EmbeddingLayer, DeclaresItsTableAndGathers) {
  VariableSet vars;
  Embedding tok(vars, "tok", 10, 4);
  EXPECT_EQ(tok.describe(), "tok: Embedding 10x4");
  ASSERT_NE(vars.find("tok/weight"), nullptr);
  EXPECT_EQ(vars.find("tok/weight")->shape, (Shape{10, 4}));
  VariableStore store(vars, cpu());
  store.initialize(7, cpu());
  Tape tape(cpu());
  Var y =
      tok(Context{tape, store, true}, tape.constant(Tensor::from_host<float>({9, 0}, {2}, cpu())));
  ASSERT_EQ(y.shape(), (Shape{2, 4}));
  const auto table = store.value("tok/weight").to_host<float>();
  const auto out = y.value().to_host<float>();
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 4),
            std::vector<float>(table.begin() + 36, table.end()));
  EXPECT_NE(out[0], out[4]);
  EXPECT_THROW_WITH(Embedding(vars, "bad", 0, 4), InvalidArgument,
                    "Embedding bad: sizes must be positive, got 0x4");
}

// Inputs and outputs for tests/ops_vs_torch_test.py (ctest ops_vs_torch), which
// runs this case with TOWERLAB_OPS_VS_TORCH_DIR set and computes
// torch.nn.functional.embedding and its gradient from the same inputs: per backend
// and dtype, ids [3,7] (repeated ids, some rows never named), table [9,5] and
// grad_y [3,7,5], then y and grad_table (assigned).
TEST(EmbeddingVsTorch, WritesCases) {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<float> id_values = random_ids(21, 6, 95);  // rows 6..8 never named
  const auto table_values = random_values(9 * 5, 96);
  const auto gy_values = random_values(21 * 5, 97);
  for (const TorchCaseBackend& backend : torch_case_backends()) {
    const Stream& stream = backend.stream();
    const Tensor ids = backend.make(id_values, {3, 7});
    const Tensor table = backend.make(table_values, {9, 5});
    const Tensor gy = backend.make(gy_values, {3, 7, 5});
    Tensor y = Tensor::empty({3, 7, 5}, stream, backend.dtype);
    embedding_forward(y, ids, table, stream);
    Tensor grad_table = Tensor::empty({9, 5}, stream, backend.dtype);
    embedding_backward(grad_table, gy, ids, stream, GradWrite::Assign);
    const std::string& p = backend.prefix;
    out.insert(out.end(), {{p + "ids", ids},
                           {p + "table", table},
                           {p + "grad_y", gy},
                           {p + "y", y},
                           {p + "grad_table", grad_table}});
  }
  write_torch_cases("embedding.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
