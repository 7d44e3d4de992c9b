// What a layer needs to run: the tower's tape, its copy of the variables, and
// whether this is a training pass (batch norm uses batch statistics and updates
// its moving averages) or an inference pass (moving statistics, left as they are).
//
// An inference pass may run on a store made without gradients (an inference
// copy): its variables are then constants on the tape, so no op records a
// backward closure and the tape does not grow. A training pass on such a store
// throws InvalidArgument naming the variable. infer() (autograd/layers.h) is the
// whole inference path in one call.
//
// The precision policy reaches the layers through the tape (compute_dtype()): a
// Context made by a mixed-precision trainer hands out variables that carry their
// replica's 16-bit working copy, which the GEMM-class ops read (docs/precision.md).
#pragma once

#include <string>

#include "../kernels/dropout.h"
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
  // Set by the trainer for ops that draw per sample (parallel/trainer.h's Tower):
  // the index of this pass's first sample in the whole batch, the steps taken
  // before this one, and the run's seed.
  std::int64_t first_sample = 0;
  std::int64_t step = 0;
  std::uint64_t seed = 0;

  // The trainable variable `name` as a Var on this tape: a leaf whose gradient goes
  // into the flat buffer or, from a store without gradients in an inference pass,
  // a constant.
  // Under a mixed-precision tape it carries the replica's working copy (Var::working).
  Var variable(const std::string& name) const {
    if (!training && !variables.has_grads()) return tape.constant(variables.value(name), name);
    return tape.variable(
        variables.value(name), variables.grad(name), name,
        tape.compute_dtype() == DType::Float32 ? Tensor() : variables.working(name));
  }
  // The dtype the GEMM-class ops multiply in (Tape::compute_dtype): the run's
  // precision policy as the layers see it (docs/precision.md).
  DType compute_dtype() const { return tape.compute_dtype(); }
  // Non-trainable state (moving statistics): a view the forward pass may update.
  Tensor state(const std::string& name) const { return variables.value(name); }
  // The key of the dropout op `name` in this pass: a sample gets the same mask on any
  // tower of any layout, and a resumed run the same masks (kernels/dropout.h).
  DropoutKey dropout_key(const std::string& name) const {
    return {seed, dropout_subsequence(static_cast<std::uint64_t>(step), name), first_sample};
  }
};

}  // namespace towerlab
