// What a layer needs to run: the tower's tape, its copy of the variables, and
// whether this is a training pass (batch norm uses batch statistics and updates
// its moving averages) or an inference pass.
#pragma once

#include <string>

#include "autograd/tape.h"
#include "autograd/variables.h"

namespace towerlab {

class BatchNormSync;

struct Context {
  Tape& tape;
  VariableStore& variables;
  bool training = true;
  // Set by the trainer for synchronized batch norm: the collective across towers
  // and this tower's index in it. Null: each tower normalizes its own slice.
  BatchNormSync* batchnorm_sync = nullptr;
  int tower = 0;

  // The trainable variable `name` as a Var on this tape (gradient into the flat buffer).
  Var variable(const std::string& name) const {
    return tape.variable(variables.value(name), variables.grad(name), name);
  }
  // Non-trainable state (moving statistics): a view the forward pass may update.
  Tensor state(const std::string& name) const { return variables.value(name); }
};

}  // namespace towerlab
