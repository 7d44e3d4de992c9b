// Batch norm with a fused max pool (kernels/batchnorm.h, CPU only) against the
// unfused composition it replaces: batchnorm_forward_training then
// max_pool2d_forward_with_argmax; max_pool2d_backward_from_argmax (Assign) into a
// fresh gradient, then batchnorm_backward. The contract promises the composition's
// values bit for bit, so every comparison is exact (== on each value, which takes
// +0 and -0 as equal), in float32 and float64, with and without the ReLU, on
// windows that tile the plane, leave rows and columns uncovered, overlap or pad.
// The fused forward's argmax is the composition's wherever it is not -1, and -1
// exactly where the ReLU zeroes the window (the composed pooled y is not > 0).
// The data makes the comparison able to fail: gamma has negative channels, so the
// argmax of the activation is not the argmax of x, and a negative beta leaves
// windows that the ReLU clamps entirely, where only the mask stops the gradient.
// Then assignment against accumulation, optional gradients, 1 thread against 2,
// every ISA against the portable code, a float64 gradient check of the fused op
// alone, and the argument errors. A 16-bit x is tested in
// batchnorm_pool_sixteen_bit_test.cpp; the problem, the composition, the fused pair
// and the exact comparison that both files use are in batchnorm_pool_case.h.
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "batchnorm_pool_case.h"
#include "gradcheck.h"
#include "kernels/batchnorm.h"
#include "kernels/cpu/parallel.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// The fused forward's argmax against the composition's (`expected`): -1 exactly
// where the ReLU zeroes the window, that is where the composed pooled y is not > 0
// (never without the ReLU), and elsewhere the composition's position.
::testing::AssertionResult argmax_matches(const Tensor& fused_argmax, const Results& expected,
                                          Activation activation) {
  if (fused_argmax.shape() != expected.argmax.shape() ||
      fused_argmax.dtype() != expected.argmax.dtype()) {
    return ::testing::AssertionFailure()
           << fused_argmax.describe() << " vs " << expected.argmax.describe();
  }
  const std::vector<double> a = values(fused_argmax), e = values(expected.argmax),
                            y = values(expected.y);
  std::size_t differ = 0;
  std::ostringstream first;
  first.precision(17);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool zeroed = activation == Activation::ReLU && !(y[i] > 0.0);
    if (zeroed ? a[i] == -1.0 : (a[i] != -1.0 && a[i] == e[i])) continue;
    if (++differ <= 3) {
      first << " [" << i << "] " << a[i] << " vs " << (zeroed ? -1.0 : e[i]) << " (pooled y "
            << y[i] << ");";
    }
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << differ << " of " << a.size() << " positions differ:" << first.str();
}

// Every output but argmax.
void expect_identical_values(const Results& actual, const Results& expected,
                             const std::string& where) {
  EXPECT_TRUE(identical(actual.y, expected.y)) << "y; " << where;
  EXPECT_TRUE(identical(actual.save_mean, expected.save_mean)) << "save_mean; " << where;
  EXPECT_TRUE(identical(actual.save_inv_std, expected.save_inv_std)) << "save_inv_std; " << where;
  EXPECT_TRUE(identical(actual.moving_mean, expected.moving_mean)) << "moving_mean; " << where;
  EXPECT_TRUE(identical(actual.moving_var, expected.moving_var)) << "moving_var; " << where;
  EXPECT_TRUE(identical(actual.grad_x, expected.grad_x)) << "grad_x; " << where;
  EXPECT_TRUE(identical(actual.grad_gamma, expected.grad_gamma)) << "grad_gamma; " << where;
  EXPECT_TRUE(identical(actual.grad_beta, expected.grad_beta)) << "grad_beta; " << where;
}

// Two runs of the fused op: every output, argmax included, identical.
void expect_identical(const Results& actual, const Results& expected, const std::string& where) {
  expect_identical_values(actual, expected, where);
  EXPECT_TRUE(identical(actual.argmax, expected.argmax)) << "argmax; " << where;
}

// The fused op's outputs against the composition's on problem p.
void expect_composition(const Results& fused_results, const Results& composed_results,
                        const Problem& p, const std::string& where) {
  expect_identical_values(fused_results, composed_results, where);
  EXPECT_TRUE(argmax_matches(fused_results.argmax, composed_results, p.activation))
      << "argmax; " << where;
}

// --- the fused op is the composition, bit for bit ------------------------------------

TEST(BatchNormMaxPoolTest, EqualsTheCompositionExactly) {
  for (const Case& c : cases()) {
    for (DType dtype : {DType::Float32, DType::Float64}) {
      for (Activation activation : {Activation::None, Activation::ReLU}) {
        const Problem p = make_problem(c.x, c.pool, activation, dtype);
        const std::string where = describe(p);
        const Results expected = composed(p);
        const Results actual = fused(p);
        expect_composition(actual, expected, p, where);

        // Controls: this data can tell a wrong fused op from the right one.
        // (1) Pooling x instead of the activation picks other positions: the
        // negative gamma channels reverse the order within each window.
        Tensor y_of_x = Tensor::empty(p.y_shape, cpu(), dtype);
        Tensor argmax_of_x = Tensor::empty(p.y_shape, cpu(), dtype);
        max_pool2d_forward_with_argmax(y_of_x, argmax_of_x, p.x, p.pool, cpu());
        EXPECT_FALSE(identical(argmax_of_x, expected.argmax)) << where;
        // (2) With the ReLU, some windows are clamped to 0 entirely: there the
        // pooled gradient lands on a masked position, and a backward that skipped
        // the mask would differ.
        if (activation == Activation::ReLU) {
          std::size_t zeros = 0;
          for (double v : values(expected.y)) zeros += v == 0.0;
          EXPECT_GT(zeros, 0u) << "no window is clamped entirely; " << where;
          // There the fused argmax is -1, not the composition's position.
          EXPECT_FALSE(identical(actual.argmax, expected.argmax)) << where;
        }
        // (3) The outputs are not trivial.
        EXPECT_FALSE(identical(expected.grad_x, p.grad_x0)) << where;
      }
    }
  }
}

// The backward's two writes of grad_x: Assign never reads grad_x (it starts as
// NaN here) and gives the composition's assigned values; Accumulate onto a
// non-zero grad_x gives exactly old + assigned.
TEST(BatchNormMaxPoolTest, AssignsOrAccumulatesGradX) {
  for (const Case& c : {cases()[1], cases()[6]}) {
    for (DType dtype : {DType::Float32, DType::Float64}) {
      for (Activation activation : {Activation::None, Activation::ReLU}) {
        Problem p = make_problem(c.x, c.pool, activation, dtype);
        const std::string where = describe(p);
        const Results accumulated = fused(p, GradWrite::Accumulate);
        const Tensor old = p.grad_x0;
        p.grad_x0 = nans(p.x_shape, dtype);
        const Results assigned = fused(p, GradWrite::Assign);
        expect_composition(assigned, composed(p, GradWrite::Assign), p, "Assign; " + where);
        Tensor old_plus_assigned = Tensor::empty(p.x_shape, cpu(), dtype);
        add(old_plus_assigned, old, assigned.grad_x, cpu());
        EXPECT_TRUE(identical(accumulated.grad_x, old_plus_assigned)) << where;
        // Control: the accumulation really started from a non-zero grad_x.
        EXPECT_FALSE(identical(accumulated.grad_x, assigned.grad_x)) << where;
      }
    }
  }
}

// Each gradient is optional: computing any subset gives the same values as
// computing all three, and computing none changes nothing. The moving statistics
// are optional in the forward (both undefined skips the update).
TEST(BatchNormMaxPoolTest, UndefinedTensorsAreSkipped) {
  for (Activation activation : {Activation::None, Activation::ReLU}) {
    const Problem p =
        make_problem({3, 4, 10, 10}, Pool2dParams::square(2, 2), activation, DType::Float32);
    const std::string where = describe(p);
    const Results all = fused(p);

    BatchNormMaxPoolForwardTraining forward = fused_forward_args(p, fresh_outputs(p));
    forward.moving_mean = forward.moving_var = Tensor();
    batchnorm_max_pool_forward_training(forward, cpu());
    EXPECT_TRUE(identical(forward.y, all.y)) << "without moving statistics; " << where;
    EXPECT_TRUE(identical(forward.argmax, all.argmax)) << "without moving statistics; " << where;
    EXPECT_TRUE(identical(forward.save_inv_std, all.save_inv_std)) << where;

    auto backward = [&](const Tensor& grad_x, const Tensor& grad_gamma, const Tensor& grad_beta) {
      BatchNormMaxPoolBackward args = fused_backward_args(p, fused_forward_args(p, all), all);
      args.grad_x = grad_x;
      args.grad_gamma = grad_gamma;
      args.grad_beta = grad_beta;
      batchnorm_max_pool_backward(args, cpu());
    };
    for (int mask = 0; mask < 8; ++mask) {  // bit 0: grad_x, bit 1: grad_gamma, bit 2: grad_beta
      Tensor grad_x = p.grad_x0.clone(cpu()), grad_gamma = p.grad_gamma0.clone(cpu()),
             grad_beta = p.grad_beta0.clone(cpu());
      backward(mask & 1 ? grad_x : Tensor(), mask & 2 ? grad_gamma : Tensor(),
               mask & 4 ? grad_beta : Tensor());
      const std::string which = "gradients " + std::to_string(mask) + "; " + where;
      EXPECT_TRUE(identical(grad_x, mask & 1 ? all.grad_x : p.grad_x0)) << "grad_x, " << which;
      EXPECT_TRUE(identical(grad_gamma, mask & 2 ? all.grad_gamma : p.grad_gamma0))
          << "grad_gamma, " << which;
      EXPECT_TRUE(identical(grad_beta, mask & 4 ? all.grad_beta : p.grad_beta0))
          << "grad_beta, " << which;
    }
  }
}

// --- threads -----------------------------------------------------------------------

// Sizes above the pool's threshold (kernels/cpu/parallel.h), so that 2 threads
// really split the work; C = 5 does not divide evenly over them. The suite's name
// starts with "ThreadPool" so that the ThreadSanitizer stage of the CI runs it.
class ThreadPoolBatchNormMaxPoolTest : public RestoresThreadCount {};

TEST_F(ThreadPoolBatchNormMaxPoolTest, SameBitsForOneAndTwoThreads) {
  const Shape x_shape = {7, 5, 31, 37};
  ASSERT_GE(numel_of(x_shape), 2 * cpu::kMinParallelValues);
  for (const Pool2dParams& pool : {Pool2dParams::square(2, 2), Pool2dParams::square(3, 2, 1)}) {
    for (GradWrite write : {GradWrite::Accumulate, GradWrite::Assign}) {
      const Problem p = make_problem(x_shape, pool, Activation::ReLU, DType::Float32);
      const std::string where =
          describe(p) + (write == GradWrite::Assign ? ", Assign" : ", Accumulate");
      set_num_threads(1);
      const Results one = fused(p, write);
      expect_composition(one, composed(p, write), p, "1 thread; " + where);
      set_num_threads(2);
      const Results two = fused(p, write);
      expect_identical(two, one, "2 threads against 1; " + where);
      expect_composition(two, composed(p, write), p, "2 threads; " + where);
      // A tower's share of the pool (2 towers on 4 threads: 2 each).
      set_num_threads(4);
      const ThreadShare share(0, 2);
      expect_identical(fused(p, write), one, "a tower's 2 of 4 threads; " + where);
    }
  }
}

// --- every ISA ---------------------------------------------------------------------

// The float32 batch norm has AVX-512 forms of its row sums and elementwise passes
// beside the portable code (kernels/cpu/batchnorm.cpp), in one summation order:
// every ISA this CPU runs must give the portable code's bits, fused and composed,
// with and without the ReLU. The planes' sizes S cover a row shorter than one
// 16-lane vector (9), one vector exactly (16), a partial second vector (25), one
// block of 32 lanes exactly (32), and whole blocks with tails of 4, 15, 16, 17 and
// 31 values (36, 143, 784, 49, 63), and FashionNet's 196.
TEST(BatchNormMaxPoolTest, EveryIsaGivesThePortableBits) {
  const RestoreGemmIsa restore;
  std::vector<Case> all = cases();
  for (const Shape& x :
       {Shape{2, 3, 2, 8}, Shape{2, 3, 5, 5}, Shape{3, 2, 4, 8}, Shape{2, 2, 7, 7}}) {
    all.push_back({x, Pool2dParams::square(2, 2)});
  }
  int isas = 0;
  for (const Case& c : all) {
    for (Activation activation : {Activation::None, Activation::ReLU}) {
      const Problem p = make_problem(c.x, c.pool, activation, DType::Float32);
      set_gemm_isa(GemmIsa::Portable);
      const Results portable_fused = fused(p), portable_composed = composed(p);
      for (GemmIsa isa : {GemmIsa::Avx2, GemmIsa::Avx512}) {
        if (!gemm_isa_supported(isa)) continue;
        set_gemm_isa(isa);
        ++isas;
        const std::string where = "ISA " + std::to_string(int(isa)) + "; " + describe(p);
        expect_identical(fused(p), portable_fused, "fused, " + where);
        expect_identical(composed(p), portable_composed, "composed, " + where);
      }
    }
  }
  if (isas == 0) GTEST_SKIP() << "this CPU runs only the portable code";
}

// --- gradients in float64 ----------------------------------------------------------

// The fused backward is the derivative of the fused forward, with the ReLU, for
// a window that tiles and one that overlaps with padding. L = sum(g * y).
TEST(BatchNormMaxPoolGradient, MatchesCentralDifferences) {
  for (const Pool2dParams& pool : {Pool2dParams::square(2, 2), Pool2dParams::square(3, 2, 1)}) {
    const Problem p = make_problem({3, 2, 5, 6}, pool, Activation::ReLU, DType::Float64);
    const std::int64_t C = p.x_shape[1];
    auto forward = [&](const std::vector<Tensor>& in) {
      BatchNormMaxPoolForwardTraining f = fused_forward_args(p, fresh_outputs(p));
      f.moving_mean = f.moving_var = Tensor();
      f.x = in[0];
      f.gamma = in[1];
      f.beta = in[2];
      batchnorm_max_pool_forward_training(f, cpu());
      return f;
    };
    auto loss = [&](const std::vector<Tensor>& in) {
      return weighted_sum(p.grad_y, forward(in).y);
    };
    const BatchNormMaxPoolForwardTraining f = forward({p.x, p.gamma, p.beta});
    std::size_t zeros = 0;
    for (double v : f.y.to_host<double>(cpu())) zeros += v == 0.0;
    EXPECT_GT(zeros, 0u) << "no window clamped by the ReLU; " << describe(p);

    Results grads;
    grads.grad_x = Tensor::zeros(p.x_shape, cpu(), DType::Float64);
    grads.grad_gamma = Tensor::zeros({C}, cpu(), DType::Float64);
    grads.grad_beta = Tensor::zeros({C}, cpu(), DType::Float64);
    batchnorm_max_pool_backward(fused_backward_args(p, f, grads), cpu());
    GradcheckOptions options;
    options.atol = 1e-5;
    options.rtol = 1e-4;
    EXPECT_TRUE(check_gradient(loss, {p.x, p.gamma, p.beta},
                               {grads.grad_x, grads.grad_gamma, grads.grad_beta}, options))
        << describe(p);
  }
}

// --- errors ------------------------------------------------------------------------

// Runs `call`, expecting an ErrorType; returns its message, or "" after recording
// a failure.
template <typename ErrorType>
std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const ErrorType& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

// The message names the op and says what was wrong.
void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos)
        << "expected \"" << part << "\" in: " << message;
  }
}

TEST(BatchNormMaxPoolTest, RejectsBadArguments) {
  const char* forward_op = "batchnorm_max_pool_forward_training";
  const char* backward_op = "batchnorm_max_pool_backward";
  const Pool2dParams pool = Pool2dParams::square(2, 2);
  const Tensor x = Tensor::zeros({2, 3, 4, 4}, cpu()), y = Tensor::zeros({2, 3, 2, 2}, cpu());
  const Tensor argmax = Tensor::zeros({2, 3, 2, 2}, cpu());
  const Tensor unpooled = Tensor::zeros({2, 3, 4, 4}, cpu());  // x's shape, not y's
  auto channels = [](std::int64_t C) { return Tensor::zeros({C}, cpu()); };
  const Tensor c3 = channels(3), c4 = channels(4);  // gamma, beta
  const Tensor mean = channels(3), inv_std = channels(3);
  const Tensor grad_x = Tensor::zeros({2, 3, 4, 4}, cpu());
  const Tensor grad_gamma = channels(3), grad_beta = channels(3);
  auto forward = [&](const Tensor& y_, const Tensor& argmax_, const Tensor& x_,
                     const Tensor& gamma) {
    return [&, y_, argmax_, x_, gamma] {
      batchnorm_max_pool_forward_training({.y = y_,
                                           .argmax = argmax_,
                                           .save_mean = mean,
                                           .save_inv_std = inv_std,
                                           .x = x_,
                                           .gamma = gamma,
                                           .beta = c3,
                                           .eps = kEps,
                                           .momentum = kMomentum,
                                           .pool = pool,
                                           .activation = Activation::ReLU},
                                          cpu());
    };
  };
  auto backward = [&](const Tensor& grad_y, const Tensor& argmax_, const Tensor& x_,
                      const Tensor& gamma) {
    return [&, grad_y, argmax_, x_, gamma] {
      batchnorm_max_pool_backward({.grad_x = grad_x,
                                   .grad_gamma = grad_gamma,
                                   .grad_beta = grad_beta,
                                   .grad_y = grad_y,
                                   .argmax = argmax_,
                                   .x = x_,
                                   .gamma = gamma,
                                   .save_mean = mean,
                                   .save_inv_std = inv_std,
                                   .pool = pool},
                                  cpu());
    };
  };

  // The arguments below are valid: each error comes from the one bad tensor.
  EXPECT_NO_THROW(forward(y, argmax, x, c3)());
  EXPECT_NO_THROW(backward(y, argmax, x, c3)());

  // y of the unpooled shape.
  expect_mentions(message_of<ShapeError>(forward(unpooled, argmax, x, c3)),
                  {forward_op, "y is float32[2,3,4,4]"});
  // argmax of the unpooled shape.
  expect_mentions(message_of<ShapeError>(forward(y, unpooled, x, c3)),
                  {forward_op, "argmax is float32[2,3,4,4]"});
  expect_mentions(message_of<ShapeError>(backward(y, unpooled, x, c3)),
                  {backward_op, "argmax is float32[2,3,4,4]"});
  // x [N,C]: fine for batch norm, but there is no plane to pool.
  expect_mentions(message_of<ShapeError>(forward(y, argmax, Tensor::zeros({8, 3}, cpu()), c3)),
                  {forward_op, "float32[8,3]"});
  expect_mentions(message_of<ShapeError>(backward(y, argmax, Tensor::zeros({8, 3}, cpu()), c3)),
                  {backward_op, "float32[8,3]"});
  // gamma with 4 channels for x's 3.
  expect_mentions(message_of<ShapeError>(forward(y, argmax, x, c4)),
                  {forward_op, "gamma is float32[4]"});
  expect_mentions(message_of<ShapeError>(backward(y, argmax, x, c4)),
                  {backward_op, "gamma is float32[4]"});
  // grad_y of the unpooled shape.
  expect_mentions(message_of<ShapeError>(backward(unpooled, argmax, x, c3)),
                  {backward_op, "grad_y is float32[2,3,4,4]"});
}

// On a GPU the fused op is not there: ag::batchnorm_max_pool2d composes the two
// ops instead.
TEST(BatchNormMaxPoolTest, CudaStreamIsNotSupported) {
  skip_without_cuda_device();
  if (IsSkipped() || HasFatalFailure()) return;
  Stream gpu(Device::cuda(0));
  // The device is refused first, before any other argument is looked at.
  const Tensor x = Tensor::zeros({2, 3, 4, 4}, gpu);
  EXPECT_THROW_WITH(batchnorm_max_pool_forward_training({.x = x}, gpu), NotSupported,
                    "batchnorm_max_pool_forward_training: the fused max pool runs on the CPU");
  EXPECT_THROW_WITH(batchnorm_max_pool_backward({.x = x}, gpu), NotSupported,
                    "batchnorm_max_pool_backward: the fused max pool runs on the CPU");
}

}  // namespace
}  // namespace towerlab::testing
