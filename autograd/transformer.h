// Transformer layers: layer normalization, a linear layer applied to every token, and
// multi-head self-attention, each built from autograd's ops (ag::layer_norm, ag::linear,
// ag::batched_matmul, ag::softmax, ag::dropout, shape ops), so none has backward code of
// its own. models/vit.h composes them into a vision transformer.
//
// Dimension letters: N samples, T tokens, D the model's width, H heads, E = D / H
// each head's width, F a linear layer's output features.
//
//   VariableSet vars;
//   Sequential attention_branch;                       // x [N,T,D] -> [N,T,D]
//   attention_branch.add<LayerNorm>(vars, "block1/ln1", 64);
//   attention_branch.add<MultiHeadSelfAttention>(vars, "block1/attn", 64, 4, 0.1);
//   net.add<Residual>("block1/attention", std::move(attention_branch), std::nullopt,
//                     Activation::None);           // x + attention(ln1(x))
//
// Dropout inside a layer draws its mask per sample of the whole batch (kernels/dropout.h),
// so every tensor it drops has the samples as its first dimension ([N,H,T,T], never
// [N*H,T,T]): N towers still take one device's step.
#pragma once

#include <string>

#include "layers.h"

namespace towerlab {

// y = layer_norm(x) over the last dimension, x [..., D]: declares <name>/gamma [D] (ones)
// and <name>/beta [D] (zeros), named as BatchNorm's scale and shift (so that
// l2_regularization, which decays "/weight" only, leaves them alone; PyTorch's
// LayerNorm calls them weight and bias). eps 1e-5, PyTorch's default.
class LayerNorm : public Layer {
 public:
  LayerNorm(VariableSet& vars, std::string name, std::int64_t features, double eps = 1e-5);
  Var forward(const Context& ctx, const Var& x) const override;
  std::string describe() const override;  // "block1/ln1: LayerNorm 64 eps 1e-05"

 private:
  std::string name_;
  std::int64_t features_;
  double eps_;
};

// A Linear layer (its variables, its He normal weights) applied to each token:
// x [..., D] is taken as rows [R, D], multiplied, and given back as [..., F].
class TokenLinear : public Layer {
 public:
  TokenLinear(VariableSet& vars, std::string name, std::int64_t in_features,
              std::int64_t out_features);
  Var forward(const Context& ctx, const Var& x) const override;
  std::string describe() const override;  // "block1/mlp/fc1: TokenLinear 64->128"

 private:
  Linear linear_;
  std::string name_;
  std::int64_t in_, out_;
};

// Multi-head self-attention on x [N,T,D] (Vaswani et al. 2017, section 3.2), y [N,T,D]:
//   q, k, v = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv          [N,T,D] each
//   split into heads: [N,T,H,E] -> [N,H,T,E] -> [N*H,T,E]
//   p = softmax((q / sqrt(E)) k^T) over the keys             [N*H,T,T]
//   p = dropout(p) with attention_dropout, on [N,H,T,T]     (training only)
//   o = p v, heads merged back: [N*H,T,E] -> [N,T,H,E] -> [N,T,D]
//   y = o Wout^T + bout
// Declares <name>/q, <name>/k, <name>/v and <name>/out, each /weight [D,D] and /bias [D]
// (three projections rather than one fused [3D,D] so each keeps its name and PyTorch
// twin); the dropout's mask key is <name>/dropout. q is scaled before the product (T*E
// multiplications rather than T*T), as tools/vit_torch.py does. D must divide by H.
class MultiHeadSelfAttention : public Layer {
 public:
  MultiHeadSelfAttention(VariableSet& vars, std::string name, std::int64_t dim, std::int64_t heads,
                         double attention_dropout = 0.0);
  Var forward(const Context& ctx, const Var& x) const override;
  // "block1/attn: MultiHeadSelfAttention 64, 4 heads, attention dropout 0.1"
  std::string describe() const override;

 private:
  Var split_heads(const Var& x) const;  // [N,T,D] -> [N*H,T,E]
  Var merge_heads(const Var& x) const;  // [N*H,T,E] -> [N,T,D]

  std::string name_;
  std::int64_t dim_, heads_;
  double attention_dropout_;
  TokenLinear q_, k_, v_, out_;
};

// The mean over the tokens: x [N,T,D] -> [N,D] (a ViT's pooling instead of a class token).
class MeanTokens : public Layer {
 public:
  Var forward(const Context& ctx, const Var& x) const override;
  std::string describe() const override { return "MeanTokens"; }
};

}  // namespace towerlab
