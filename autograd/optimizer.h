// Optimizers over a VariableStore: the state (slots) of SGD with momentum,
// RMSProp, Adam and AdamW as flat buffers laid out like the store's flat values,
// so that one fused kernel (kernels/optimizer.h) updates every trainable variable
// in one pass. A learning-rate schedule gives the rate of each step.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../kernels/optimizer.h"
#include "variables.h"

namespace towerlab {

// lr(step), step counted from 0 for the first update.
//   constant:  base
//   step:      base * gamma^floor(step / every)
//   cosine:    min + (base - min) * (1 + cos(pi * min(step, total) / total)) / 2
// With a linear warmup of W steps (with_warmup(W)), the first W updates ramp up
// and the schedule then starts from its own step 0 (PyTorch's SequentialLR of a
// warmup and the schedule, so a cosine's `total` counts the steps after the warmup):
//   step < W:  lr(0) * (step + 1) / W     (llm.c's ramp: lr(0) / W first, lr(0) last)
//   else:      lr(step - W)
struct LearningRate {
  enum class Kind { Constant, Step, Cosine };
  Kind kind = Kind::Constant;
  double base = 1e-3;
  std::int64_t every = 1;   // Step
  double gamma = 1.0;       // Step
  std::int64_t total = 1;   // Cosine
  double min = 0.0;         // Cosine
  std::int64_t warmup = 0;  // steps of the linear ramp before the schedule

  static LearningRate constant(double lr) { return {Kind::Constant, lr}; }
  static LearningRate step(double lr, std::int64_t every, double gamma) {
    return {Kind::Step, lr, every, gamma};
  }
  static LearningRate cosine(double lr, std::int64_t total, double min = 0.0) {
    return {Kind::Cosine, lr, 1, 1.0, total, min};
  }
  // This schedule after `steps` of linear warmup (InvalidArgument when negative).
  LearningRate with_warmup(std::int64_t steps) const;
  double at(std::int64_t step) const;
};

// Which trainable variables weight decay applies to (SGD's and Adam's L2 term
// through the gradient, AdamW's decoupled decay):
//   All:      every one (PyTorch's default with one parameter group; today's bits).
//   Matrices: those of rank 2 or more, the weights of linear and conv layers and
//             embedding tables, and not biases, batch-norm or layer-norm scales and
//             offsets (the rule of nanoGPT and llm.c; PyTorch users write it as two
//             parameter groups).
// The update stays one element-wise pass; with Matrices it runs once per run of
// consecutive variables with the same rule, over views of the flat buffers.
enum class WeightDecayOn { All, Matrices };

class Optimizer {
 public:
  enum class Kind { Sgd, Rmsprop, Adam, AdamW };

  // The learning rate has one source of truth. With a schedule, the schedule gives
  // every step's rate, and params.lr must be left unset or equal the schedule's base:
  // a different value throws InvalidArgument instead of being ignored. (Unset means
  // the struct's default, so an explicit default with another schedule cannot be told
  // apart and is ignored.) Without a schedule, params.lr is a constant rate.
  // Afterwards the params' lr reads as the schedule's base.
  static Optimizer sgd(SgdParams params, LearningRate lr);
  static Optimizer rmsprop(RmspropParams params, LearningRate lr);
  static Optimizer adam(AdamParams params, LearningRate lr);
  static Optimizer adamw(AdamParams params, LearningRate lr);
  static Optimizer sgd(SgdParams params);
  static Optimizer rmsprop(RmspropParams params);
  static Optimizer adam(AdamParams params);
  static Optimizer adamw(AdamParams params);
  // "adam", "adamw", "sgd", "momentum", "rmsprop" with default parameters: for
  // command lines. The double overload keeps the rate constant.
  static Optimizer by_name(const std::string& name, LearningRate lr);
  static Optimizer by_name(const std::string& name, double lr);

  // Leaves the variables that `on` excludes out of weight decay (see WeightDecayOn).
  // Returns *this, for Optimizer::adamw(params, lr).decay(WeightDecayOn::Matrices).
  Optimizer& decay(WeightDecayOn on);
  WeightDecayOn decays() const { return decay_on_; }

  // One update of every trainable variable of `store` from `grad` (a flat gradient
  // laid out like store.flat_values(), e.g. store.flat_grads() or an all-reduced
  // copy), on the store's device. Slots are created (and initialized as each
  // optimizer's semantics say) on the first call. `rounded`, when given, is a
  // bfloat16 or float16 buffer laid out like the values that receives the updated
  // values rounded once (a mixed-precision working copy, VariableStore::working):
  // cast(rounded, values) after the update, in the update's own pass where the
  // backend fuses it (Adam and AdamW on the CPU, kernels/optimizer.h).
  void step(VariableStore& store, const Tensor& grad, const Stream& stream,
            const Tensor& rounded = Tensor());
  // The same on elements [offset, offset + n) of the flat trainable buffer of the
  // variables `layout` declares (their shapes and offsets are read), held in
  // `values` and `grad` (and `rounded`) of n elements each: a slice, as a sharded
  // master's tower updates (parallel/sharded_master.h). The slots are laid out like
  // `values`. The update is element-wise, so a slice is updated to the bits the
  // whole buffer's update gives it.
  void step(const VariableSet& layout, std::int64_t offset, const Tensor& values,
            const Tensor& grad, const Stream& stream, const Tensor& rounded = Tensor());

  Kind kind() const { return kind_; }
  const char* name() const;
  std::int64_t steps() const { return steps_; }  // updates applied so far
  double current_lr() const { return lr_.at(steps_); }
  // The hyper-parameters (those of kind()'s family), e.g. for a fingerprint that
  // processes training one model compare (parallel/fingerprint.h).
  const LearningRate& learning_rate() const { return lr_; }
  const SgdParams& sgd_params() const { return sgd_; }
  const RmspropParams& rmsprop_params() const { return rmsprop_; }
  const AdamParams& adam_params() const { return adam_; }

  // The slots by name ("velocity", "mean_square", "moment", "mean_grad", "m", "v"),
  // each a flat buffer; empty before the first step unless restored.
  const std::map<std::string, Tensor>& slots() const { return slots_; }
  std::vector<std::string> slot_names() const;
  // Restores the state of a checkpoint: slot values (flat, any device) and the step
  // count. No slots and 0 steps is the fresh state before the first step.
  void restore(const std::map<std::string, Tensor>& slots, std::int64_t steps,
               const VariableStore& store, const Stream& stream);
  // The same for slots laid out like `values` (flat, any length: a slice).
  void restore(const std::map<std::string, Tensor>& slots, std::int64_t steps, const Tensor& values,
               const Stream& stream);

 private:
  Optimizer(Kind kind, LearningRate lr) : kind_(kind), lr_(lr) {}
  void ensure_slots(const Tensor& values, const Stream& stream);
  // One update of `p` (and the slots' elements [begin, end)) with weight decay or without.
  void update(const Tensor& p, const Tensor& grad, const Tensor& rounded, std::int64_t begin,
              std::int64_t end, bool decayed, double lr, const Stream& stream);
  Kind kind_;
  LearningRate lr_;
  WeightDecayOn decay_on_ = WeightDecayOn::All;
  SgdParams sgd_;
  RmspropParams rmsprop_;
  AdamParams adam_;
  std::int64_t steps_ = 0;
  std::map<std::string, Tensor> slots_;
};

}  // namespace towerlab
