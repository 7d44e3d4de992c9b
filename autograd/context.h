// What a layer needs to run: the tower's tape, its copy of the variables, and
// whether this is a training pass (batch norm uses batch statistics and updates
// its moving averages) or an inference pass (moving statistics, left as they are).
//
// An inference pass may run on a store made without gradients (an inference
// copy): its variables are then constants on the tape, so no op records a
// backward closure and the tape does not grow. A training pass on such a store
// throws InvalidArgument naming the variable. infer() (autograd/layers.h) is the
// whole inference path in one call.
#pragma once

#include <string>

#include "tape.h"
#include "variables.h"

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

  // The trainable variable `name` as a Var on this tape: a leaf whose gradient goes
  // into the flat buffer or, from a store without gradients in an inference pass,
  // a constant.
  Var variable(const std::string& name) const {
    if (!training && !variables.has_grads()) return tape.constant(variables.value(name), name);
    return tape.variable(variables.value(name), variables.grad(name), name);
  }
  // Non-trainable state (moving statistics): a view the forward pass may update.
  Tensor state(const std::string& name) const { return variables.value(name); }
};

}  // namespace towerlab
