#include "autograd/variables.h"

#include <cmath>
#include <sstream>
#include <utility>

#include "engine/error.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"

namespace towerlab {

std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

const VariableSpec& VariableSet::get(const std::string& name, const Shape& shape, Initializer init,
                                     bool trainable) {
  TL_CHECK(!name.empty(), InvalidArgument, "a variable needs a name");
  if (const VariableSpec* existing = find(name)) {
    TL_CHECK(existing->shape == shape, ShapeError,
             "variable " << name << " exists with shape " << to_string(existing->shape)
                         << " but is asked for with shape " << to_string(shape));
    TL_CHECK(existing->trainable == trainable, InvalidArgument,
             "variable " << name << " exists as " << (existing->trainable ? "" : "non-")
                         << "trainable but is asked for as " << (trainable ? "" : "non-")
                         << "trainable");
    return *existing;
  }
  VariableSpec spec{name, shape, init, trainable, 0};
  std::int64_t& total = trainable ? trainable_numel_ : state_numel_;
  spec.offset = total;
  total += spec.numel();
  index_[name] = specs_.size();
  specs_.push_back(std::move(spec));
  return specs_.back();
}

const VariableSpec* VariableSet::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &specs_[it->second];
}

const VariableSpec& VariableSet::at(const std::string& name) const {
  if (const VariableSpec* spec = find(name)) return *spec;
  std::ostringstream known;
  for (std::size_t i = 0; i < specs_.size() && i < 20; ++i)
    known << (i ? ", " : "") << specs_[i].name;
  if (specs_.size() > 20) known << ", ...";
  TL_THROW(InvalidArgument, "no variable named '" << name << "' (declared: "
                                                  << (specs_.empty() ? "none" : known.str())
                                                  << ")");
}

VariableStore::VariableStore(const VariableSet& set, const Stream& stream, bool with_grads,
                             DType dtype)
    : set_(&set), device_(stream.device()) {
  values_ = Tensor::empty({set.trainable_numel()}, stream, dtype);
  if (with_grads) grads_ = Tensor::zeros({set.trainable_numel()}, stream, dtype);
  state_ = Tensor::empty({set.state_numel()}, stream, dtype);
}

namespace {

std::pair<double, double> fans(const Shape& shape) {
  if (shape.empty()) return {1.0, 1.0};
  if (shape.size() == 1) return {double(shape[0]), double(shape[0])};
  double receptive = 1.0;
  for (std::size_t i = 2; i < shape.size(); ++i) receptive *= double(shape[i]);
  return {double(shape[1]) * receptive, double(shape[0]) * receptive};
}

void draw(const Tensor& x, const VariableSpec& spec, std::uint64_t seed, const Stream& stream) {
  using Kind = Initializer::Kind;
  const auto [fan_in, fan_out] = fans(spec.shape);
  const std::uint64_t sub = name_hash(spec.name);
  const Initializer& init = spec.init;
  switch (init.kind) {
    case Kind::Zeros:
      fill(x, 0.0, stream);
      break;
    case Kind::Ones:
      fill(x, 1.0, stream);
      break;
    case Kind::Constant:
      fill(x, init.a, stream);
      break;
    case Kind::Uniform:
      random_uniform(x, seed, sub, init.a, init.b, stream);
      break;
    case Kind::Normal:
      random_normal(x, seed, sub, init.a, init.b, stream);
      break;
    case Kind::HeNormal:
      random_normal(x, seed, sub, 0.0f, float(std::sqrt(2.0 / fan_in)), stream);
      break;
    case Kind::HeUniform: {
      const float limit = float(std::sqrt(6.0 / fan_in));
      random_uniform(x, seed, sub, -limit, limit, stream);
      break;
    }
    case Kind::GlorotNormal:
      random_normal(x, seed, sub, 0.0f, float(std::sqrt(2.0 / (fan_in + fan_out))), stream);
      break;
    case Kind::GlorotUniform: {
      const float limit = float(std::sqrt(6.0 / (fan_in + fan_out)));
      random_uniform(x, seed, sub, -limit, limit, stream);
      break;
    }
  }
}

}  // namespace

void VariableStore::initialize(std::uint64_t seed, const Stream& stream) {
  for (const VariableSpec& spec : set_->specs()) draw(value(spec.name), spec, seed, stream);
}

void VariableStore::copy_from(const VariableStore& other, const Stream& stream) {
  TL_CHECK(&other.set() == set_, InvalidArgument,
           "VariableStore::copy_from: the stores hold different variable sets");
  copy_tensor(values_, other.values_, stream);
  copy_tensor(state_, other.state_, stream);
}

void VariableStore::zero_grad(const Stream& stream) {
  if (grads_.defined()) fill(grads_, 0.0, stream);
}

Tensor VariableStore::value(const std::string& name) const {
  const VariableSpec& spec = set_->at(name);
  return (spec.trainable ? values_ : state_).view(spec.offset, spec.shape);
}

Tensor VariableStore::grad(const std::string& name) const {
  const VariableSpec& spec = set_->at(name);
  TL_CHECK(spec.trainable, InvalidArgument,
           "variable " << name << " is not trainable: no gradient");
  TL_CHECK(grads_.defined(), InvalidArgument,
           "variable " << name
                       << ": this store was made without gradients (an inference copy); it runs "
                          "a model only in inference mode (infer(), or a Context with training = "
                          "false). To train, make the store with with_grads = true");
  return grads_.view(spec.offset, spec.shape);
}

void VariableStore::set_working_dtype(DType dtype, const Stream& stream) {
  TL_CHECK(dtype == DType::Float32 || is_16bit(dtype), InvalidArgument,
           "VariableStore::set_working_dtype: " << dtype_name(dtype)
                                                << " (a working copy is bfloat16 or float16; "
                                                   "float32 removes it)");
  working_ = dtype == DType::Float32 ? Tensor() : Tensor::empty({values_.numel()}, stream, dtype);
}

void VariableStore::round_working(const Stream& stream) {
  if (working_.defined() && working_.numel() > 0) cast(working_, values_, stream);
}

void VariableStore::share_values(const VariableStore& other) {
  TL_CHECK(&other.set() == set_, InvalidArgument,
           "VariableStore::share_values: the stores hold different variable sets");
  TL_CHECK(other.device_ == device_ && other.values_.dtype() == values_.dtype(), InvalidArgument,
           "VariableStore::share_values: a store on "
               << device_.str() << " in " << dtype_name(values_.dtype())
               << " cannot share the memory of one on " << other.device_.str() << " in "
               << dtype_name(other.values_.dtype()));
  values_ = other.values_;
  if (working_.defined() && other.working_.defined() &&
      working_.dtype() == other.working_.dtype()) {
    working_ = other.working_;
  }
}

void VariableStore::swap_grads(VariableStore& other) {
  TL_CHECK(&other.set() == set_, InvalidArgument,
           "VariableStore::swap_grads: the stores hold different variable sets");
  TL_CHECK(grads_.defined() && other.grads_.defined(), InvalidArgument,
           "VariableStore::swap_grads: " << (grads_.defined() ? "the other store" : "this store")
                                         << " holds no gradients");
  TL_CHECK(other.device_ == device_ && other.grads_.dtype() == grads_.dtype(), InvalidArgument,
           "VariableStore::swap_grads: gradients on "
               << device_.str() << " in " << dtype_name(grads_.dtype())
               << " cannot trade buffers with gradients on " << other.device_.str() << " in "
               << dtype_name(other.grads_.dtype()));
  std::swap(grads_, other.grads_);
}

Tensor VariableStore::working(const std::string& name) const {
  const VariableSpec& spec = set_->at(name);
  if (!working_.defined() || !spec.trainable) return Tensor();
  return working_.view(spec.offset, spec.shape);
}

}  // namespace towerlab
