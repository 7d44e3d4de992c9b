// The plain reference of the optimizer updates (contracts and hyperparameters in
// kernels/optimizer.h): one element at a time, in double, straight from the
// formulas, with the bias corrections taken from the step count. The CPU backend's
// loops (in the buffers' dtype, the scalars folded once, Adam's in AVX2 and
// AVX-512 too) and the CUDA kernel are tested against it.
//
// Every array is [n], updated in place: p the parameters, g the gradient, and the
// optimizer's slots.
#pragma once

#include <cstdint>

#include "kernels/optimizer.h"

namespace towerlab::reference {

// d = g + weight_decay * p; momentum 0: p -= lr * d; else v = momentum * v + d,
// p -= lr * (nesterov ? d + momentum * v : v). velocity may be nullptr when momentum is 0.
void sgd_update(double* p, const double* g, double* velocity, std::int64_t n,
                const SgdParams& params);

// ms = decay * ms + (1 - decay) * g^2; centered: mg = decay * mg + (1 - decay) * g;
// mom = momentum * mom + lr * g / sqrt(ms (- mg^2 when centered) + epsilon); p -= mom.
// mean_grad may be nullptr when not centered.
void rmsprop_update(double* p, const double* g, double* mean_square, double* moment,
                    double* mean_grad, std::int64_t n, const RmspropParams& params);

// Adam at the 1-based step t: g += weight_decay * p; m = beta1 * m + (1 - beta1) * g;
// v = beta2 * v + (1 - beta2) * g^2; p -= lr * m_hat / (sqrt(v_hat) + epsilon) with
// m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t).
void adam_update(double* p, const double* g, double* m, double* v, std::int64_t n, int t,
                 const AdamParams& params);

// AdamW: p *= 1 - lr * weight_decay first (decoupled), then Adam with g unchanged.
void adamw_update(double* p, const double* g, double* m, double* v, std::int64_t n, int t,
                  const AdamParams& params);

}  // namespace towerlab::reference
