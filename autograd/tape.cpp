#include "autograd/tape.h"

#include <limits>
#include <map>
#include <sstream>

#include "engine/error.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"

namespace towerlab {

struct Tape::VariableGrad {
  Tensor grad;
  bool written = false;

  // Zero-fills the gradient if nothing wrote it yet.
  void zero_if_unwritten(const Stream& stream) {
    if (written) return;
    fill(grad, 0.0, stream);
    written = true;
  }
};

struct Var::Node {
  Tensor value;
  Tensor grad;
  bool requires_grad = false;
  Tape* tape = nullptr;
  std::string name;
  bool variable = false;  // made by Tape::variable
  Tensor working;         // a variable's value in the tape's compute dtype, if given
  // A variable's: the index of the first record that reads it (-1: none yet).
  std::ptrdiff_t first_reader = -1;
  // A variable's under VariableGrads::Unwritten (shared by the Vars of its name).
  std::shared_ptr<Tape::VariableGrad> variable_grad;
  // The records that list it as an input, and the 16-bit dtype its creator reads its
  // gradient rounded to (Float32: as it is), for grad_target_rounded.
  int readers = 0;
  DType grad_read_rounded = DType::Float32;
};

const Tensor& Var::value() const {
  TL_CHECK(defined(), InvalidArgument, "use of an undefined Var");
  return node_->value;
}

const Tensor& Var::grad() const {
  TL_CHECK(defined(), InvalidArgument, "use of an undefined Var");
  return node_->grad;
}

bool Var::requires_grad() const {
  return defined() && node_->requires_grad;
}

Tape& Var::tape() const {
  TL_CHECK(defined(), InvalidArgument, "use of an undefined Var");
  return *node_->tape;
}

const std::string& Var::name() const {
  TL_CHECK(defined(), InvalidArgument, "use of an undefined Var");
  return node_->name;
}

const Tensor& Var::working() const {
  TL_CHECK(defined(), InvalidArgument, "use of an undefined Var");
  return node_->working;
}

std::string Var::describe() const {
  if (!defined()) return "undefined Var";
  return node_->name + " " + dtype_name(node_->value.dtype()) + node_->value.shape_str();
}

Tape::Tape(const Stream& stream, std::string label) : stream_(&stream), label_(std::move(label)) {}

Var Tape::constant(Tensor value, std::string name) {
  TL_CHECK(value.defined(), InvalidArgument, label_ << ": constant '" << name << "' is undefined");
  TL_CHECK(value.device() == device(), InvalidArgument,
           label_ << ": constant '" << name << "' is " << value.describe() << " but the tape is on "
                  << device().str());
  auto node = std::make_shared<Var::Node>();
  node->value = std::move(value);
  node->tape = this;
  node->name = std::move(name);
  return Var(std::move(node));
}

void Tape::set_compute_dtype(DType dtype) {
  TL_CHECK(dtype == DType::Float32 || is_16bit(dtype), InvalidArgument,
           label_ << ": compute dtype " << dtype_name(dtype)
                  << " (float32, bfloat16 or float16: the dtype GEMMs multiply in)");
  compute_dtype_ = dtype;
}

Var Tape::variable(Tensor value, Tensor grad, std::string name, Tensor working) {
  TL_CHECK(value.defined() && grad.defined(), InvalidArgument,
           label_ << ": variable '" << name << "' needs a value and a gradient tensor");
  TL_CHECK(value.device() == device() && grad.device() == device(), InvalidArgument,
           label_ << ": variable '" << name << "' is " << value.describe() << " but the tape is on "
                  << device().str());
  TL_CHECK(value.shape() == grad.shape(), ShapeError,
           label_ << ": variable '" << name << "' is " << value.describe()
                  << " but its gradient is " << grad.describe());
  auto node = std::make_shared<Var::Node>();
  node->value = std::move(value);
  node->grad = std::move(grad);
  node->requires_grad = true;
  node->tape = this;
  node->name = std::move(name);
  node->variable = true;
  if (working.defined()) {
    TL_CHECK(working.dtype() == compute_dtype_ && working.shape() == node->value.shape() &&
                 working.device() == device(),
             InvalidArgument,
             label_ << ": variable '" << node->name << "' has a working copy " << working.describe()
                    << " but the tape computes in " << dtype_name(compute_dtype_) << " on "
                    << device().str());
    node->working = std::move(working);
  }
  if (variable_grads_ == VariableGrads::Unwritten) {
    auto& shared = variable_grads_by_name_[node->name];
    if (shared == nullptr) {
      shared = std::make_shared<VariableGrad>(VariableGrad{node->grad});
    } else {
      TL_CHECK(shared->grad.raw_data() == node->grad.raw_data() &&
                   shared->grad.shape() == node->grad.shape(),
               InvalidArgument,
               label_ << ": variable '" << node->name
                      << "' made again with another gradient tensor; with VariableGrads::Unwritten "
                         "every Var of one name writes one gradient");
    }
    node->variable_grad = shared;
  }
  variables_.push_back(node);
  variable_names_.insert(node->name);
  return Var(std::move(node));
}

void Tape::check_owns(const char* op, const std::vector<Var>& vars) const {
  for (const Var& v : vars) {
    TL_CHECK(v.defined(), InvalidArgument, op << ": an input is an undefined Var");
    TL_CHECK(v.node_->tape == this, InvalidArgument,
             op << ": " << v.describe() << " belongs to " << v.node_->tape->label() << ", not to "
                << label_ << " (Vars of two tapes cannot be mixed)");
  }
}

Var Tape::record(Tensor value, std::string name, const std::vector<Var>& inputs,
                 std::function<void(const Var&)> backward) {
  auto node = std::make_shared<Var::Node>();
  node->value = std::move(value);
  node->tape = this;
  node->name = std::move(name);
  bool needs = false;
  for (const Var& v : inputs) needs = needs || v.requires_grad();
  node->requires_grad = needs && grad_enabled_;
  Var out(std::move(node));
  if (out.requires_grad()) {
    TL_CHECK(!backward_done_, InvalidArgument,
             label_ << ": recording '" << out.name()
                    << "' after backward(); call reset() before the next forward pass");
    for (const Var& v : inputs) {
      if (!v.defined()) continue;
      ++v.node_->readers;
      if (v.node_->variable && v.node_->first_reader < 0) {
        v.node_->first_reader = std::ptrdiff_t(records_.size());
      }
    }
    records_.push_back({out, std::move(backward), scope_});
  }
  return out;
}

const Tensor& Tape::grad_for(const Var& v) {
  TL_CHECK(v.requires_grad(), InvalidArgument,
           label_ << ": " << v.describe() << " does not require a gradient");
  if (v.node_->variable_grad != nullptr) v.node_->variable_grad->zero_if_unwritten(*stream_);
  if (!v.node_->grad.defined()) {
    v.node_->grad =
        Tensor::zeros(v.node_->value.shape(), *stream_, grad_dtype(v.node_->value.dtype()));
  }
  return v.node_->grad;
}

Tape::GradTarget Tape::grad_target(const Var& v) {
  TL_CHECK(v.requires_grad(), InvalidArgument,
           label_ << ": " << v.describe() << " does not require a gradient");
  Tensor& grad = v.node_->grad;
  // A first write: an unwritten variable gradient (VariableGrads::Unwritten), or an
  // intermediate's, handed out unwritten (below).
  VariableGrad* variable = v.node_->variable_grad.get();
  const bool unwritten_variable = variable != nullptr && !variable->written;
  if (first_write_ == FirstWrite::Zeroed || (grad.defined() && !unwritten_variable)) {
    return {grad_for(v), false};
  }
  if (unwritten_variable) {
    variable->written = true;
  } else {
    grad = Tensor::empty(v.node_->value.shape(), *stream_, grad_dtype(v.node_->value.dtype()));
  }
  if (first_write_ == FirstWrite::Poisoned) {
    fill(grad, std::numeric_limits<double>::quiet_NaN(), *stream_);
  }
  return {grad, true};
}

void Tape::set_grad_read_rounded(const Var& output, DType dtype) {
  TL_CHECK(output.requires_grad() && output.node_->tape == this, InvalidArgument,
           label_ << ": set_grad_read_rounded on " << output.describe()
                  << ", which is not an output of this tape that requires a gradient");
  TL_CHECK(is_16bit(dtype), InvalidArgument,
           label_ << ": set_grad_read_rounded to " << dtype_name(dtype)
                  << " (bfloat16 or float16: the dtype the backward multiplies in)");
  output.node_->grad_read_rounded = dtype;
}

Tape::GradTarget Tape::grad_target_rounded(const Var& v) {
  TL_CHECK(v.requires_grad(), InvalidArgument,
           label_ << ": " << v.describe() << " does not require a gradient");
  Var::Node& node = *v.node_;
  const bool rounded = is_16bit(node.grad_read_rounded) && node.readers == 1 && !node.variable &&
                       !node.grad.defined() && first_write_ != FirstWrite::Zeroed;
  if (!rounded) return grad_target(v);
  if (first_write_ == FirstWrite::Poisoned) {  // NaN, rounded (fill takes no 16-bit dtype)
    Tensor nan = Tensor::empty(node.value.shape(), *stream_, DType::Float32);
    fill(nan, std::numeric_limits<double>::quiet_NaN(), *stream_);
    node.grad = cast(nan, node.grad_read_rounded, *stream_);
  } else {
    node.grad = Tensor::empty(node.value.shape(), *stream_, node.grad_read_rounded);
  }
  return {node.grad, true};
}

void Tape::add_to_grad(const Var& v, const Tensor& g, double alpha) {
  const GradTarget target = grad_target(v);
  if (target.assign) {
    scale(target.grad, g, alpha, *stream_);
  } else {
    axpy(target.grad, alpha, g, *stream_);
  }
}

void Tape::pass_grad(const Var& v, const Tensor& g) {
  TL_CHECK(v.requires_grad(), InvalidArgument,
           label_ << ": " << v.describe() << " does not require a gradient");
  Var::Node& node = *v.node_;
  const bool handed = !node.grad.defined() && !node.variable &&
                      first_write_ != FirstWrite::Zeroed && g.shape() == node.value.shape() &&
                      g.dtype() == grad_dtype(node.value.dtype()) && g.device() == device();
  if (!handed) {
    add_to_grad(v, g);
    return;
  }
  node.grad = g;
}

void Tape::check_backward(const Var& output) const {
  check_owns("backward", {output});
  TL_CHECK(!backward_done_, InvalidArgument,
           label_ << ": backward() called twice; call reset() and run the forward pass again");
  TL_CHECK(
      output.requires_grad(), InvalidArgument,
      label_ << ": " << output.describe()
             << " does not depend on any trainable variable (or was computed without gradients)");
}

void Tape::backward(const Var& loss, double seed) {
  TL_CHECK(!loss.defined() || loss.value().numel() == 1, ShapeError,
           label_ << ": backward() needs a loss with one element, got " << loss.describe()
                  << " (pass the upstream gradient for an output of another shape)");
  check_backward(loss);
  fill(grad_target(loss).grad, seed, *stream_);
  replay();
}

void Tape::backward(const Var& output, const Tensor& grad_output) {
  check_backward(output);
  TL_CHECK(grad_output.defined(), InvalidArgument,
           label_ << ": backward() from " << output.describe()
                  << ": the upstream gradient is undefined");
  const DType dtype = grad_dtype(output.value().dtype());
  TL_CHECK(grad_output.shape() == output.shape() && grad_output.dtype() == dtype, ShapeError,
           label_ << ": backward() from " << output.describe() << ": the upstream gradient is "
                  << grad_output.describe() << "; it must be " << dtype_name(dtype)
                  << output.value().shape_str() << " (the output's shape, its gradient's dtype)");
  TL_CHECK(grad_output.device() == device(), InvalidArgument,
           label_ << ": backward() from " << output.describe() << ": the upstream gradient is "
                  << grad_output.describe() << " but the tape is on " << device().str());
  copy(grad_target(output).grad, grad_output, *stream_);
  replay();
}

std::vector<std::vector<std::string>> Tape::ready_after() const {
  // A name may have several Vars (a weight used by a layer and by a regularizer):
  // its gradient is complete after the earliest record that reads any of them.
  std::map<std::string, std::ptrdiff_t> earliest;
  for (const auto& v : variables_) {
    auto [it, inserted] = earliest.emplace(v->name, v->first_reader);
    if (!inserted && v->first_reader >= 0 && (it->second < 0 || v->first_reader < it->second)) {
      it->second = v->first_reader;
    }
  }
  std::vector<std::vector<std::string>> ready(records_.size() + 1);
  // In declaration order within one point, so that every tower reports alike.
  for (const auto& v : variables_) {
    const auto it = earliest.find(v->name);
    if (it == earliest.end()) continue;
    ready[std::size_t(it->second + 1)].push_back(v->name);
    earliest.erase(it);
  }
  return ready;
}

void Tape::replay() {
  backward_done_ = true;
  std::vector<std::vector<std::string>> ready;
  if (listener_ != nullptr) {
    ready = ready_after();
    for (const std::string& name : ready[0]) {
      finish_variable_grad(name);
      listener_->gradient_ready(name);
    }
  }
  for (std::size_t i = records_.size(); i-- > 0;) {
    Record& r = records_[i];
    if (r.output.node_->grad.defined()) {
      if (profiler_ != nullptr) profiler_->backward_record(r.scope, r.output.name());
      r.backward(r.output);
    }
    if (listener_ != nullptr) {
      for (const std::string& name : ready[i + 1]) {
        finish_variable_grad(name);
        listener_->gradient_ready(name);
      }
    }
  }
  for (const auto& [name, variable] : variable_grads_by_name_) {
    variable->zero_if_unwritten(*stream_);
  }
  if (profiler_ != nullptr) profiler_->backward_done();
  records_.clear();
}

void Tape::finish_variable_grad(const std::string& name) {
  const auto it = variable_grads_by_name_.find(name);
  if (it != variable_grads_by_name_.end()) it->second->zero_if_unwritten(*stream_);
}

void Tape::reset() {
  records_.clear();
  variables_.clear();
  variable_names_.clear();
  variable_grads_by_name_.clear();
  backward_done_ = false;
}

}  // namespace towerlab
