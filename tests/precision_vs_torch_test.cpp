// The bf16 policy (docs/precision.md) against PyTorch's own bfloat16 results: the
// cases tests/ops_vs_torch_test.py (family "bf16") compares with torch's bfloat16
// matmul, batched matmul, conv2d and batch norm on the same inputs. Through a tape whose compute
// dtype is bfloat16, as a bf16 tower's pass runs them: float32 values, rounded to
// bfloat16 at the GEMM-class ops (operands and output gradient), float32 sums and
// outputs; batch norm in float32 on a bfloat16-rounded input (what it receives after
// a bf16 convolution under autocast, which runs it in the input's dtype). And batch
// norm on bfloat16 activations itself (batchnorm_bf16: bfloat16 x, y, grad_y and
// grad_x, float32 gamma and beta), against torch's batch_norm on bfloat16 tensors.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/half.h"
#include "ops_vs_torch.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

using Cases = std::vector<std::pair<std::string, Tensor>>;

std::vector<float> rounded_to_bf16(std::vector<float> values) {
  for (float& v : values) v = float(bfloat16(v));
  return values;
}

// A variable of `tape` with its gradient, zeroed, on the backend.
struct Leaf {
  Tensor value, grad;
  Var var;
  Leaf(Tape& tape, const TorchCaseBackend& b, const std::vector<float>& values, const Shape& shape,
       const std::string& name)
      : value(b.make(values, shape)),
        grad(Tensor::zeros(shape, b.stream(), b.dtype)),
        var(tape.variable(value, grad, name)) {}
};

// One product through a bfloat16 tape: a, b and grad_y drawn from seed, seed + 1 and
// seed + 2; the inputs, grad_y and towerlab's y and gradients, under `name`/.
template <typename Product>
void product_case(const TorchCaseBackend& b, const std::string& name, const Shape& a_shape,
                  const Shape& b_shape, const Shape& y_shape, unsigned seed, const Product& product,
                  Cases& out) {
  const std::string p = b.prefix + name + "/";
  Tape tape(b.stream());
  tape.set_compute_dtype(DType::BFloat16);
  Leaf a(tape, b, random_values(std::size_t(numel_of(a_shape)), seed), a_shape, "a");
  Leaf w(tape, b, random_values(std::size_t(numel_of(b_shape)), seed + 1), b_shape, "b");
  const Tensor grad_y = b.make(random_values(std::size_t(numel_of(y_shape)), seed + 2), y_shape);
  const Var y = product(a.var, w.var);
  tape.backward(y, grad_y);
  for (auto [what, t] : {std::pair{"a", a.value},
                         {"b", w.value},
                         {"grad_y", grad_y},
                         {"y", y.value()},
                         {"grad_a", a.grad},
                         {"grad_b", w.grad}}) {
    out.emplace_back(p + what, t);
  }
}

void matmul_case(const TorchCaseBackend& b, bool transpose_b, Cases& out) {
  product_case(
      b, transpose_b ? "matmul_nt" : "matmul_nn", {13, 37},
      transpose_b ? Shape{11, 37} : Shape{37, 11}, {13, 11}, 201,
      [&](const Var& x, const Var& w) { return ag::matmul(x, w, false, transpose_b); }, out);
}

// ag::batched_matmul takes the matmul's policy: a [3,7,9] times b [3,9,5].
void batched_matmul_case(const TorchCaseBackend& b, Cases& out) {
  product_case(
      b, "batched_matmul_nn", {3, 7, 9}, {3, 9, 5}, {3, 7, 5}, 231,
      [](const Var& x, const Var& w) { return ag::batched_matmul(x, w, false, false); }, out);
}

void conv2d_case(const TorchCaseBackend& b, Cases& out) {
  const std::string p = b.prefix + "conv2d/";
  const Conv2dParams params{.stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1};
  Tape tape(b.stream());
  tape.set_compute_dtype(DType::BFloat16);
  Leaf x(tape, b, random_values(2 * 6 * 9 * 9, 211), {2, 6, 9, 9}, "x");
  Leaf w(tape, b, random_values(5 * 6 * 3 * 3, 212), {5, 6, 3, 3}, "weight");
  Leaf bias(tape, b, random_values(5, 213), {5}, "bias");
  const Tensor grad_y = b.make(random_values(2 * 5 * 9 * 9, 214), {2, 5, 9, 9});
  const Var y = ag::conv2d(x.var, w.var, bias.var, params);
  tape.backward(y, grad_y);
  for (auto [name, t] : {std::pair{"x", x.value},
                         {"weight", w.value},
                         {"bias", bias.value},
                         {"grad_y", grad_y},
                         {"y", y.value()},
                         {"grad_x", x.grad},
                         {"grad_weight", w.grad},
                         {"grad_bias", bias.grad}}) {
    out.emplace_back(p + name, t);
  }
}

void batchnorm_case(const TorchCaseBackend& b, Cases& out) {
  const std::string p = b.prefix + "batchnorm/";
  const Shape shape = {4, 3, 5, 5};
  Tape tape(b.stream());
  tape.set_compute_dtype(DType::BFloat16);
  Leaf x(tape, b, rounded_to_bf16(random_values(300, 221, -2.0f, 3.0f)), shape, "x");
  Leaf gamma(tape, b, random_values(3, 222, 0.5f, 1.5f), {3}, "gamma");
  Leaf beta(tape, b, random_values(3, 223), {3}, "beta");
  const Tensor moving_mean = Tensor::zeros({3}, b.stream(), b.dtype);
  const Tensor moving_var = b.make({1, 1, 1}, {3});
  const Tensor grad_y = b.make(random_values(300, 224), shape);
  const Var y = ag::batchnorm(x.var, gamma.var, beta.var, moving_mean, moving_var, true);
  tape.backward(y, grad_y);
  for (auto [name, t] : {std::pair{"x", x.value},
                         {"gamma", gamma.value},
                         {"beta", beta.value},
                         {"grad_y", grad_y},
                         {"y", y.value()},
                         {"grad_x", x.grad},
                         {"grad_gamma", gamma.grad},
                         {"grad_beta", beta.grad}}) {
    out.emplace_back(p + name, t);
  }
}

// ag::batchnorm on a bfloat16 x (kernels/batchnorm.h): y bfloat16; grad_y and grad_x
// float32, as the policy keeps gradients (grad_y's values bfloat16 ones, which torch
// takes in bfloat16); gamma, beta, their gradients and the statistics float32.
void batchnorm_bf16_case(const TorchCaseBackend& b, Cases& out) {
  const std::string p = b.prefix + "batchnorm_bf16/";
  const Shape shape = {4, 3, 5, 5};
  auto bf16 = [&](const std::vector<float>& values) {
    return cast(b.make(values, shape), DType::BFloat16, b.stream());
  };
  Tape tape(b.stream());
  const Tensor x = bf16(random_values(300, 225, -2.0f, 3.0f));
  const Tensor grad_x = Tensor::zeros(shape, b.stream());
  const Var xv = tape.variable(x, grad_x, "x");
  Leaf gamma(tape, b, random_values(3, 226, 0.5f, 1.5f), {3}, "gamma");
  Leaf beta(tape, b, random_values(3, 227), {3}, "beta");
  const Tensor moving_mean = Tensor::zeros({3}, b.stream(), b.dtype);
  const Tensor moving_var = b.make({1, 1, 1}, {3});
  const Tensor grad_y = b.make(rounded_to_bf16(random_values(300, 228)), shape);
  const Var y = ag::batchnorm(xv, gamma.var, beta.var, moving_mean, moving_var, true);
  tape.backward(y, grad_y);
  for (auto [name, t] : {std::pair{"x", x},
                         {"gamma", gamma.value},
                         {"beta", beta.value},
                         {"grad_y", grad_y},
                         {"y", y.value()},
                         {"grad_x", grad_x},
                         {"grad_gamma", gamma.grad},
                         {"grad_beta", beta.grad}}) {
    out.emplace_back(p + name, t);
  }
}

// Per float32 backend (the policy's dtype; float64 tapes keep float64): matmul_nn,
// matmul_nt, batched_matmul_nn, conv2d (3x3, padding 1, with a bias), batchnorm and
// batchnorm_bf16, each its inputs, grad_y and towerlab's results.
TEST(PrecisionVsTorch, WritesCases) {
  Cases out;
  for (const TorchCaseBackend& b : torch_case_backends()) {
    if (b.dtype != DType::Float32) continue;
    matmul_case(b, false, out);
    matmul_case(b, true, out);
    batched_matmul_case(b, out);
    conv2d_case(b, out);
    batchnorm_case(b, out);
    batchnorm_bf16_case(b, out);
  }
  write_torch_cases("bf16.safetensors", out);
}

}  // namespace
}  // namespace towerlab::testing
