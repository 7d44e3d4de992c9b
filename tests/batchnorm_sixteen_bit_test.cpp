// Batch normalization with bfloat16 and float16 activations on every backend
// (kernels/batchnorm.h): a 16-bit call is the float32 call on the widened tensors,
// bit for bit, its 16-bit outputs rounded once; the per-channel tensors are float32.
// The training and inference forwards and the backward with and without the fused
// ReLU on odd shapes, the split (synchronized) API on 16-bit towers, the autograd
// op, and the errors of mixed dtypes.
#include <string>
#include <utility>
#include <vector>

#include "batchnorm_args.h"
#include "batchnorm_case.h"
#include "kernels/batchnorm.h"
#include "sixteen_bit.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

class BatchNormSixteenBitTest : public SixteenBitTest {
 protected:
  // The 16-bit tensor of `values` (rounded) and the float32 tensor of its widened values.
  std::pair<Tensor, Tensor> pair(const std::vector<float>& values, const Shape& shape) {
    Tensor t16 = make(values, shape);
    return {t16, make32(host(t16), shape)};
  }
  // t's float32 values rounded to dtype() and widened back: a 16-bit output's expected bits.
  std::vector<float> rounded(const Tensor& t) { return host(cast(t, dtype(), stream())); }
  // The largest relative rounding of dtype(): 2^-8 for bfloat16, 2^-11 for float16.
  double u16() const { return dtype() == DType::BFloat16 ? 0x1p-8 : 0x1p-11; }
};
TL_INSTANTIATE_SIXTEEN_BIT(BatchNormSixteenBitTest);

// Odd planes and channel counts, a plane of float4 units ({2,3,4,4}), planes a
// warp of units or more (CUDA's elementwise passes on the reduction's split:
// {7,3,16,20} in float4s, {4,2,64,65} in floats), [N,C] and more channels than a
// CUDA block keeps coefficients for ({6,1100,2,2}).
const std::vector<Shape> kSixteenBitShapes = {{3, 5, 7, 11},  {5, 7},         {2, 3, 4, 4},
                                              {7, 3, 16, 20}, {4, 2, 64, 65}, {129, 33},
                                              {6, 1100, 2, 2}};

// Training forward (moving statistics too), backward into sentinels (grad_x added
// to, then assigned over) and inference (out of place and in place), with and
// without the fused ReLU: the float32 call's bits on the widened x and grad_y, the
// 16-bit outputs rounded once; without ReLU also within the stated tolerance of
// the plain reference. The control: the float32 call with gamma and beta rounded to
// 16 bits (parameters kept in the activations' dtype) gives other y bits.
TEST_P(BatchNormSixteenBitTest, TrainingAndInferenceAreTheFloat32CallRoundedOnce) {
  for (const Shape& shape : kSixteenBitShapes) {
    const std::int64_t N = shape[0], C = shape[1], S = numel_of(shape) / (N * C);
    const auto n = static_cast<std::size_t>(numel_of(shape));
    const auto [x16, x32] = pair(random_values(n, 61, -2.0f, 3.0f), shape);
    const auto [gy16, gy32] = pair(random_values(n, 62), shape);
    const std::vector<float> gv = random_values(C, 63, 0.5f, 1.5f), bv = random_values(C, 64);
    const std::vector<float> mm0 = random_values(C, 65), mv0 = random_values(C, 66, 0.5f, 2.0f);
    const Tensor gamma = make32(gv, {C}), beta = make32(bv, {C});
    for (const Activation activation : {Activation::None, Activation::ReLU}) {
      const std::string where = to_string(shape) + (activation == Activation::ReLU ? " relu" : "");
      // The same calls on the 16-bit tensors (k = 0) and the widened ones (k = 1).
      BatchNormForwardTraining f[2];
      Tensor grad_x[2], grad_gamma[2], grad_beta[2], assigned[2], inferred[2], in_place[2];
      for (int k = 0; k < 2; ++k) {
        const bool half = k == 0;
        const Tensor& x = half ? x16 : x32;
        const Tensor& grad_y = half ? gy16 : gy32;
        auto like_x = [&](float v) {
          return half ? make(std::vector<float>(n, v), shape)
                      : make32(std::vector<float>(n, v), shape);
        };
        f[k] = training_forward(x, gamma, beta, stream());
        f[k].moving_mean = make32(mm0, {C});
        f[k].moving_var = make32(mv0, {C});
        f[k].momentum = 0.9;
        f[k].activation = activation;
        batchnorm_forward_training(f[k], stream());
        // Sentinels: grad_x 0.5 (exact in 16 bits), grad_gamma -1, grad_beta 2 are added to.
        grad_x[k] = like_x(0.5f);
        grad_gamma[k] = make32(std::vector<float>(C, -1.0f), {C});
        grad_beta[k] = make32(std::vector<float>(C, 2.0f), {C});
        batchnorm_backward(backward_of(f[k], grad_y, grad_x[k], grad_gamma[k], grad_beta[k]),
                           stream());
        assigned[k] = like_x(7.0f);  // overwritten
        BatchNormBackward b = backward_of(f[k], grad_y, assigned[k]);
        b.grad_x_write = GradWrite::Assign;
        batchnorm_backward(b, stream());
        BatchNormForwardInference g{.y = Tensor::empty(shape, stream(), x.dtype()),
                                    .x = x,
                                    .gamma = gamma,
                                    .beta = beta,
                                    .moving_mean = f[k].moving_mean,
                                    .moving_var = f[k].moving_var,
                                    .eps = 1e-3,
                                    .activation = activation};
        batchnorm_forward_inference(g, stream());
        inferred[k] = g.y;
        g.y = g.x = x.clone(stream());  // normalized in place
        batchnorm_forward_inference(g, stream());
        in_place[k] = g.y;
      }
      for (const Tensor* t : {&f[0].y, &grad_x[0], &assigned[0], &inferred[0], &in_place[0]}) {
        ASSERT_EQ(t->dtype(), dtype()) << where;
      }
      EXPECT_EQ(bits(host(f[0].y)), bits(rounded(f[1].y))) << where;
      EXPECT_EQ(bits(host(f[0].save_mean)), bits(host(f[1].save_mean))) << where;
      EXPECT_EQ(bits(host(f[0].save_inv_std)), bits(host(f[1].save_inv_std))) << where;
      EXPECT_EQ(bits(host(f[0].moving_mean)), bits(host(f[1].moving_mean))) << where;
      EXPECT_EQ(bits(host(f[0].moving_var)), bits(host(f[1].moving_var))) << where;
      EXPECT_EQ(bits(host(grad_x[0])), bits(rounded(grad_x[1]))) << where;
      EXPECT_EQ(bits(host(grad_gamma[0])), bits(host(grad_gamma[1]))) << where;
      EXPECT_EQ(bits(host(grad_beta[0])), bits(host(grad_beta[1]))) << where;
      EXPECT_EQ(bits(host(assigned[0])), bits(rounded(assigned[1]))) << where;
      EXPECT_EQ(bits(host(inferred[0])), bits(rounded(inferred[1]))) << where;
      EXPECT_EQ(bits(host(in_place[0])), bits(host(inferred[0]))) << where;
      EXPECT_NE(host(grad_gamma[0]), std::vector<float>(C, -1.0f)) << where;
      if (activation == Activation::ReLU) continue;

      // Against the plain reference on the widened values: the float32 tolerances
      // of MatchesReferenceOnOddShapes, plus u16 relative for a 16-bit output.
      const BatchNormReference r =
          batchnorm_reference(host(x16), gv, bv, host(gy16), N, C, S, 1e-3);
      EXPECT_TRUE(all_close(host(f[0].y), to_float(r.y), 1e-4, 1e-4 + u16())) << where;
      EXPECT_TRUE(all_close(host(f[0].save_mean), to_float(r.mean), 1e-6, 1e-5)) << where;
      EXPECT_TRUE(all_close(host(f[0].save_inv_std), to_float(r.inv_std), 1e-6, 1e-5)) << where;
      EXPECT_TRUE(all_close(host(grad_x[0]), plus(r.grad_x, 0.5f), 1e-4, 1e-3 + u16())) << where;
      EXPECT_TRUE(all_close(host(grad_gamma[0]), plus(r.grad_gamma, -1.0f), 1e-4, 1e-4)) << where;
      EXPECT_TRUE(all_close(host(grad_beta[0]), plus(r.grad_beta, 2.0f), 1e-4, 1e-4)) << where;

      // Control: parameters rounded to 16 bits move some y across a rounding.
      BatchNormForwardTraining c = training_forward(x32, make32(host(make(gv, {C})), {C}),
                                                    make32(host(make(bv, {C})), {C}), stream());
      batchnorm_forward_training(c, stream());
      EXPECT_NE(bits(host(f[0].y)), bits(rounded(c.y))) << where;
    }
  }
}

// Float32 grad_y and grad_x beside a 16-bit x (kernels/batchnorm.h, the policy's
// backward), on the CPU: batchnorm_backward and the split API's reduce and apply
// read x's rows widened as they go and give the bits of the float32 calls on the
// widened x, grad_x added to or assigned, with and without the ReLU, on every ISA.
// Control: the same calls on the unrounded float32 x give other bits. On CUDA
// such a call is NotSupported.
TEST_P(BatchNormSixteenBitTest, Float32GradientsBesideA16BitXAreTheBackwardOnTheWidenedX) {
  for_each_cpu_isa([&](const std::string& isa) {
    for (const Shape& shape : kSixteenBitShapes) {
      const std::int64_t C = shape[1];
      const auto n = static_cast<std::size_t>(numel_of(shape));
      const std::vector<float> xv = random_values(n, 91, -2.0f, 3.0f);
      const auto [x16, x32] = pair(xv, shape);
      const Tensor unrounded = make32(xv, shape), grad_y = make32(random_values(n, 92), shape);
      const Tensor gamma = make32(random_values(C, 93, 0.5f, 1.5f), {C});
      const Tensor beta = make32(random_values(C, 94), {C});
      for (const Activation activation : {Activation::None, Activation::ReLU}) {
        BatchNormForwardTraining f = training_forward(x16, gamma, beta, stream());
        f.activation = activation;
        batchnorm_forward_training(f, stream());
        if (device().is_cuda()) {
          EXPECT_THROW_WITH(
              batchnorm_backward(
                  backward_of(f, grad_y, Tensor(), make32(std::vector<float>(C, 0.0f), {C})),
                  stream()),
              NotSupported, "beside a 16-bit x run on the CPU");
          return;
        }
        for (const GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
          const std::string where = isa + ", " + to_string(shape) +
                                    (activation == Activation::ReLU ? " relu" : "") +
                                    (write == GradWrite::Assign ? ", assigned" : ", added");
          // The backward of f for x into sentinels (grad_x 0.5, grad_gamma -1, grad_beta
          // 2), then the split API's reduce and apply into a grad_x from 0.25.
          struct Out {
            Tensor grad_x, grad_gamma, grad_beta, sum_grad_y, sum_grad_y_xhat, split_grad_x;
          };
          auto run = [&](const Tensor& x) {
            Out o{make32(std::vector<float>(n, 0.5f), shape),
                  make32(std::vector<float>(C, -1.0f), {C}),
                  make32(std::vector<float>(C, 2.0f), {C}),
                  Tensor::empty({C}, stream()),
                  Tensor::empty({C}, stream()),
                  make32(std::vector<float>(n, 0.25f), shape)};
            BatchNormBackward b = backward_of(f, grad_y, o.grad_x, o.grad_gamma, o.grad_beta);
            b.x = x;
            b.grad_x_write = write;
            batchnorm_backward(b, stream());
            BatchNormBackwardReduce reduce = reduce_of(f, grad_y, o.sum_grad_y, o.sum_grad_y_xhat);
            reduce.x = x;
            batchnorm_backward_reduce(reduce, stream());
            batchnorm_backward_apply(apply_of(reduce, o.split_grad_x, numel_of(shape) / C, write),
                                     stream());
            return o;
          };
          const Out got = run(x16), want = run(x32), control = run(unrounded);
          ASSERT_EQ(got.grad_x.dtype(), DType::Float32) << where;
          EXPECT_EQ(bits(host(got.grad_x)), bits(host(want.grad_x))) << where;
          EXPECT_EQ(bits(host(got.grad_gamma)), bits(host(want.grad_gamma))) << where;
          EXPECT_EQ(bits(host(got.grad_beta)), bits(host(want.grad_beta))) << where;
          EXPECT_EQ(bits(host(got.sum_grad_y)), bits(host(want.sum_grad_y))) << where;
          EXPECT_EQ(bits(host(got.sum_grad_y_xhat)), bits(host(want.sum_grad_y_xhat))) << where;
          EXPECT_EQ(bits(host(got.split_grad_x)), bits(host(want.split_grad_x))) << where;
          EXPECT_NE(bits(host(got.grad_x)), bits(host(control.grad_x))) << "control, " << where;
          EXPECT_NE(bits(host(got.split_grad_x)), bits(host(control.split_grad_x)))
              << "control, " << where;
        }
      }
    }
  });
}

// Float32 grad_y with a grad_x of the 16-bit x's dtype (kernels/batchnorm.h: how a
// 16-bit tape's batch norm hands a convolution its rounded gradient), on the CPU:
// batchnorm_backward and the split API's apply give the float32 grad_x of the same
// call, rounded once, assigned or added to in float32 (the grad_x's old values
// random, so adding them before or after rounding differs), on every ISA. Control:
// the added and the assigned grad_x differ. On CUDA the call is NotSupported, as
// float32 gradients beside a 16-bit x are.
TEST_P(BatchNormSixteenBitTest, Float32GradYWritesA16BitGradXRoundedOnce) {
  if (device().is_cuda()) {  // float32 gradients beside a 16-bit x: the CPU's
    const Tensor x16 = make(random_values(96, 95), {2, 3, 4, 4});
    BatchNormForwardTraining f =
        training_forward(x16, make32({1, 1, 1}, {3}), make32({0, 0, 0}, {3}), stream());
    batchnorm_forward_training(f, stream());
    EXPECT_THROW_WITH(
        batchnorm_backward(backward_of(f, make32(random_values(96, 96), x16.shape()),
                                       make(std::vector<float>(96, 0.0f), x16.shape())),
                           stream()),
        NotSupported, "beside a 16-bit x run on the CPU");
    return;
  }
  for_each_cpu_isa([&](const std::string& isa) {
    for (const Shape& shape : kSixteenBitShapes) {
      const std::int64_t C = shape[1];
      const auto n = static_cast<std::size_t>(numel_of(shape));
      const auto [x16, x32] = pair(random_values(n, 95, -2.0f, 3.0f), shape);
      const Tensor grad_y = make32(random_values(n, 96), shape);
      const auto [old16, old32] = pair(random_values(n, 97), shape);
      const Tensor gamma = make32(random_values(C, 98, 0.5f, 1.5f), {C});
      const Tensor beta = make32(random_values(C, 99), {C});
      for (const Activation activation : {Activation::None, Activation::ReLU}) {
        BatchNormForwardTraining f = training_forward(x16, gamma, beta, stream());
        f.activation = activation;
        batchnorm_forward_training(f, stream());
        std::vector<float> results[2];  // the rounded grad_x, added to and assigned
        for (const GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
          const std::string where = isa + ", " + to_string(shape) +
                                    (activation == Activation::ReLU ? " relu" : "") +
                                    (write == GradWrite::Assign ? ", assigned" : ", added");
          // grad_x from `old` by the backward, and by the split API's reduce and apply.
          auto run = [&](const Tensor& old) {
            Tensor whole = old.clone(stream()), split = old.clone(stream());
            BatchNormBackward b = backward_of(f, grad_y, whole);
            b.grad_x_write = write;
            batchnorm_backward(b, stream());
            BatchNormBackwardReduce reduce =
                reduce_of(f, grad_y, Tensor::empty({C}, stream()), Tensor::empty({C}, stream()));
            batchnorm_backward_reduce(reduce, stream());
            batchnorm_backward_apply(apply_of(reduce, split, numel_of(shape) / C, write), stream());
            return std::pair{whole, split};
          };
          const auto [whole16, split16] = run(old16);
          const auto [whole32, split32] = run(old32);
          ASSERT_EQ(whole16.dtype(), dtype()) << where;
          EXPECT_EQ(bits(host(whole16)), bits(rounded(whole32))) << where;
          EXPECT_EQ(bits(host(split16)), bits(rounded(split32))) << where;
          results[write == GradWrite::Assign ? 1 : 0] = host(whole16);
        }
        EXPECT_NE(bits(results[0]), bits(results[1])) << "control, " << isa;
      }
    }
  });
}

// The split API (synchronized batch norm) on 16-bit towers, views into one batch:
// the float32 recipe's bits on the widened values, 16-bit y and grad_x rounded once.
TEST_P(BatchNormSixteenBitTest, SplitApiIsTheFloat32RecipeRoundedOnce) {
  // Planes of 15 and of 20 values (CUDA's flat grid), of 32 float4 units (its split).
  for (const std::int64_t W : {5, 32}) {
    for (const std::int64_t H : {3, 4}) {
      const std::int64_t N = 7, C = 3;
      const Shape shape = {N, C, H, W};
      const auto n = static_cast<std::size_t>(numel_of(shape));
      const auto [x16, x32] = pair(random_values(n, 71, 1.0f, 4.0f), shape);
      const auto [gy16, gy32] = pair(random_values(n, 72), shape);
      const Tensor gamma = make32(random_values(C, 73, 0.5f, 1.5f), {C});
      const Tensor beta = make32(random_values(C, 74), {C});
      const std::vector<float> mm0 = {0.5f, -0.5f, 1.0f}, mv0 = {1.0f, 2.0f, 0.5f};
      // grad_x starts at a sentinel of 0.25 (exact in 16 bits): the towers add to it.
      const SplitRun t16 = run_split(x16, gy16, gamma, beta, mm0, mv0, kUnevenTowers,
                                     make(std::vector<float>(n, 0.25f), shape), stream());
      const SplitRun t32 = run_split(x32, gy32, gamma, beta, mm0, mv0, kUnevenTowers,
                                     make32(std::vector<float>(n, 0.25f), shape), stream());
      const std::string where = to_string(shape);
      ASSERT_EQ(t16.y.dtype(), dtype());
      for (auto [a, b] : {std::pair{&t16.mean, &t32.mean},
                          {&t16.m2, &t32.m2},
                          {&t16.inv_std, &t32.inv_std},
                          {&t16.moving_mean, &t32.moving_mean},
                          {&t16.moving_var, &t32.moving_var},
                          {&t16.sum_grad_y, &t32.sum_grad_y},
                          {&t16.sum_grad_y_xhat, &t32.sum_grad_y_xhat}}) {
        ASSERT_EQ(a->dtype(), DType::Float32);
        EXPECT_EQ(bits(host(*a)), bits(host(*b))) << where;
      }
      EXPECT_EQ(bits(host(t16.y)), bits(rounded(t32.y))) << where;
      EXPECT_EQ(bits(host(t16.grad_x)), bits(rounded(t32.grad_x))) << where;
      EXPECT_NE(host(t16.grad_x), std::vector<float>(n, 0.25f)) << where;
    }
  }
}

// ag::batchnorm on a 16-bit x, as a bf16 or fp16 tape runs it (docs/precision.md):
// y in x's dtype, the 16-bit forward kernel's bits; every gradient float32 (the
// policy's, Tape::grad_dtype), the float32 backward kernel's bits on the widened x.
TEST_P(BatchNormSixteenBitTest, AutogradOpKeepsTheActivationsDtypeAndFloat32Gradients) {
  const Shape shape = {4, 3, 5, 5};
  const auto n = static_cast<std::size_t>(numel_of(shape));
  const Tensor x = make(random_values(n, 81, -2.0f, 3.0f), shape);
  const Tensor grad_y = make32(random_values(n, 82), shape);
  const Tensor gamma = make32(random_values(3, 83, 0.5f, 1.5f), {3});
  const Tensor beta = make32(random_values(3, 84), {3});
  Tape tape(stream());
  tape.set_compute_dtype(dtype());
  Tensor grad_x = Tensor::zeros(shape, stream());
  Tensor grad_gamma = Tensor::zeros({3}, stream()), grad_beta = Tensor::zeros({3}, stream());
  const Var xv = tape.variable(x, grad_x, "x");
  const Var gv = tape.variable(gamma, grad_gamma, "gamma");
  const Var bv = tape.variable(beta, grad_beta, "beta");
  const Tensor mm = Tensor::zeros({3}, stream()), mv = make32({1, 1, 1}, {3});
  const Var y = ag::batchnorm(xv, gv, bv, mm, mv, true, 0.9, 1e-3, Activation::ReLU);
  ASSERT_EQ(tape.num_records(), 1u) << "one op: no widening or rounding recorded around it";
  tape.backward(y, grad_y);
  ASSERT_EQ(y.value().dtype(), dtype());

  BatchNormForwardTraining f = training_forward(x, gamma, beta, stream());
  f.moving_mean = Tensor::zeros({3}, stream());
  f.moving_var = make32({1, 1, 1}, {3});
  f.momentum = 0.9;
  f.activation = Activation::ReLU;
  batchnorm_forward_training(f, stream());
  f.x = cast(x, DType::Float32, stream());  // the backward reads x widened
  Tensor expected_gx = Tensor::zeros(shape, stream());
  Tensor expected_gg = Tensor::zeros({3}, stream()), expected_gb = Tensor::zeros({3}, stream());
  batchnorm_backward(backward_of(f, grad_y, expected_gx, expected_gg, expected_gb), stream());
  EXPECT_EQ(bits(host(y.value())), bits(host(f.y)));
  EXPECT_EQ(bits(host(mm)), bits(host(f.moving_mean)));
  EXPECT_EQ(bits(host(grad_x)), bits(host(expected_gx)));
  EXPECT_NE(host(grad_x), std::vector<float>(n, 0.0f)) << "control: the gradient arrived";
  EXPECT_EQ(bits(host(grad_gamma)), bits(host(expected_gg)));
  EXPECT_EQ(bits(host(grad_beta)), bits(host(expected_gb)));
}

// Mixed dtypes are typed errors naming the op, the tensor and both dtypes.
TEST_P(BatchNormSixteenBitTest, RejectsMixedDtypes) {
  const std::string d = dtype_name(dtype());
  const Shape shape = {2, 3, 4, 4};
  const Tensor x = make(std::vector<float>(96, 1.0f), shape);
  const Tensor c3 = Tensor::zeros({3}, stream()), c3_16 = make({0, 0, 0}, {3});
  const Tensor y32 = Tensor::zeros(shape, stream());
  const BatchNormForwardTraining forward = training_forward(x, c3, c3, stream());
  batchnorm_forward_training(forward, stream());  // valid
  auto training = [&](auto change) {
    BatchNormForwardTraining args = forward;
    change(args);
    batchnorm_forward_training(args, stream());
  };
  EXPECT_THROW_WITH(training([&](auto& a) { a.gamma = c3_16; }), ShapeError,
                    "batchnorm_forward_training: gamma is " + d + "[3]");
  EXPECT_THROW_WITH(training([&](auto& a) { a.save_mean = c3_16; }), ShapeError,
                    "whose per-channel tensors are float32 (beside 16-bit activations");
  EXPECT_THROW_WITH(training([&](auto& a) { a.y = y32; }), ShapeError,
                    "batchnorm_forward_training: y is float32[2,3,4,4]");
  EXPECT_THROW_WITH(training([&](auto& a) { a.y = y32; }), ShapeError,
                    "but x is " + d + "[2,3,4,4]");
  EXPECT_THROW_WITH(batchnorm_backward(backward_of(forward, x, y32), stream()), ShapeError,
                    "batchnorm_backward: grad_x is float32[2,3,4,4]");
  // Float32 gradients beside a 16-bit x: the policy's backward on the CPU
  // (Float32GradientsBesideA16BitXAreTheBackwardOnTheWidenedX), not on CUDA.
  // So is a float32 grad_y with a grad_x of x's dtype, rounded as it is stored
  // (Float32GradYWritesA16BitGradXRoundedOnce); a grad_x of the other 16-bit dtype
  // is not.
  const Tensor x16 = make(std::vector<float>(96, 0.0f), shape);
  const Tensor other16 =
      Tensor::zeros(shape, stream(), dtype() == DType::BFloat16 ? DType::Float16 : DType::BFloat16);
  if (device().is_cuda()) {
    EXPECT_THROW_WITH(batchnorm_backward(backward_of(forward, y32, Tensor(), c3), stream()),
                      NotSupported, "batchnorm_backward: grad_y is float32[2,3,4,4]");
    EXPECT_THROW_WITH(batchnorm_backward(backward_of(forward, y32, x16, c3), stream()),
                      NotSupported, "batchnorm_backward: grad_y is float32[2,3,4,4]");
  } else {
    batchnorm_backward(backward_of(forward, y32, Tensor(), c3), stream());  // valid
    batchnorm_backward(backward_of(forward, y32, x16, c3), stream());       // valid
  }
  EXPECT_THROW_WITH(batchnorm_backward(backward_of(forward, y32, other16, c3), stream()),
                    ShapeError,
                    std::string("batchnorm_backward: grad_x is ") + dtype_name(other16.dtype()));
  EXPECT_THROW_WITH((batchnorm_stats({.mean = c3_16, .m2 = c3, .x = x}, stream())), ShapeError,
                    "batchnorm_stats: mean is " + d + "[3]");
  // Statistics are never 16-bit: the merge does not take them.
  EXPECT_THROW_WITH((batchnorm_merge_stats({.mean_a = c3_16,
                                            .m2_a = c3_16,
                                            .count_a = 2,
                                            .mean_b = c3_16,
                                            .m2_b = c3_16,
                                            .count_b = 2},
                                           stream())),
                    NotSupported, "batchnorm_merge_stats: " + d + " is not supported");
}

}  // namespace
}  // namespace towerlab::testing
