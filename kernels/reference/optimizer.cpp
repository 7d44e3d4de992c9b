// The optimizer updates' plain reference (contracts in kernels/reference/optimizer.h).
#include "kernels/reference/optimizer.h"

#include <cmath>

namespace towerlab::reference {

namespace {

// Adam and AdamW differ only in where the weight decay enters.
void adam_or_adamw(double* p, const double* grad, double* m, double* v, std::int64_t n, int t,
                   const AdamParams& h, bool decoupled) {
  for (std::int64_t i = 0; i < n; ++i) {
    double g = grad[i];
    if (decoupled) {
      p[i] *= 1 - h.lr * h.weight_decay;
    } else {
      g += h.weight_decay * p[i];
    }
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * g;
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * g * g;
    const double m_hat = m[i] / (1 - std::pow(h.beta1, t));
    const double v_hat = v[i] / (1 - std::pow(h.beta2, t));
    p[i] -= h.lr * m_hat / (std::sqrt(v_hat) + h.epsilon);
  }
}

}  // namespace

void sgd_update(double* p, const double* g, double* velocity, std::int64_t n, const SgdParams& h) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = g[i] + h.weight_decay * p[i];
    if (h.momentum == 0) {
      p[i] -= h.lr * d;
      continue;
    }
    velocity[i] = h.momentum * velocity[i] + d;
    p[i] -= h.lr * (h.nesterov ? d + h.momentum * velocity[i] : velocity[i]);
  }
}

void rmsprop_update(double* p, const double* g, double* mean_square, double* moment,
                    double* mean_grad, std::int64_t n, const RmspropParams& h) {
  for (std::int64_t i = 0; i < n; ++i) {
    mean_square[i] = h.decay * mean_square[i] + (1 - h.decay) * g[i] * g[i];
    double denom = mean_square[i] + h.epsilon;
    if (h.centered) {
      mean_grad[i] = h.decay * mean_grad[i] + (1 - h.decay) * g[i];
      denom -= mean_grad[i] * mean_grad[i];
    }
    moment[i] = h.momentum * moment[i] + h.lr * g[i] / std::sqrt(denom);
    p[i] -= moment[i];
  }
}

void adam_update(double* p, const double* g, double* m, double* v, std::int64_t n, int t,
                 const AdamParams& params) {
  adam_or_adamw(p, g, m, v, n, t, params, false);
}

void adamw_update(double* p, const double* g, double* m, double* v, std::int64_t n, int t,
                  const AdamParams& params) {
  adam_or_adamw(p, g, m, v, n, t, params, true);
}

}  // namespace towerlab::reference
