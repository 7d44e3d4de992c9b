#include "autograd/transformer.h"

#include <cmath>
#include <sstream>

#include "autograd/nn.h"
#include "autograd/ops.h"
#include "engine/error.h"

namespace towerlab {

LayerNorm::LayerNorm(VariableSet& vars, std::string name, std::int64_t features, double eps)
    : name_(std::move(name)), features_(features), eps_(eps) {
  TL_CHECK(features_ > 0 && eps_ > 0.0, InvalidArgument,
           "LayerNorm " << name_ << ": features and eps must be positive, got " << features_
                        << " and " << eps_);
  vars.get(name_ + "/gamma", {features_}, Initializer::ones());
  vars.get(name_ + "/beta", {features_}, Initializer::zeros());
}

Var LayerNorm::forward(const Context& ctx, const Var& x) const {
  return ag::layer_norm(x, ctx.variable(name_ + "/gamma"), ctx.variable(name_ + "/beta"), eps_);
}

std::string LayerNorm::describe() const {
  std::ostringstream os;
  os << name_ << ": LayerNorm " << features_ << " eps " << eps_;
  return os.str();
}

TokenLinear::TokenLinear(VariableSet& vars, std::string name, std::int64_t in_features,
                         std::int64_t out_features)
    : linear_(vars, name, in_features, out_features),
      name_(std::move(name)),
      in_(in_features),
      out_(out_features) {}

Var TokenLinear::forward(const Context& ctx, const Var& x) const {
  TL_CHECK(x.value().dim() >= 2 && x.shape().back() == in_, ShapeError,
           "TokenLinear " << name_ << ": x " << x.describe() << " must be [..., " << in_ << "]");
  Shape out_shape = x.shape();
  out_shape.back() = out_;
  return ag::reshape(linear_(ctx, ag::reshape(x, {-1, in_})), out_shape);
}

std::string TokenLinear::describe() const {
  std::ostringstream os;
  os << name_ << ": TokenLinear " << in_ << "->" << out_;
  return os.str();
}

namespace {

std::int64_t checked_dim(const std::string& name, std::int64_t dim, std::int64_t heads) {
  TL_CHECK(dim > 0 && heads > 0 && dim % heads == 0, InvalidArgument,
           "MultiHeadSelfAttention " << name << ": the width " << dim
                                     << " must be a positive multiple of the heads " << heads);
  return dim;
}

}  // namespace

MultiHeadSelfAttention::MultiHeadSelfAttention(VariableSet& vars, std::string name,
                                               std::int64_t dim, std::int64_t heads,
                                               double attention_dropout)
    : name_(std::move(name)),
      dim_(checked_dim(name_, dim, heads)),
      heads_(heads),
      attention_dropout_(attention_dropout),
      q_(vars, name_ + "/q", dim, dim),
      k_(vars, name_ + "/k", dim, dim),
      v_(vars, name_ + "/v", dim, dim),
      out_(vars, name_ + "/out", dim, dim) {
  TL_CHECK(attention_dropout_ >= 0.0 && attention_dropout_ < 1.0, InvalidArgument,
           "MultiHeadSelfAttention " << name_ << ": attention dropout must be in [0, 1), got "
                                     << attention_dropout_);
}

Var MultiHeadSelfAttention::split_heads(const Var& x) const {
  const std::int64_t n = x.shape()[0], t = x.shape()[1];
  const Var heads = ag::permute(ag::reshape(x, {n, t, heads_, dim_ / heads_}), {0, 2, 1, 3});
  return ag::reshape(heads, {n * heads_, t, dim_ / heads_});
}

Var MultiHeadSelfAttention::merge_heads(const Var& x) const {
  const std::int64_t n = x.shape()[0] / heads_, t = x.shape()[1];
  const Var tokens = ag::permute(ag::reshape(x, {n, heads_, t, dim_ / heads_}), {0, 2, 1, 3});
  return ag::reshape(tokens, {n, t, dim_});
}

Var MultiHeadSelfAttention::forward(const Context& ctx, const Var& x) const {
  TL_CHECK(x.value().dim() == 3 && x.shape()[2] == dim_, ShapeError,
           "MultiHeadSelfAttention " << name_ << ": x " << x.describe() << " must be [N,T," << dim_
                                     << "]");
  const std::int64_t n = x.shape()[0], t = x.shape()[1];
  const double scale = 1.0 / std::sqrt(double(dim_ / heads_));
  const Var q = split_heads(ag::scale(q_(ctx, x), scale));
  const Var k = split_heads(k_(ctx, x)), v = split_heads(v_(ctx, x));
  Var p = ag::softmax(ag::batched_matmul(q, k, false, true));  // [N*H,T,T]
  if (attention_dropout_ > 0.0 && ctx.training) {
    const Var per_sample = ag::reshape(p, {n, heads_, t, t});
    p = ag::reshape(
        ag::dropout(per_sample, attention_dropout_, ctx.dropout_key(name_ + "/dropout")),
        {n * heads_, t, t});
  }
  return out_(ctx, merge_heads(ag::batched_matmul(p, v)));
}

std::string MultiHeadSelfAttention::describe() const {
  std::ostringstream os;
  os << name_ << ": MultiHeadSelfAttention " << dim_ << ", " << heads_ << " heads";
  if (attention_dropout_ > 0.0) os << ", attention dropout " << attention_dropout_;
  return os.str();
}

Var MeanTokens::forward(const Context&, const Var& x) const {
  TL_CHECK(x.value().dim() == 3 && x.shape()[1] > 0, ShapeError,
           "MeanTokens: x " << x.describe() << " must be [N,T,D] with T >= 1");
  const Shape& s = x.shape();
  // [N,D,T,1]: each feature's tokens as one channel's plane for global average pooling.
  return ag::global_avg_pool2d(ag::reshape(ag::transpose(x, 1, 2), {s[0], s[2], s[1], 1}));
}

}  // namespace towerlab
