// The CPU optimizer updates, and the Adam step both backends receive (internal:
// not installed, not in towerlab.h). Public contracts and dispatch in
// kernels/optimizer.h.
#pragma once

#include "engine/tensor.h"
#include "kernels/optimizer.h"

namespace towerlab {

// What the backends receive: the hyperparameters with the per-step constants
// already folded in (checked arguments; velocity/mean_grad undefined when unused).
struct AdamStep {
  double beta1, beta2, epsilon;
  double weight_decay;           // added to g: Adam's weight_decay; 0 for AdamW
  double decay_factor;           // p *= decay_factor first: 1 - lr * weight_decay (AdamW), 1 (Adam)
  double step_size;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

namespace cpu {
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                const SgdParams& params);
void rmsprop_update(const Tensor& param, const Tensor& grad, const Tensor& mean_square,
                    const Tensor& moment, const Tensor& mean_grad, const RmspropParams& params);
// rounded: undefined, or the 16-bit copy kernels/optimizer.h describes.
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 const AdamStep& step, const Tensor& rounded);
}  // namespace cpu

}  // namespace towerlab
