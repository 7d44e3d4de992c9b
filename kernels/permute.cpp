// Checks, the merged layout (kernels/permute_plan.h) and backend dispatch for
// permute (kernels/permute.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/permute.h"

#include <sstream>
#include <string>

#include "kernels/checks.h"
#include "kernels/cpu/permute.h"
#include "kernels/cuda/permute.h"
#include "kernels/permute_plan.h"

namespace towerlab {

namespace {

// "(0,2,1)": the form the messages use.
std::string dims_str(const std::vector<std::int64_t>& dims) {
  std::ostringstream os;
  os << "(";
  for (std::size_t k = 0; k < dims.size(); ++k) os << (k > 0 ? "," : "") << dims[k];
  os << ")";
  return os.str();
}

// dims with negative entries resolved, checked to be a permutation of 0 .. rank-1.
std::vector<std::int64_t> resolve_dims(const char* op, const Shape& shape,
                                       const std::vector<std::int64_t>& dims) {
  const auto rank = static_cast<std::int64_t>(shape.size());
  std::vector<std::int64_t> resolved;
  std::vector<bool> seen(shape.size(), false);
  bool valid = dims.size() == shape.size();
  for (std::int64_t d : dims) {
    if (!valid) break;
    const std::int64_t k = d < 0 ? d + rank : d;
    valid = k >= 0 && k < rank && !seen[static_cast<std::size_t>(k)];
    if (valid) seen[static_cast<std::size_t>(k)] = true;
    resolved.push_back(k);
  }
  TL_CHECK(valid, InvalidArgument,
           op << ": dims " << dims_str(dims) << " are not a permutation of the " << rank
              << " dimensions of " << to_string(shape) << " (each of 0.." << rank - 1
              << " once; -1 counts from the end)");
  return resolved;
}

void run(const char* op, const Tensor& out, const Tensor& in, const std::vector<std::int64_t>& dims,
         const Stream& stream, GradWrite write) {
  const std::vector<std::int64_t> resolved = resolve_dims(op, in.shape(), dims);
  const Shape expected = permuted_shape(op, in.shape(), resolved);
  TL_CHECK(out.shape() == expected, ShapeError,
           op << ": the output is " << out.describe() << " but " << in.describe() << " permuted by "
              << dims_str(dims) << " is " << to_string(expected));
  TL_CHECK(!kernels::overlap(out, in), InvalidArgument,
           op << ": the output " << out.describe() << " overlaps the input in memory");
  if (in.numel() == 0) return;
  const PermutePlan plan = plan_permute(op, in.shape(), resolved);
  TL_DISPATCH(stream, cpu::permute(out, in, plan, write),
              cuda::permute(out, in, plan, write, stream));
}

}  // namespace

Shape permuted_shape(const char* op, const Shape& shape, const std::vector<std::int64_t>& dims) {
  Shape out;
  for (std::int64_t k : resolve_dims(op, shape, dims))
    out.push_back(shape[static_cast<std::size_t>(k)]);
  return out;
}

std::vector<std::int64_t> inverse_permutation(const std::vector<std::int64_t>& dims) {
  const std::vector<std::int64_t> resolved =
      resolve_dims("inverse_permutation", Shape(dims.size(), 1), dims);
  std::vector<std::int64_t> inverse(dims.size());
  for (std::size_t k = 0; k < resolved.size(); ++k) {
    inverse[static_cast<std::size_t>(resolved[k])] = static_cast<std::int64_t>(k);
  }
  return inverse;
}

std::vector<std::int64_t> transpose_dims(const char* op, std::int64_t rank, std::int64_t d0,
                                         std::int64_t d1) {
  auto resolve = [&](std::int64_t d) {
    const std::int64_t k = d < 0 ? d + rank : d;
    TL_CHECK(k >= 0 && k < rank, InvalidArgument,
             op << ": dimension " << d << " is out of range for a tensor of rank " << rank
                << " (expected " << -rank << ".." << rank - 1 << ")");
    return k;
  };
  std::vector<std::int64_t> dims;
  for (std::int64_t k = 0; k < rank; ++k) dims.push_back(k);
  std::swap(dims[static_cast<std::size_t>(resolve(d0))],
            dims[static_cast<std::size_t>(resolve(d1))]);
  return dims;
}

PermutePlan plan_permute(const char* op, const Shape& x_shape,
                         const std::vector<std::int64_t>& dims) {
  // x's dimensions of size > 1, renumbered, in y's order.
  std::vector<std::int64_t> renumbered(x_shape.size(), -1), sizes, order;
  for (std::size_t d = 0; d < x_shape.size(); ++d) {
    if (x_shape[d] == 1) continue;
    renumbered[d] = static_cast<std::int64_t>(sizes.size());
    sizes.push_back(x_shape[d]);
  }
  for (std::int64_t d : dims) {
    if (renumbered[static_cast<std::size_t>(d)] >= 0)
      order.push_back(renumbered[static_cast<std::size_t>(d)]);
  }
  // Runs of y's dimensions that are consecutive in x, in the same order.
  struct Group {
    std::int64_t x_first, size;
  };
  std::vector<Group> groups;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::int64_t d = order[k];
    if (k > 0 && d == order[k - 1] + 1) {
      groups.back().size *= sizes[static_cast<std::size_t>(d)];
    } else {
      groups.push_back({d, sizes[static_cast<std::size_t>(d)]});
    }
  }
  TL_CHECK(groups.size() <= static_cast<std::size_t>(kMaxPermuteRank), NotSupported,
           op << ": " << to_string(x_shape) << " permuted by " << dims_str(dims) << " moves "
              << groups.size() << " separate dimensions; at most " << kMaxPermuteRank
              << " are supported");
  PermutePlan plan;
  plan.rank = static_cast<int>(groups.size());
  plan.numel = 1;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::int64_t stride = 1;  // the sizes of the groups that come after g in x
    for (const Group& h : groups) {
      if (h.x_first > groups[g].x_first) stride *= h.size;
    }
    plan.shape[g] = groups[g].size;
    plan.x_stride[g] = stride;
    plan.numel *= groups[g].size;
  }
  return plan;
}

void permute_forward(const Tensor& y, const Tensor& x, const std::vector<std::int64_t>& dims,
                     const Stream& stream) {
  kernels::check_placed("permute_forward", stream, {{"y", &y}, {"x", &x}});
  run("permute_forward", y, x, dims, stream, GradWrite::Assign);
}

void permute_backward(const Tensor& grad_x, const Tensor& grad_y,
                      const std::vector<std::int64_t>& dims, const Stream& stream,
                      GradWrite write) {
  kernels::check_placed("permute_backward", stream, {{"grad_x", &grad_x}, {"grad_y", &grad_y}});
  resolve_dims("permute_backward", grad_x.shape(), dims);
  run("permute_backward", grad_x, grad_y, inverse_permutation(dims), stream, write);
}

}  // namespace towerlab
