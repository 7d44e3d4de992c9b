// Checks and backend dispatch for embedding (kernels/embedding.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/embedding.h"

#include <sstream>
#include <string>

#include "kernels/checks.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/embedding.h"

namespace towerlab {

namespace {

// float32 represents every integer up to 2^24 exactly, and no more.
constexpr std::int64_t kFloat32ExactIntegers = std::int64_t{1} << 24;

// A SampleError naming ids[index] by its position in ids' shape: the first
// dimension is the row (the trainer names the row of the whole batch), the others
// follow it ("ids[1][3] = 7.5"). A rank-0 ids has no row: InvalidArgument.
[[noreturn]] void throw_bad_id(const char* op, const Tensor& ids, std::int64_t index,
                               std::int64_t rows, const Stream& stream) {
  Tensor one = ids.reshape({-1}).view(index, {1});
  const double value = ids.dtype() == DType::Float64 ? one.to_host<double>(stream)[0]
                                                     : one.to_host<float>(stream)[0];
  std::ostringstream tail;  // the position after the row, then the value
  std::int64_t rest = index;
  std::string position;
  for (std::int64_t d = ids.dim() - 1; d >= 1; --d) {
    position = "[" + std::to_string(rest % ids.size(d)) + "]" + position;
    rest /= ids.size(d);
  }
  tail << position << " = " << value << " is not a row id in [0, " << rows << ")";
  if (ids.dim() == 0) {
    TL_THROW(InvalidArgument, op << ": ids" << tail.str() << " (ids " << ids.describe() << ")");
  }
  throw SampleError(std::string(op) + ": ids", rest, tail.str(), "ids " + ids.describe());
}

// The ids can address every row of a table of `rows` rows in their dtype.
void check_addressable(const char* op, const Tensor& ids, const Tensor& table) {
  TL_CHECK(ids.dtype() != DType::Float32 || table.size(0) <= kFloat32ExactIntegers, NotSupported,
           op << ": table " << table.describe() << " has more rows than float32 ids can name "
              << "exactly (2^24); use float64 ids and table on the CPU");
}

// The CPU kernels index by the ids, so a bad one is refused before they run (host
// memory, no sync). CUDA's kernels poison instead (kernels/embedding.h).
void check_ids_on_cpu(const char* op, const Tensor& ids, std::int64_t rows, const Stream& stream) {
  if (!stream.device().is_cpu()) return;
  const std::int64_t bad = cpu::first_invalid_id(ids, rows);
  if (bad >= 0) throw_bad_id(op, ids, bad, rows, stream);
}

// table (or grad_table) is [V, D] and y (or grad_y) is ids' shape + [D].
void check_shapes(const char* op, const char* y_name, const Tensor& y, const Tensor& ids,
                  const char* table_name, const Tensor& table) {
  TL_CHECK(table.dim() == 2, ShapeError,
           op << ": " << table_name << " must be [V, D] (rows, width), got " << table.describe());
  Shape expected = ids.shape();
  expected.push_back(table.size(1));
  TL_CHECK(y.shape() == expected, ShapeError,
           op << ": " << y_name << " is " << y.describe() << " but ids " << ids.describe()
              << " and " << table_name << " " << table.describe() << " need "
              << to_string(expected));
}

}  // namespace

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& table,
                       const Stream& stream) {
  const char* op = "embedding_forward";
  kernels::check_on_stream(op, stream, {{"y", &y}, {"ids", &ids}, {"table", &table}});
  check_shapes(op, "y", y, ids, "table", table);
  check_addressable(op, ids, table);
  check_ids_on_cpu(op, ids, table.size(0), stream);
  if (y.numel() == 0) return;
  TL_DISPATCH(stream, cpu::embedding_forward(y, ids, table),
              cuda::embedding_forward(y, ids, table, stream));
}

void embedding_backward(const Tensor& grad_table, const Tensor& grad_y, const Tensor& ids,
                        const Stream& stream, GradWrite write) {
  const char* op = "embedding_backward";
  kernels::check_on_stream(op, stream,
                           {{"grad_table", &grad_table}, {"grad_y", &grad_y}, {"ids", &ids}});
  check_shapes(op, "grad_y", grad_y, ids, "grad_table", grad_table);
  check_addressable(op, ids, grad_table);
  check_ids_on_cpu(op, ids, grad_table.size(0), stream);
  // No ids still assign: grad_table is then all zeros.
  if (grad_table.numel() == 0 || (ids.numel() == 0 && write == GradWrite::Accumulate)) return;
  TL_DISPATCH(stream, cpu::embedding_backward(grad_table, grad_y, ids, write),
              cuda::embedding_backward(grad_table, grad_y, ids, stream, write));
}

void validate_embedding_ids(const Tensor& ids, std::int64_t num_embeddings, const Stream& stream) {
  const char* op = "validate_embedding_ids";
  kernels::check_on_stream(op, stream, {{"ids", &ids}});
  TL_CHECK(num_embeddings >= 0, InvalidArgument,
           op << ": num_embeddings must not be negative, got " << num_embeddings);
  if (ids.numel() == 0) return;
  std::int64_t bad = -1;
  TL_DISPATCH(stream, bad = cpu::first_invalid_id(ids, num_embeddings),
              bad = cuda::first_invalid_id(ids, num_embeddings, stream));
  if (bad >= 0) throw_bad_id(op, ids, bad, num_embeddings, stream);
}

}  // namespace towerlab
