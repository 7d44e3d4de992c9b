// An MLP with dropout for Fashion-MNIST, and the twin of tools/mlp_torch.py's Mlp:
// flatten, then per hidden layer a linear layer with ReLU and dropout, then a linear
// layer to the logits. Like models/fashion_net.h, a model built from the library's
// layers; towerlab.h does not include it.
//
//   VariableSet vars;
//   Sequential net = models::mlp(vars);  // 784-512-256-10, dropout 0.2
//   Sequential small = models::mlp(vars2, {.hidden = {32}, .dropout = 0.5});
#pragma once

#include <vector>

#include "../autograd/layers.h"

namespace towerlab::models {

struct MlpOptions {
  std::int64_t inputs = 784;  // the input's elements after flattening
  std::vector<std::int64_t> hidden = {512, 256};
  std::int64_t classes = 10;
  double dropout = 0.2;  // after each hidden layer's ReLU, in training; 0: none
};

// Input [N, ...] of `inputs` elements a sample ([N,1,28,28] or [N,784]), output
// logits [N,classes]. Declares fc1/weight [hidden[0],inputs], fc1/bias, ... and
// fc<L+1>/weight [classes,hidden[L-1]] for L hidden layers (He normal weights,
// zero biases); the dropouts are named fc1/dropout ... fc<L>/dropout (their masks'
// keys; not variables). Each ReLU is fused into its linear layer.
Sequential mlp(VariableSet& vars, const MlpOptions& options = {});

}  // namespace towerlab::models
