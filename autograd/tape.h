// The tape: reverse-mode automatic differentiation for one tower.
//
// A Tape is bound to one stream (and so one device). Every differentiable op
// (autograd/ops.h) computes its output on the tape's stream and, when gradients
// are enabled, records a backward closure. backward(loss) replays the records in
// reverse; each closure ACCUMULATES into the gradients of its inputs (a first
// write may assign, see "First writes"), so a value used twice gets the sum of both
// contributions. Nothing is global: each tower's tape has its own records and buffers.
//
// A Var is a handle to a value on a tape together with its gradient. Trainable
// variables (autograd/variables.h) bring their own gradient tensor, a view into
// the tower's flat gradient buffer; intermediate values get a gradient tensor
// allocated when the backward pass first needs one.
//
// First writes. Most intermediate gradients get exactly one contribution, which
// writes every element (ReLU, a matrix product, a copy). Zero-filling the buffer
// only for that op to add into it costs a pass over memory as large as the
// activation, so the tape offers two ways in:
//   grad_for(v)     a buffer to accumulate into (zero-filled on first use): for a
//                   backward that adds to part of it (a scatter, a col2im);
//   grad_target(v)  for a backward that writes every element: the first call hands
//                   out an unwritten buffer with assign == true, and the op must
//                   overwrite it (g = ..., not g += ...) without reading it; later
//                   calls, and a variable's gradient, say assign == false.
// A third way in, for 16-bit tapes: grad_target_rounded(v) is grad_target(v), except
// that where v's creator reads v's gradient only rounded to a 16-bit dtype (a
// GEMM-class op's output, set_grad_read_rounded), this op is v's only reader and the
// write is a first, it hands the gradient out in that dtype: the op rounds each
// element once as it stores it, the bits the creator's own rounding would give, and
// the float32 tensor and the pass that rounds it are never made. (A convolution's
// output is read only by the batch norm after it, whose CPU kernel writes its 16-bit
// grad_x so: kernels/batchnorm.h.)
// set_first_write(FirstWrite::Poisoned) fills those unwritten buffers with NaN, so
// that an op which reads one (accumulates where it should assign) shows up as a NaN
// gradient; FirstWrite::Zeroed hands out zeroed buffers with assign == false, which
// makes every op accumulate (the reference the first writes must reproduce).
//
// Variables' first writes. A variable's gradient is its owner's tensor, and by
// default the owner zero-fills it before the backward (VariableStore::zero_grad) and
// every write adds into it. set_variable_grads(VariableGrads::Unwritten) says the
// owner did not: the backward's first write to each variable's gradient (through any
// of the Vars made with its name) is handed out as grad_target's first writes are
// (assign == true, or NaN-filled under Poisoned, or zero-filled under Zeroed), and
// grad_for zero-fills it first; backward() zero-fills every variable gradient that
// nothing wrote before the listener hears of it. The Trainer's towers run so: one
// pass over the flat gradient less per tower and step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "../kernels/matmul.h"

namespace towerlab {

class Tape;

// Watches a tape for a trace of its layers (parallel/trace.h implements it). Layers
// mark their forward passes as scopes (TapeScope); every record keeps the scope it
// was made in, and backward() reports each record's scope before running it, so a
// profiler can time each layer's forward and the backward of its records.
class TapeProfiler {
 public:
  virtual ~TapeProfiler() = default;
  // A layer's forward starts (returns the scope's id, >= 0) and ends.
  virtual int begin_scope(const std::string& name) = 0;
  virtual void end_scope(int scope) noexcept = 0;
  // backward() is about to run a record made in `scope` (-1: outside every scope)
  // by op `op`; after the last one it calls backward_done().
  virtual void backward_record(int scope, const std::string& op) = 0;
  virtual void backward_done() = 0;
};

// Watches backward() for the moment each variable's gradient is complete, so that
// its reduction can start while the backward of earlier layers goes on (the
// trainer's gradient buckets, parallel/buckets.h). A variable's gradient is complete
// once the backward has run the earliest record that reads it: records run in
// reverse, and only a record that reads a variable writes its gradient.
class GradientListener {
 public:
  virtual ~GradientListener() = default;
  // Every write to the gradient of variable `name` has been issued on the tape's
  // stream (on a GPU it may still be running: record an event to wait for it).
  // Called on the thread that runs backward(), once per name per backward, for each
  // variable made on the tape since the last reset(); those that no record reads
  // come first, before any record runs.
  virtual void gradient_ready(const std::string& name) = 0;
};

class Var {
 public:
  Var() = default;

  bool defined() const { return node_ != nullptr; }
  const Tensor& value() const;
  // The gradient accumulated so far (undefined if nothing has flowed back yet).
  const Tensor& grad() const;
  bool requires_grad() const;
  Tape& tape() const;
  // "conv1/weight" for a variable, the producing op ("relu", "conv2d") otherwise.
  const std::string& name() const;
  const Shape& shape() const { return value().shape(); }
  // "conv1/weight float32[32,1,3,3]": for messages.
  std::string describe() const;
  // A variable's value rounded to the tape's compute dtype (its replica's working
  // copy, autograd/variables.h); undefined for every other Var and in float32.
  const Tensor& working() const;

 private:
  friend class Tape;
  struct Node;
  explicit Var(std::shared_ptr<Node> node) : node_(std::move(node)) {}
  std::shared_ptr<Node> node_;
};

class Tape {
 public:
  // `label` names the tape in messages ("tower 2 (cuda:0)").
  explicit Tape(const Stream& stream, std::string label = "tape");
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  const Stream& stream() const { return *stream_; }
  Device device() const { return stream_->device(); }
  const std::string& label() const { return label_; }

  // A value that needs no gradient (inputs, labels).
  Var constant(Tensor value, std::string name = "constant");
  // A trainable leaf whose gradient accumulates into `grad` (same shape, on this device).
  // `working`, when given, is its value rounded to compute_dtype() (Var::working).
  Var variable(Tensor value, Tensor grad, std::string name, Tensor working = Tensor());

  // The working dtype of a mixed-precision policy (docs/precision.md): float32 (the
  // default), or bfloat16 / float16. On a 16-bit tape the GEMM-class ops
  // (ag::matmul, ag::linear, ag::batched_matmul, ag::conv2d) multiply 16-bit
  // operands (a variable's working copy, rounded once per step) with float32 sums
  // and write their output in this dtype, rounded once; the element-wise ops keep it
  // (16-bit kernels, or autograd/mixed_precision.h's float32 fallback); softmax,
  // losses and reductions return float32. Every gradient is float32 (grad_dtype).
  DType compute_dtype() const { return compute_dtype_; }
  void set_compute_dtype(DType dtype);

  // How the float32 GEMMs recorded here may multiply (kernels/matmul.h's
  // Float32Math): Ieee by default; Tf32 under the tf32 precision lets ag::matmul,
  // ag::linear, ag::batched_matmul and ag::conv2d (one group), forward and
  // backward, run on CUDA's TF32 tensor cores (a CPU tape computes float32 either
  // way).
  Float32Math float32_math() const { return float32_math_; }
  void set_float32_math(Float32Math math) { float32_math_ = math; }

  // Output of a differentiable op: requires a gradient when any input does and
  // gradients are enabled. `backward` is recorded only then; it receives the
  // output Var and must add into its inputs' grad_for() (or grad_target()) tensors.
  Var record(Tensor value, std::string name, const std::vector<Var>& inputs,
             std::function<void(const Var& output)> backward);

  // The dtype of the gradient of a value of `value` dtype: float32 for a 16-bit
  // value (gradients between ops stay float32 under every precision policy, so
  // they accumulate without 16-bit roundings; docs/precision.md), else the value's.
  // The one exception, grad_target_rounded's, holds only what would be rounded anyway.
  static DType grad_dtype(DType value) { return is_16bit(value) ? DType::Float32 : value; }

  // The gradient tensor of `v` to accumulate into, allocated as zeros on first use
  // (in grad_dtype of its value). Only for Vars with requires_grad().
  const Tensor& grad_for(const Var& v);

  // The gradient of `v` for a backward that writes every element of it (see "First
  // writes" above). Only for Vars with requires_grad().
  struct GradTarget {
    Tensor grad;
    bool assign;  // overwrite every element; otherwise accumulate
  };
  GradTarget grad_target(const Var& v);

  // Says that the backward of `output`'s op reads output's gradient only rounded
  // to `dtype` (16-bit: a GEMM-class op multiplying it in its operands' dtype), so
  // grad_target_rounded may hand that gradient out in `dtype` (see "First writes").
  // Called by the op right after record(), on an output that requires a gradient.
  void set_grad_read_rounded(const Var& output, DType dtype);

  // grad_target(v) for a backward that can write a 16-bit gradient, rounding each
  // element once as it stores it: in the dtype of set_grad_read_rounded where v's
  // creator said so, this op is v's only reader, and the write is a first (not
  // under FirstWrite::Zeroed, not a variable's); otherwise grad_target(v) itself.
  GradTarget grad_target_rounded(const Var& v);

  // Adds alpha * g to v's gradient (g has v's shape), through grad_target(): the
  // first contribution is a scaled copy instead of a zero-fill and an add.
  void add_to_grad(const Var& v, const Tensor& g, double alpha = 1.0);

  // Adds g (v's shape, v's gradient dtype) to v's gradient as add_to_grad(v, g)
  // does, without the copy where it can: when v's gradient is unwritten (a first
  // write, FirstWrite::Assign or Poisoned) and v is not a variable, v's gradient
  // becomes g itself, sharing its memory. For a backward whose input gradient is the
  // output's unchanged (a reshape, the x of a bias add or an add): g must be the
  // output's gradient (or a reshape of it) or a tensor the closure made, handed to
  // one input only and not written after the call. Reading it afterwards in the same
  // closure is fine; the output's gradient may later show what is added to v's.
  void pass_grad(const Var& v, const Tensor& g);

  // How grad_target() hands out a gradient that nothing has written yet.
  enum class FirstWrite {
    Assign,    // unwritten, assign == true (the default)
    Zeroed,    // zero-filled, assign == false: every op accumulates
    Poisoned,  // filled with NaN, assign == true: a backward that reads it gives NaN
  };
  void set_first_write(FirstWrite mode) { first_write_ = mode; }
  FirstWrite first_write() const { return first_write_; }

  // What a variable's gradient holds when the backward starts (see "Variables'
  // first writes" above).
  enum class VariableGrads {
    Zeroed,     // zero-filled by its owner: every write adds (the default)
    Unwritten,  // anything: the first write assigns, and an unwritten one is zero-filled
  };
  void set_variable_grads(VariableGrads mode) { variable_grads_ = mode; }
  VariableGrads variable_grads() const { return variable_grads_; }

  // Runs the recorded closures in reverse from `loss` (one element), seeding
  // dL/dloss = seed (a tower passes its share of the batch). Throws if backward
  // already ran since the last reset(), or if `loss` is not on this tape.
  void backward(const Var& loss, double seed = 1.0);
  // The same from an output of any shape, seeding dL/doutput = grad_output (the
  // upstream gradient: `output`'s shape and grad_dtype, on this tape's device),
  // as PyTorch's output.backward(gradient) and tf.gradients' grad_ys do.
  void backward(const Var& output, const Tensor& grad_output);

  // Drops every record (and the intermediate values they keep alive) so that the
  // next forward pass can start. Variable gradients are left as they are.
  void reset();

  bool grad_enabled() const { return grad_enabled_; }
  void set_grad_enabled(bool enabled) { grad_enabled_ = enabled; }
  std::size_t num_records() const { return records_.size(); }

  // Reports each variable's complete gradient during backward() (off when null).
  void set_gradient_listener(GradientListener* listener) { listener_ = listener; }
  // Whether variable(name, ...) was called since the last reset(): the variables a
  // GradientListener will hear of.
  bool has_variable(const std::string& name) const { return variable_names_.count(name) > 0; }

  // Profiling (off when null, and then free): see TapeProfiler and TapeScope.
  void set_profiler(TapeProfiler* profiler) { profiler_ = profiler; }
  TapeProfiler* profiler() const { return profiler_; }
  int scope() const { return scope_; }
  void set_scope(int scope) { scope_ = scope; }

  // Throws InvalidArgument unless every Var is defined and on this tape.
  void check_owns(const char* op, const std::vector<Var>& vars) const;

 private:
  void check_backward(const Var& output) const;
  void replay();  // runs the records in reverse, once dL/doutput is seeded
  // For the listener: the names whose gradient is complete after record i (index
  // i + 1; index 0: before the first record runs).
  std::vector<std::vector<std::string>> ready_after() const;

  struct Record {
    Var output;
    std::function<void(const Var&)> backward;
    int scope;
  };
  // VariableGrads::Unwritten: the gradient of each variable name made since the
  // last reset(), and whether this backward has written it yet; every Var of the
  // name shares it (Var::Node holds it too).
  struct VariableGrad;
  friend struct Var::Node;
  // Zero-fills the gradient of `name` if nothing wrote it (Unwritten only).
  void finish_variable_grad(const std::string& name);
  std::unordered_map<std::string, std::shared_ptr<VariableGrad>> variable_grads_by_name_;
  const Stream* stream_;
  std::string label_;
  std::vector<Record> records_;
  // The variables made since the last reset(), for the GradientListener.
  std::vector<std::shared_ptr<Var::Node>> variables_;
  std::unordered_set<std::string> variable_names_;
  GradientListener* listener_ = nullptr;
  bool grad_enabled_ = true;
  bool backward_done_ = false;
  FirstWrite first_write_ = FirstWrite::Assign;
  VariableGrads variable_grads_ = VariableGrads::Zeroed;
  DType compute_dtype_ = DType::Float32;
  Float32Math float32_math_ = Float32Math::Ieee;
  TapeProfiler* profiler_ = nullptr;
  int scope_ = -1;
};

// Marks a layer's forward pass as a scope of the tape's profiler, for the lifetime
// of the object; does nothing (and never calls `name`) when the tape has none.
class TapeScope {
 public:
  template <class NameFn>
  TapeScope(Tape& tape, const NameFn& name) : tape_(tape), previous_(tape.scope()) {
    if (tape.profiler() == nullptr) return;
    scope_ = tape.profiler()->begin_scope(name());
    tape.set_scope(scope_);
  }
  ~TapeScope() {
    if (scope_ < 0) return;
    tape_.profiler()->end_scope(scope_);
    tape_.set_scope(previous_);
  }
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  Tape& tape_;
  int previous_;
  int scope_ = -1;
};

// Disables recording on one tape for a scope (inference, evaluation).
class NoGradGuard {
 public:
  explicit NoGradGuard(Tape& tape) : tape_(tape), previous_(tape.grad_enabled()) {
    tape.set_grad_enabled(false);
  }
  ~NoGradGuard() { tape_.set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  Tape& tape_;
  bool previous_;
};

}  // namespace towerlab
