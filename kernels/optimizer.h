// Optimizer updates: SGD (momentum, Nesterov, weight decay), RMSProp (TensorFlow's
// semantics, optionally centered), Adam and AdamW. Each is one fused pass over a
// flat parameter buffer: it reads p, g and the slots once and writes p and the
// slots once (on CUDA one kernel; the update is memory-bound, so that single pass
// is the whole cost).
//
// Tensors: param (p), grad (g) and the slot buffers all have one shape, n elements
// (normally the flat buffer of every variable, or a view into it), on the stream's
// device. The update is in place: p and the slots are read and written. They must
// not overlap one another or g (checked), which is what lets the kernels load and
// store each element exactly once. Every formula is per element i; the slots start
// where the caller puts them (see each optimizer). Empty tensors are a no-op.
// Hyperparameters are double; CUDA computes in float32.
//
// sgd_update(param, grad, velocity, SgdParams)          PyTorch's torch.optim.SGD,
//   d = g + weight_decay * p                            with dampening 0
//   momentum == 0:  p -= lr * d                         (velocity is not used and
//                                                       may be undefined)
//   momentum  > 0:  v = momentum * v + d
//                   p -= lr * (nesterov ? d + momentum * v : v)
//   Start v at 0: v after the first step is d, as PyTorch's buffer is. Nesterov needs
//   momentum > 0.
//
// rmsprop_update(param, grad, mean_square, moment, mean_grad, RmspropParams)
//   TensorFlow 1.x tf.train.RMSPropOptimizer, its ApplyRMSProp kernel:
//   ms  = decay * ms + (1 - decay) * g^2
//   centered:  mg = decay * mg + (1 - decay) * g;  denom = sqrt(ms - mg^2 + epsilon)
//   else:      denom = sqrt(ms + epsilon)                    (epsilon inside the sqrt)
//   mom = momentum * mom + lr * g / denom
//   p  -= mom
//   Slot initial values are the caller's: TensorFlow 1.x starts ms at 1.0 (fill the
//   mean_square buffer with 1 to reproduce it; Keras and PyTorch start at 0, which
//   makes the first steps large when epsilon is small), mom and mg at 0. mean_grad is
//   used only when centered (ignored, and may be undefined, otherwise); moment is
//   always used, as in TensorFlow, even when momentum is 0.
//
// adam_update(param, grad, m, v, step, AdamParams)         torch.optim.Adam
//   g  = g + weight_decay * p                              (L2 through the gradient)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + epsilon)
// adamw_update(param, grad, m, v, step, AdamParams)        torch.optim.AdamW
//   p  = p * (1 - lr * weight_decay)                       (decoupled), then as Adam
//   with g unchanged.
//   t = step is the 1-based count of this update (1 on the first call). m and v start
//   at 0. epsilon is outside the sqrt, as in the paper and PyTorch. The bias
//   corrections, 1 - beta and 1 - decay are computed in double on the host (as
//   PyTorch's Python floats are): 1 - 0.999f in float is off by 1.3e-5 relative.
//   rounded (optional, both): a bfloat16 or float16 tensor of a float32 param's shape,
//   disjoint from the others, that receives every updated value rounded once to
//   nearest even: the bits of cast(rounded, param) after the update, a mixed-precision
//   working copy (parallel/precision.h). The CPU writes it in the update's own pass,
//   block by block while the values are in cache; CUDA casts after its kernel.
#pragma once

#include <cstdint>

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

// Defaults: no momentum and no weight decay, as PyTorch's; lr has no universal default.
struct SgdParams {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// Defaults are TensorFlow's, except lr, which TensorFlow requires (0.001 is Keras's).
struct RmspropParams {
  double lr = 0.001;
  double decay = 0.9;
  double momentum = 0.0;
  double epsilon = 1e-10;
  bool centered = false;
};

// Defaults are PyTorch's for Adam (AdamW's weight_decay default there is 0.01).
struct AdamParams {
  double lr = 0.001;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 0.0;
};

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                const SgdParams& params, const Stream& stream);
void rmsprop_update(const Tensor& param, const Tensor& grad, const Tensor& mean_square,
                    const Tensor& moment, const Tensor& mean_grad, const RmspropParams& params,
                    const Stream& stream);
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 std::int64_t step, const AdamParams& params, const Stream& stream,
                 const Tensor& rounded = Tensor());
void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  std::int64_t step, const AdamParams& params, const Stream& stream,
                  const Tensor& rounded = Tensor());

}  // namespace towerlab
