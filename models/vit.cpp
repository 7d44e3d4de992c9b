#include "models/vit.h"

#include <sstream>

#include "autograd/ops.h"
#include "engine/error.h"

namespace towerlab::models {

PatchEmbedding::PatchEmbedding(VariableSet& vars, const std::string& name, std::int64_t image,
                               std::int64_t in_channels, std::int64_t patch, std::int64_t dim)
    : conv_(vars, name, in_channels, dim, patch,
            Conv2dParams{.stride_h = patch, .stride_w = patch}),
      name_(name),
      in_channels_(in_channels),
      patch_(patch),
      dim_(dim),
      tokens_((image / patch) * (image / patch)) {
  vars.get(name_ + "/position", {tokens_, dim_}, Initializer::normal(0.0f, 0.02f));
}

Var PatchEmbedding::forward(const Context& ctx, const Var& x) const {
  const Var patches = conv_(ctx, x);  // [N,D,I/P,I/P]
  const std::int64_t n = patches.shape()[0];
  TL_CHECK(patches.shape()[2] * patches.shape()[3] == tokens_, ShapeError,
           "PatchEmbedding " << name_ << ": x " << x.describe() << " gives "
                             << patches.shape()[2] * patches.shape()[3] << " patches of " << patch_
                             << "x" << patch_ << " but " << name_ << "/position has " << tokens_);
  const Var tokens = ag::transpose(ag::reshape(patches, {n, dim_, tokens_}), 1, 2);
  return ag::add(tokens, ctx.variable(name_ + "/position"));  // [N,T,D] + [T,D]
}

std::string PatchEmbedding::describe() const {
  std::ostringstream os;
  os << name_ << ": PatchEmbedding " << in_channels_ << "->" << dim_ << " " << patch_ << "x"
     << patch_ << ", " << tokens_ << " tokens";
  return os.str();
}

namespace {

void add_dropout(Sequential& seq, const std::string& name, double p) {
  if (p > 0.0) seq.add<Dropout>(name, p);
}

// x + dropout(attention(ln1(x))), then x + dropout(fc2(dropout(gelu(fc1(ln2(x)))))).
void add_block(Sequential& net, VariableSet& vars, const std::string& name, const VitOptions& o) {
  Sequential attention;
  attention.add<LayerNorm>(vars, name + "/ln1", o.dim);
  attention.add<MultiHeadSelfAttention>(vars, name + "/attn", o.dim, o.heads, o.attention_dropout);
  add_dropout(attention, name + "/dropout1", o.dropout);
  net.add<Residual>(name + "/attention", std::move(attention), std::nullopt, Activation::None);
  Sequential mlp;
  mlp.add<LayerNorm>(vars, name + "/ln2", o.dim);
  mlp.add<TokenLinear>(vars, name + "/mlp/fc1", o.dim, o.mlp_ratio * o.dim);
  mlp.add<ActivationLayer>(ActivationOp::gelu());
  add_dropout(mlp, name + "/mlp/dropout", o.dropout);
  mlp.add<TokenLinear>(vars, name + "/mlp/fc2", o.mlp_ratio * o.dim, o.dim);
  add_dropout(mlp, name + "/dropout2", o.dropout);
  net.add<Residual>(name + "/mlp", std::move(mlp), std::nullopt, Activation::None);
}

}  // namespace

Sequential vit(VariableSet& vars, const VitOptions& o) {
  TL_CHECK(o.image > 0 && o.in_channels > 0 && o.patch > 0 && o.image % o.patch == 0 && o.dim > 0 &&
               o.heads > 0 && o.dim % o.heads == 0 && o.blocks > 0 && o.mlp_ratio > 0 &&
               o.classes > 0,
           InvalidArgument,
           "vit: sizes must be positive, the patch must divide the image and the heads the "
           "width, got image "
               << o.image << ", channels " << o.in_channels << ", patch " << o.patch << ", width "
               << o.dim << ", heads " << o.heads << ", blocks " << o.blocks << ", MLP ratio "
               << o.mlp_ratio << ", classes " << o.classes);
  TL_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, InvalidArgument,
           "vit: dropout must be in [0, 1), got " << o.dropout);
  Sequential net;
  net.add<PatchEmbedding>(vars, "patch", o.image, o.in_channels, o.patch, o.dim);
  add_dropout(net, "patch/dropout", o.dropout);
  for (int b = 1; b <= o.blocks; ++b) add_block(net, vars, "block" + std::to_string(b), o);
  net.add<LayerNorm>(vars, "ln", o.dim);
  net.add<MeanTokens>();
  net.add<Linear>(vars, "head", o.dim, o.classes);
  return net;
}

}  // namespace towerlab::models
