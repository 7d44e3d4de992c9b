// Checks and backend dispatch for dropout (kernels/dropout.h).
#include "kernels/dropout.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cuda/dropout.h"

namespace towerlab {

namespace {

void check_arguments(const char* op, double p, const DropoutKey& key) {
  TL_CHECK(p >= 0.0 && p <= 1.0, InvalidArgument,
           op << ": p is " << p << "; the probability of dropping an element must be in [0, 1]");
  TL_CHECK(key.first_row >= 0, InvalidArgument,
           op << ": key.first_row is " << key.first_row
              << "; it is the index of x's first sample in the whole batch, never negative");
}

// The global index of element 0: key.first_row rows of D elements before it.
std::uint64_t first_element(const Tensor& x, const DropoutKey& key) {
  const std::int64_t row_size = x.dim() == 0 || x.size(0) == 0 ? 1 : x.numel() / x.size(0);
  return static_cast<std::uint64_t>(key.first_row) * static_cast<std::uint64_t>(row_size);
}

}  // namespace

std::uint64_t dropout_subsequence(std::uint64_t step, std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 64-bit
  for (const char c : name) {
    h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  // splitmix64's finalizer of the name's hash plus the step times the golden ratio.
  std::uint64_t z = h + (step + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void dropout_forward(const Tensor& y, const Tensor& x, double p, const DropoutKey& key,
                     const Stream& stream) {
  kernels::check_same_shape("dropout_forward", stream, {{"x", &x}, {"y", &y}});
  check_arguments("dropout_forward", p, key);
  if (x.numel() == 0) return;
  const std::uint64_t e0 = first_element(x, key);
  TL_DISPATCH(stream, cpu::dropout_forward(y, x, p, key.seed, key.subsequence, e0),
              cuda::dropout_forward(y, x, p, key.seed, key.subsequence, e0, stream));
}

void dropout_backward(const Tensor& grad_x, const Tensor& grad_y, double p, const DropoutKey& key,
                      const Stream& stream, GradWrite write) {
  kernels::check_same_shape("dropout_backward", stream, {{"grad_y", &grad_y}, {"grad_x", &grad_x}});
  check_arguments("dropout_backward", p, key);
  if (grad_y.numel() == 0) return;
  const std::uint64_t e0 = first_element(grad_y, key);
  TL_DISPATCH(
      stream, cpu::dropout_backward(grad_x, grad_y, p, key.seed, key.subsequence, e0, write),
      cuda::dropout_backward(grad_x, grad_y, p, key.seed, key.subsequence, e0, stream, write));
}

}  // namespace towerlab
