#include "autograd/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/error.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"

namespace towerlab {

LearningRate LearningRate::with_warmup(std::int64_t steps) const {
  TL_CHECK(steps >= 0, InvalidArgument,
           "learning rate: the warmup's length must be >= 0 steps, not " << steps);
  LearningRate warmed = *this;
  warmed.warmup = steps;
  return warmed;
}

double LearningRate::at(std::int64_t step) const {
  if (step < warmup) {
    LearningRate schedule = *this;
    schedule.warmup = 0;
    return schedule.at(0) * double(step + 1) / double(warmup);
  }
  step -= warmup;
  switch (kind) {
    case Kind::Constant:
      return base;
    case Kind::Step:
      return base * std::pow(gamma, double(step / std::max<std::int64_t>(every, 1)));
    case Kind::Cosine: {
      const double t = double(std::min(step, total)) / double(std::max<std::int64_t>(total, 1));
      return min + (base - min) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
    }
  }
  return base;
}

namespace {

// The schedule is the rate's one source of truth: `params.lr` may only repeat its
// base or stay at the struct's default (read as "not given"). Returns `params` with
// lr set to the base, so that the params an Optimizer reports are the ones it uses.
template <typename Params>
Params with_schedule_lr(Params params, const LearningRate& lr, const char* op) {
  TL_CHECK(params.lr == Params{}.lr || params.lr == lr.base, InvalidArgument,
           "optimizer " << op << ": the parameters' lr (" << params.lr
                        << ") differs from the learning-rate schedule's base (" << lr.base
                        << "), and the schedule gives the rate: leave lr unset, or pass no "
                           "schedule to use lr as a constant rate");
  params.lr = lr.base;
  return params;
}

}  // namespace

Optimizer Optimizer::sgd(SgdParams params, LearningRate lr) {
  Optimizer o(Kind::Sgd, lr);
  o.sgd_ = with_schedule_lr(params, lr, "sgd");
  return o;
}

Optimizer Optimizer::rmsprop(RmspropParams params, LearningRate lr) {
  Optimizer o(Kind::Rmsprop, lr);
  o.rmsprop_ = with_schedule_lr(params, lr, "rmsprop");
  return o;
}

Optimizer Optimizer::adam(AdamParams params, LearningRate lr) {
  Optimizer o(Kind::Adam, lr);
  o.adam_ = with_schedule_lr(params, lr, "adam");
  return o;
}

Optimizer Optimizer::adamw(AdamParams params, LearningRate lr) {
  Optimizer o(Kind::AdamW, lr);
  o.adam_ = with_schedule_lr(params, lr, "adamw");
  return o;
}

Optimizer Optimizer::sgd(SgdParams params) {
  return sgd(params, LearningRate::constant(params.lr));
}
Optimizer Optimizer::rmsprop(RmspropParams params) {
  return rmsprop(params, LearningRate::constant(params.lr));
}
Optimizer Optimizer::adam(AdamParams params) {
  return adam(params, LearningRate::constant(params.lr));
}
Optimizer Optimizer::adamw(AdamParams params) {
  return adamw(params, LearningRate::constant(params.lr));
}

Optimizer Optimizer::by_name(const std::string& name, double lr) {
  return by_name(name, LearningRate::constant(lr));
}

Optimizer Optimizer::by_name(const std::string& name, LearningRate lr) {
  TL_CHECK(lr.base > 0.0 && std::isfinite(lr.base), InvalidArgument,
           "optimizer " << name << ": the learning rate must be positive, got " << lr.base);
  if (name == "adam") return adam({}, lr);
  if (name == "adamw") return adamw({.weight_decay = 0.01}, lr);
  if (name == "sgd") return sgd({}, lr);
  if (name == "momentum") return sgd({.momentum = 0.9}, lr);
  if (name == "rmsprop") return rmsprop({}, lr);
  TL_THROW(InvalidArgument,
           "unknown optimizer '" << name << "' (expected adam, adamw, sgd, momentum or rmsprop)");
}

const char* Optimizer::name() const {
  switch (kind_) {
    case Kind::Sgd:
      return "sgd";
    case Kind::Rmsprop:
      return "rmsprop";
    case Kind::Adam:
      return "adam";
    case Kind::AdamW:
      return "adamw";
  }
  return "?";
}

std::vector<std::string> Optimizer::slot_names() const {
  switch (kind_) {
    case Kind::Sgd:
      return sgd_.momentum > 0.0 ? std::vector<std::string>{"velocity"}
                                 : std::vector<std::string>{};
    case Kind::Rmsprop:
      return rmsprop_.centered ? std::vector<std::string>{"mean_square", "moment", "mean_grad"}
                               : std::vector<std::string>{"mean_square", "moment"};
    case Kind::Adam:
    case Kind::AdamW:
      return {"m", "v"};
  }
  return {};
}

namespace {

// `slot` (a checkpoint's, or one made for another store) in `dtype`. float64
// lives on the CPU, so a conversion is a host loop on the slot's own device.
Tensor in_dtype(const Tensor& slot, DType dtype) {
  return slot.dtype() == dtype ? slot : slot.to(dtype, default_stream(slot.device()));
}

}  // namespace

void Optimizer::ensure_slots(const Tensor& values, const Stream& stream) {
  // Slots take the variables' dtype: the update kernels see one dtype throughout.
  for (const std::string& name : slot_names()) {
    auto it = slots_.find(name);
    if (it != slots_.end() && it->second.shape() == values.shape() &&
        it->second.device() == values.device() && it->second.dtype() == values.dtype()) {
      continue;
    }
    Tensor slot = Tensor::zeros(values.shape(), stream, values.dtype());
    // tf.train.RMSPropOptimizer starts the mean square at 1.
    if (name == "mean_square") fill(slot, 1.0, stream);
    if (it != slots_.end()) copy_tensor(slot, in_dtype(it->second, values.dtype()), stream);
    slots_[name] = slot;
  }
}

Optimizer& Optimizer::decay(WeightDecayOn on) {
  decay_on_ = on;
  return *this;
}

void Optimizer::step(VariableStore& store, const Tensor& grad, const Stream& stream,
                     const Tensor& rounded) {
  step(store.set(), 0, store.flat_values(), grad, stream, rounded);
}

void Optimizer::step(const VariableSet& layout, std::int64_t offset, const Tensor& p,
                     const Tensor& grad, const Stream& stream, const Tensor& rounded) {
  TL_CHECK(grad.shape() == p.shape(), ShapeError,
           "optimizer " << name() << ": gradient " << grad.describe() << " does not match the "
                        << p.describe() << " of trainable values");
  TL_CHECK(!rounded.defined() || (rounded.shape() == p.shape() && is_16bit(rounded.dtype()) &&
                                  p.dtype() == DType::Float32),
           ShapeError,
           "optimizer " << name() << ": the rounded copy " << rounded.describe()
                        << " is not a bfloat16 or float16 copy of the " << p.describe()
                        << " of trainable values");
  TL_CHECK(p.dim() == 1 && offset >= 0 && offset + p.numel() <= layout.trainable_numel(),
           InvalidArgument,
           "optimizer " << name() << ": " << p.describe() << " at element " << offset
                        << " is not a flat slice of the model's " << layout.trainable_numel()
                        << " trainable values");
  ensure_slots(p, stream);
  const double lr = lr_.at(steps_);
  const std::int64_t end = offset + p.numel();
  if (decay_on_ == WeightDecayOn::All || kind_ == Kind::Rmsprop) {  // RMSProp has no decay
    update(p, grad, rounded, 0, p.numel(), true, lr, stream);
  } else {
    // Runs of consecutive variables with the same rule, clipped to [offset, end).
    std::int64_t run_begin = offset;
    bool run_decayed = false;
    for (const VariableSpec& spec : layout.specs()) {
      if (!spec.trainable || spec.offset + spec.numel() <= offset || spec.offset >= end) continue;
      const bool decayed = spec.shape.size() >= 2;
      const std::int64_t begin = std::max(spec.offset, offset);
      if (decayed != run_decayed && begin > run_begin) {
        update(p, grad, rounded, run_begin - offset, begin - offset, run_decayed, lr, stream);
        run_begin = begin;
      }
      run_decayed = decayed;
    }
    if (end > run_begin) {
      update(p, grad, rounded, run_begin - offset, end - offset, run_decayed, lr, stream);
    }
  }
  ++steps_;
}

void Optimizer::update(const Tensor& p_all, const Tensor& grad_all, const Tensor& rounded_all,
                       std::int64_t begin, std::int64_t end, bool decayed, double lr,
                       const Stream& stream) {
  const Shape shape{end - begin};
  auto part = [&](const Tensor& t) { return t.defined() ? t.view(begin, shape) : Tensor(); };
  auto slot = [&](const char* slot_name) {
    auto it = slots_.find(slot_name);
    return it == slots_.end() ? Tensor() : part(it->second);
  };
  const Tensor p = part(p_all), grad = part(grad_all), rounded = part(rounded_all);
  switch (kind_) {
    case Kind::Sgd: {
      SgdParams params = sgd_;
      params.lr = lr;
      if (!decayed) params.weight_decay = 0.0;
      sgd_update(p, grad, slot("velocity"), params, stream);
      break;
    }
    case Kind::Rmsprop: {  // no weight decay in TensorFlow's RMSProp
      RmspropParams params = rmsprop_;
      params.lr = lr;
      rmsprop_update(p, grad, slot("mean_square"), slot("moment"), slot("mean_grad"), params,
                     stream);
      break;
    }
    case Kind::Adam:
    case Kind::AdamW: {
      AdamParams params = adam_;
      params.lr = lr;
      if (!decayed) params.weight_decay = 0.0;
      (kind_ == Kind::Adam ? adam_update : adamw_update)(p, grad, slot("m"), slot("v"), steps_ + 1,
                                                         params, stream, rounded);
      return;  // the rounded copy written with the update
    }
  }
  if (rounded.defined()) cast(rounded, p, stream);
}

void Optimizer::restore(const std::map<std::string, Tensor>& slots, std::int64_t steps,
                        const VariableStore& store, const Stream& stream) {
  restore(slots, steps, store.flat_values(), stream);
}

void Optimizer::restore(const std::map<std::string, Tensor>& slots, std::int64_t steps,
                        const Tensor& values, const Stream& stream) {
  TL_CHECK(steps >= 0, InvalidArgument,
           "optimizer " << name() << ": negative step count " << steps);
  if (slots.empty() && steps == 0) {  // the state before the first step
    slots_.clear();
    steps_ = 0;
    return;
  }
  for (const std::string& slot : slot_names()) {
    auto it = slots.find(slot);
    TL_CHECK(it != slots.end(), InvalidArgument,
             "optimizer " << name() << ": the checkpoint has no '" << slot << "' slot");
    TL_CHECK(it->second.shape() == values.shape(), ShapeError,
             "optimizer " << name() << ": slot '" << slot << "' is " << it->second.describe()
                          << " but the model has " << values.numel() << " trainable values");
  }
  slots_.clear();
  for (const std::string& slot : slot_names()) {
    Tensor copy = Tensor::empty(values.shape(), stream, values.dtype());
    copy_tensor(copy, in_dtype(slots.at(slot), values.dtype()), stream);
    slots_[slot] = copy;
  }
  steps_ = steps;
}

}  // namespace towerlab
