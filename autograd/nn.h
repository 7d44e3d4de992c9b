// Differentiable neural-network ops: the kernels of the CNN families on a tape.
// Shape errors name the op and the Vars involved, e.g.
//   "linear: x float32[128,3136] has 3136 features but fc1/weight float32[128,784] expects 784"
#pragma once

#include "../kernels/conv2d.h"
#include "../kernels/pool2d.h"
#include "../kernels/relu.h"
#include "tape.h"

namespace towerlab {

// The cross-tower collective behind synchronized batch norm, implemented by the
// trainer (parallel/sync_batchnorm.h). Every participating tower calls the same
// methods in the same order; each call returns once all of them have arrived.
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // mean, m2 [C]: this tower's partial statistics over `count` values per channel;
  // replaced by the statistics of all towers merged. Returns the total count.
  virtual std::int64_t merge_stats(int tower, const Tensor& mean, const Tensor& m2,
                                   std::int64_t count, const Stream& stream) = 0;
  // a, b [C]: replaced by their sums over all towers.
  virtual void sum(int tower, const Tensor& a, const Tensor& b, const Stream& stream) = 0;
};

}  // namespace towerlab

namespace towerlab::ag {

// op(a) * op(b) for 2-D a, b (kernels/matmul.h).
// Under a 16-bit compute dtype (Tape::compute_dtype, docs/precision.md) matmul,
// linear, batched_matmul and conv2d multiply 16-bit operands (a variable's working
// copy, a 16-bit activation, a float32 one rounded at the op, and in the backward the
// output gradient rounded) with float32 sums; their outputs are those sums rounded
// once to the 16-bit dtype, and every gradient is float32 (a bias, and its gradient,
// stay float32). The other ops here take a 16-bit x through their 16-bit forward
// kernels (bias_add, pooling, batch norm) and, beside the float32 gradients, their
// float32 backward kernels (a saved 16-bit x widened first: batch norm).
// Float32 tapes run exactly the float32 kernels, with
// the tape's Float32Math (Tape::float32_math: TF32 on CUDA under the tf32
// precision), as does batched_matmul; conv2d's three passes take it too.
Var matmul(const Var& a, const Var& b, bool transpose_a = false, bool transpose_b = false);

// op(a_i) * op(b_i) for each batch entry (kernels/batched_matmul.h): a [B,M,K] and b
// [B,K,N] (or transposed) give [B,M,N]; either may be 2-D and shared by every entry
// (its gradient then sums over the batch).
Var batched_matmul(const Var& a, const Var& b, bool transpose_a = false, bool transpose_b = false);

// x [N,I], weight [O,I], bias [O] (or undefined): y = x weight^T + bias, [N,O],
// then the activation (with a bias, fused into the bias add: kernels/bias.h).
Var linear(const Var& x, const Var& weight, const Var& bias,
           Activation activation = Activation::None);

// x [N,C,H,W] + bias[C] broadcast (also [N,C]), then the activation, in one kernel
// each way (kernels/bias.h).
Var bias_add(const Var& x, const Var& bias, Activation activation = Activation::None);

// x [N,C,H,W], weight [K,C/G,R,S], bias [K] (or undefined) -> [N,K,P,Q], with G =
// params.groups (grouped and depthwise convolutions: kernels/conv2d.h).
Var conv2d(const Var& x, const Var& weight, const Var& bias, const Conv2dParams& params);

// When x needs a gradient, the forward records each window's argmax and the
// backward scatters through it (kernels/pool2d.h); the values are the same. The
// pools take x in its own dtype, bfloat16 and float16 included (computed in float32,
// rounded once: kernels/pool2d.h), and give y in it; x's gradient is float32 for a
// 16-bit x (Tape::grad_dtype), from the float32 backward kernels, which read no x.
Var max_pool2d(const Var& x, const Pool2dParams& params);
Var avg_pool2d(const Var& x, const Pool2dParams& params);
// The mean of each channel's plane: x [N,C,H,W] -> [N,C] (a ResNet's head; PyTorch's
// adaptive_avg_pool2d(x, 1) then flatten). An average pool whose window is the plane.
Var global_avg_pool2d(const Var& x);

// Batch normalization of x [N,C,H,W] or [N,C] with scale gamma and shift beta [C].
// training: batch statistics, and moving_mean / moving_var [C] (plain tensors, the
// layer's non-trainable state) are updated in place with `momentum` (TensorFlow's
// decay: the weight of the old value). Inference: the moving statistics normalize.
// The activation is fused into batch norm's kernels, forward and backward
// (kernels/batchnorm.h). A bfloat16 or float16 x gives y in its dtype (the 16-bit
// kernels), with gamma, beta, the moving statistics and their gradients float32 (as
// PyTorch's batch norm under autocast); x's gradient is float32 (Tape::grad_dtype),
// from the float32 backward kernel on x widened.
Var batchnorm(const Var& x, const Var& gamma, const Var& beta, const Tensor& moving_mean,
              const Tensor& moving_var, bool training, double momentum = 0.99, double eps = 1e-3,
              Activation activation = Activation::None);

// max_pool2d(batchnorm(x, ...), pool) for x [N,C,H,W] as one op. Training on the CPU
// runs the fused kernels (kernels/batchnorm.h: the activation and its gradient are
// never stored), a 16-bit x in its dtype (y too, the statistics and argmax float32;
// the backward widens the saved x to meet the float32 gradients); inference and
// other devices compose the two ops. Either way the values and gradients are the
// composition's on x (a 16-bit x widened, y rounded once), bit for bit.
Var batchnorm_max_pool2d(const Var& x, const Var& gamma, const Var& beta, const Tensor& moving_mean,
                         const Tensor& moving_var, bool training, const Pool2dParams& pool,
                         double momentum = 0.99, double eps = 1e-3,
                         Activation activation = Activation::None);

// Training-mode batch norm with the statistics of every tower's slice: the towers'
// per-channel (mean, M2, count) are merged through `sync` in the forward pass, and
// the per-channel sums of the backward are all-reduced, so N towers normalize (and
// differentiate) exactly as one device on the whole batch, uneven splits included.
// gamma and beta get this tower's share of their gradient (the trainer's gradient
// all-reduce sums the shares).
Var sync_batchnorm(const Var& x, const Var& gamma, const Var& beta, const Tensor& moving_mean,
                   const Tensor& moving_var, BatchNormSync& sync, int tower, double momentum = 0.99,
                   double eps = 1e-3, Activation activation = Activation::None);

}  // namespace towerlab::ag
