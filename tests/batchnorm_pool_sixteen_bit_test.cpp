// Batch norm with a fused max pool on a bfloat16 or float16 x (kernels/batchnorm.h,
// CPU only), against the float32 fused op on its widened values: y and grad_x of the
// 16-bit call are the float32 call's rounded once, everything else its bits, on
// every ISA this CPU runs; the dtypes y, argmax and the gradients take beside a
// 16-bit x; and float32 gradients beside it, the float32 backward on the widened x.
// The problem, the fused pair and the exact comparison are in batchnorm_pool_case.h.
#include <string>
#include <tuple>
#include <vector>

#include "batchnorm_pool_case.h"
#include "kernels/batchnorm.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// p with x, grad_y and grad_x's starting values rounded to the 16-bit `dtype` (the
// per-channel tensors stay float32), and that problem's float32 twin: the same
// values widened.
Problem rounded(const Problem& p, DType dtype) {
  Problem q = p;
  q.dtype = dtype;
  q.x = cast(p.x, dtype, cpu());
  q.grad_y = cast(p.grad_y, dtype, cpu());
  q.grad_x0 = cast(p.grad_x0, dtype, cpu());
  return q;
}
Problem widened(const Problem& q) {
  Problem p = q;
  p.dtype = DType::Float32;
  p.x = cast(q.x, DType::Float32, cpu());
  p.grad_y = cast(q.grad_y, DType::Float32, cpu());
  p.grad_x0 = cast(q.grad_x0, DType::Float32, cpu());
  return p;
}

// fn(q, dtype) for each 16-bit dtype, case and activation: q the case's problem
// rounded to dtype.
template <typename Fn>
void for_each_rounded_problem(const Fn& fn) {
  for (const DType dtype : {DType::BFloat16, DType::Float16}) {
    for (const Case& c : cases()) {
      for (Activation activation : {Activation::None, Activation::ReLU}) {
        fn(rounded(make_problem(c.x, c.pool, activation, DType::Float32), dtype), dtype);
      }
    }
  }
}

// A bfloat16 or float16 x, y, grad_y and grad_x (argmax and the per-channel tensors
// float32): the float32 fused op's results on the widened tensors, y and the
// accumulated grad_x rounded once, everything else those float32 bits, on every
// ISA this CPU runs (the CPU widens and rounds each plane with convert16.h's code
// for the ISA), on every case's windows, with and without the ReLU.
TEST(BatchNormMaxPoolTest, SixteenBitIsTheFloat32OpOnTheWidenedTensors) {
  const RestoreGemmIsa restore;
  int runs = 0;
  for_each_rounded_problem([&](const Problem& q, DType dtype) {
    set_gemm_isa(GemmIsa::Portable);
    const Results expected = fused(widened(q));
    for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
      if (!gemm_isa_supported(isa)) continue;
      set_gemm_isa(isa);
      ++runs;
      const std::string where = "ISA " + std::to_string(int(isa)) + "; " + describe(q);
      const Results actual = fused(q);
      ASSERT_EQ(actual.y.dtype(), dtype) << where;
      EXPECT_TRUE(identical(actual.y, cast(expected.y, dtype, cpu()))) << "y; " << where;
      EXPECT_TRUE(identical(actual.grad_x, cast(expected.grad_x, dtype, cpu())))
          << "grad_x; " << where;
      for (const auto& [name, a, e] :
           {std::tuple{"save_mean", actual.save_mean, expected.save_mean},
            {"save_inv_std", actual.save_inv_std, expected.save_inv_std},
            {"moving_mean", actual.moving_mean, expected.moving_mean},
            {"moving_var", actual.moving_var, expected.moving_var},
            {"grad_gamma", actual.grad_gamma, expected.grad_gamma},
            {"grad_beta", actual.grad_beta, expected.grad_beta},
            {"argmax", actual.argmax, expected.argmax}}) {
        EXPECT_TRUE(identical(a, e)) << name << "; " << where;
      }
      // Control: the 16-bit outputs were rounded (the float32 values are not all
      // 16-bit ones), so comparing them unrounded would fail.
      EXPECT_FALSE(identical(cast(actual.grad_x, DType::Float32, cpu()), expected.grad_x)) << where;
    }
  });
  EXPECT_GE(runs, 2 * int(cases().size()) * 2);
}

// Beside a 16-bit x, y (or grad_y) has x's dtype and argmax is float32.
TEST(BatchNormMaxPoolTest, SixteenBitXTakesAFloat32ArgmaxAndItsOwnDtype) {
  const Problem q = rounded(
      make_problem({2, 3, 4, 4}, Pool2dParams::square(2, 2), Activation::None, DType::Float32),
      DType::BFloat16);
  Results r = fresh_outputs(q);
  BatchNormMaxPoolForwardTraining forward = fused_forward_args(q, r);
  forward.argmax = Tensor::empty(q.y_shape, cpu(), DType::BFloat16);
  EXPECT_THROW_WITH(batchnorm_max_pool_forward_training(forward, cpu()), ShapeError,
                    "batchnorm_max_pool_forward_training: argmax is bfloat16[2,3,2,2] on cpu "
                    "but x is bfloat16[2,3,4,4] on cpu, whose argmax is float32");
  forward = fused_forward_args(q, r);
  forward.y = Tensor::empty(q.y_shape, cpu());
  EXPECT_THROW_WITH(batchnorm_max_pool_forward_training(forward, cpu()), ShapeError,
                    "batchnorm_max_pool_forward_training: y is float32[2,3,2,2] on cpu but x is "
                    "bfloat16[2,3,4,4] on cpu");
  batchnorm_max_pool_forward_training(fused_forward_args(q, r), cpu());
  BatchNormMaxPoolBackward backward = fused_backward_args(q, fused_forward_args(q, r), r);
  backward.grad_y = Tensor::empty(q.y_shape, cpu(), DType::Float16);
  EXPECT_THROW_WITH(batchnorm_max_pool_backward(backward, cpu()), ShapeError,
                    "batchnorm_max_pool_backward: grad_y is float16[2,3,2,2] on cpu but x is "
                    "bfloat16[2,3,4,4] on cpu");
  // Float32 gradients beside the 16-bit x are the policy's backward (the test
  // below), and so is a float32 grad_y with a grad_x of x's dtype (rounded as it is
  // stored: SixteenBitGradXBesideFloat32GradYIsTheFloat32GradXRoundedOnce); a grad_x
  // of the other 16-bit dtype is not.
  backward.grad_y = cast(q.grad_y, DType::Float32, cpu());
  backward.grad_x = Tensor::zeros(q.x_shape, cpu(), DType::Float16);
  EXPECT_THROW_WITH(batchnorm_max_pool_backward(backward, cpu()), ShapeError,
                    "batchnorm_max_pool_backward: grad_x is float16[2,3,4,4] on cpu but grad_y "
                    "is float32[2,3,2,2] on cpu");
}

// Float32 grad_y and grad_x beside a 16-bit x (kernels/batchnorm.h, the policy's
// backward): the fused backward reads x's planes widened as it goes and gives the
// bits of the float32 backward on the widened x, grad_x added to or assigned, the
// parameter gradients added to, on every ISA this CPU runs. Control: the same
// backward on the unrounded float32 x gives other bits, so a backward that read x
// other than as its exact widening would fail.
TEST(BatchNormMaxPoolTest, SixteenBitXBesideFloat32GradientsIsTheBackwardOnTheWidenedX) {
  const RestoreGemmIsa restore;
  int runs = 0;
  for (const DType dtype : {DType::BFloat16, DType::Float16}) {
    for (const Case& c : cases()) {
      for (Activation activation : {Activation::None, Activation::ReLU}) {
        const Problem p = make_problem(c.x, c.pool, activation, DType::Float32);
        const Problem q = rounded(p, dtype), w = widened(q);
        Results r = fresh_outputs(q);
        const BatchNormMaxPoolForwardTraining forward = fused_forward_args(q, r);
        batchnorm_max_pool_forward_training(forward, cpu());
        // The backward of the 16-bit forward for x, into fresh float32 gradients
        // (w's sentinels) from w's float32 grad_y.
        auto backward = [&](const Tensor& x, GradWrite write) {
          Results g = fresh_outputs(w);
          BatchNormMaxPoolBackward args = fused_backward_args(w, forward, g);
          args.x = x;
          args.grad_x_write = write;
          batchnorm_max_pool_backward(args, cpu());
          return g;
        };
        for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
          if (!gemm_isa_supported(isa)) continue;
          set_gemm_isa(isa);
          for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
            ++runs;
            const std::string where = "ISA " + std::to_string(int(isa)) + "; " + describe(q) +
                                      (write == GradWrite::Assign ? ", assigned" : ", added");
            const Results actual = backward(q.x, write), expected = backward(w.x, write);
            ASSERT_EQ(actual.grad_x.dtype(), DType::Float32) << where;
            EXPECT_TRUE(identical(actual.grad_x, expected.grad_x)) << "grad_x; " << where;
            EXPECT_TRUE(identical(actual.grad_gamma, expected.grad_gamma))
                << "grad_gamma; " << where;
            EXPECT_TRUE(identical(actual.grad_beta, expected.grad_beta)) << "grad_beta; " << where;
            EXPECT_FALSE(identical(actual.grad_x, backward(p.x, write).grad_x))
                << "control; " << where;
          }
        }
      }
    }
  }
  EXPECT_GE(runs, 2 * int(cases().size()) * 2 * 2);
}

// A grad_x of the 16-bit x's dtype beside float32 grad_y (kernels/batchnorm.h: how a
// 16-bit tape's batch norm hands a convolution its rounded gradient): the fused
// backward's float32 grad_x rounded once as it is stored, assigned or added to in
// float32 (from the sentinel's values), on every ISA this CPU runs. Control: the
// added and the assigned grad_x differ.
TEST(BatchNormMaxPoolTest, SixteenBitGradXBesideFloat32GradYIsTheFloat32GradXRoundedOnce) {
  const RestoreGemmIsa restore;
  int runs = 0;
  for_each_rounded_problem([&](const Problem& q, DType dtype) {
    const Problem w = widened(q);
    Results r = fresh_outputs(q);
    const BatchNormMaxPoolForwardTraining forward = fused_forward_args(q, r);
    batchnorm_max_pool_forward_training(forward, cpu());
    // The backward of the 16-bit forward from w's float32 grad_y into grad_x from
    // w's sentinel, as it is (float32) or rounded (16-bit: held exactly).
    auto backward = [&](DType grad_x_dtype, GradWrite write) {
      const Results g = fresh_outputs(w);
      BatchNormMaxPoolBackward args = fused_backward_args(w, forward, g);
      args.x = q.x;
      args.grad_x = cast(g.grad_x, grad_x_dtype, cpu());
      args.grad_x_write = write;
      batchnorm_max_pool_backward(args, cpu());
      return args.grad_x;
    };
    for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
      if (!gemm_isa_supported(isa)) continue;
      set_gemm_isa(isa);
      Tensor results[2];
      for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
        ++runs;
        const std::string where = "ISA " + std::to_string(int(isa)) + "; " + describe(q) +
                                  (write == GradWrite::Assign ? ", assigned" : ", added");
        const Tensor actual = backward(dtype, write);
        ASSERT_EQ(actual.dtype(), dtype) << where;
        EXPECT_TRUE(identical(actual, cast(backward(DType::Float32, write), dtype, cpu())))
            << where;
        results[write == GradWrite::Assign ? 1 : 0] = actual;
      }
      EXPECT_FALSE(identical(results[0], results[1])) << "control; " << describe(q);
    }
  });
  EXPECT_GE(runs, 2 * int(cases().size()) * 2 * 2);
}

}  // namespace
}  // namespace towerlab::testing
