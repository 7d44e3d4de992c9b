// Checks and backend dispatch for broadcasting add and mul and sum_to_shape
// (kernels/broadcast.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/broadcast.h"

#include <algorithm>

#include "kernels/checks.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cuda/broadcast.h"
#include "kernels/elementwise.h"

namespace towerlab {

namespace {

void check_rank(const char* op, const char* name, const Tensor& t) {
  TL_CHECK(t.dim() <= kMaxBroadcastRank, NotSupported,
           op << ": " << name << " is " << t.describe() << "; broadcasting takes ranks up to "
              << kMaxBroadcastRank);
}

void binary(const char* op, BroadcastOp kind, const Tensor& out, const Tensor& a, const Tensor& b,
            const Stream& stream) {
  kernels::check_on_stream(op, stream, {{"out", &out}, {"a", &a}, {"b", &b}});
  const Shape shape = broadcast_shape(op, a.shape(), b.shape());
  TL_CHECK(out.shape() == shape, ShapeError,
           op << ": out is " << out.describe() << " but a " << a.describe() << " and b "
              << b.describe() << " broadcast to " << to_string(shape));
  if (a.shape() == shape && b.shape() == shape) {  // no broadcast: the elementwise kernels
    (kind == BroadcastOp::Add ? add : kind == BroadcastOp::Sub ? sub : mul)(out, a, b, stream);
    return;
  }
  check_rank(op, "out", out);
  if (out.numel() == 0) return;
  TL_DISPATCH(stream, cpu::broadcast_binary(out, a, b, kind),
              cuda::broadcast_binary(out, a, b, kind, stream));
}

}  // namespace

std::string broadcast_conflict(const Shape& a, const Shape& b) {
  for (std::size_t k = 0; k < std::max(a.size(), b.size()); ++k) {  // k-th dimension from the end
    const std::int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1;
    const std::int64_t db = k < b.size() ? b[b.size() - 1 - k] : 1;
    if (da != db && da != 1 && db != 1) {
      return "dimension -" + std::to_string(k + 1) + ": " + std::to_string(da) + " against " +
             std::to_string(db);
    }
  }
  return "";
}

Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  const std::string conflict = broadcast_conflict(a, b);
  TL_CHECK(conflict.empty(), ShapeError,
           op << ": shapes " << to_string(a) << " and " << to_string(b) << " do not broadcast ("
              << conflict << ")");
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t k = 0; k < rank; ++k) {
    const std::int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1;
    const std::int64_t db = k < b.size() ? b[b.size() - 1 - k] : 1;
    out[rank - 1 - k] = da == 1 ? db : da;
  }
  return out;
}

void broadcast_add(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream) {
  binary("broadcast_add", BroadcastOp::Add, out, a, b, stream);
}

void broadcast_sub(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream) {
  binary("broadcast_sub", BroadcastOp::Sub, out, a, b, stream);
}

void broadcast_mul(const Tensor& out, const Tensor& a, const Tensor& b, const Stream& stream) {
  binary("broadcast_mul", BroadcastOp::Mul, out, a, b, stream);
}

void sum_to_shape(const Tensor& out, const Tensor& x, const Stream& stream, GradWrite write) {
  const char* op = "sum_to_shape";
  kernels::check_on_stream(op, stream, {{"out", &out}, {"x", &x}});
  TL_CHECK(out.dim() <= x.dim() && broadcast_shape(op, out.shape(), x.shape()) == x.shape(),
           ShapeError,
           op << ": out " << out.describe() << " does not broadcast to x " << x.describe()
              << "; out must be x's shape with some dimensions 1 or left out in front");
  check_rank(op, "x", x);
  if (out.numel() == 0) return;
  TL_DISPATCH(stream, cpu::sum_to_shape(out, x, write), cuda::sum_to_shape(out, x, write, stream));
}

}  // namespace towerlab
