// A small vision transformer for 28x28 images (Dosovitskiy et al. 2020, with pre-norm
// blocks), and the twin of tools/vit_torch.py's ViT. Like models/resnet.h, a model
// built from the library's layers (autograd/transformer.h); towerlab.h does not
// include it.
//
//   patch    conv PxP stride P, C -> D, plus learned positions    [N,T,D], T = (28/P)^2
//            dropout
//   block b  x + dropout(attention(layer_norm(x)))                 [N,T,D]
//   (x B)    x + dropout(fc2(dropout(gelu(fc1(layer_norm(x))))))   fc1: D -> R*D
//   layer norm, the mean over the tokens, linear D -> classes      [N,classes]
//
// Pooling is the tokens' mean rather than a class token: every token's output then
// reaches the head (the class token's gradient passes through attention alone), it
// needs no token prepended to the batch, and small ViTs trained from scratch do as
// well or better with it (Beyer, Zhai and Kolesnikov 2022, "Better plain ViT
// baselines for ImageNet-1k"). GELU is the erf form, PyTorch's default.
//
// With the defaults (P = 4: 49 tokens; D = 64, 4 heads, B = 4 blocks, R = 2) it has
// 138 890 parameters.
//
//   VariableSet vars;
//   Sequential net = models::vit(vars);
//   Sequential tiny = models::vit(vars2, {.image = 8, .patch = 4, .dim = 8, .heads = 2});
#pragma once

#include <string>

#include "../autograd/transformer.h"

namespace towerlab::models {

struct VitOptions {
  std::int64_t image = 28;  // the input's height and width
  std::int64_t in_channels = 1;
  std::int64_t patch = 4;  // must divide image
  std::int64_t dim = 64;   // D, the tokens' width
  std::int64_t heads = 4;  // must divide dim
  int blocks = 4;
  std::int64_t mlp_ratio = 2;  // each block's MLP is D -> mlp_ratio*D -> D
  std::int64_t classes = 10;
  double dropout = 0.1;            // after the positions, each branch and the MLP's GELU
  double attention_dropout = 0.0;  // on the attention probabilities
};

// The patch embedding: x [N,C,I,I] -> conv PxP stride P [N,D,I/P,I/P] -> [N,T,D],
// plus the learned positions. Declares <name>/weight [D,C,P,P] (He normal),
// <name>/bias [D] (zeros) and <name>/position [T,D] (normal, standard deviation 0.02).
class PatchEmbedding : public Layer {
 public:
  PatchEmbedding(VariableSet& vars, const std::string& name, std::int64_t image,
                 std::int64_t in_channels, std::int64_t patch, std::int64_t dim);
  Var forward(const Context& ctx, const Var& x) const override;
  std::string describe() const override;  // "patch: PatchEmbedding 1->64 4x4, 49 tokens"

 private:
  Conv2d conv_;
  std::string name_;
  std::int64_t in_channels_, patch_, dim_, tokens_;
};

// Input [N,in_channels,image,image], output logits [N,classes]. Declares patch/weight,
// patch/bias, patch/position, then per block b (from 1) block<b>/ln1/{gamma,beta},
// block<b>/attn/{q,k,v,out}/{weight,bias}, block<b>/ln2/{gamma,beta},
// block<b>/mlp/fc1/{weight,bias} [R*D,D], block<b>/mlp/fc2/{weight,bias} [D,R*D], and
// last ln/{gamma,beta} and head/{weight,bias} [classes,D]. The dropouts' keys:
// patch/dropout, block<b>/attn/dropout, block<b>/dropout1, block<b>/mlp/dropout,
// block<b>/dropout2 (a dropout of rate 0 is left out).
Sequential vit(VariableSet& vars, const VitOptions& options = {});

}  // namespace towerlab::models
