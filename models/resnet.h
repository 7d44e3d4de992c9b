// A ResNet for 28x28 images in the style of ResNet-20 (He et al. 2015, the CIFAR
// network of section 4.2), and the twin of tools/resnet_torch.py's ResNet. Like
// models/fashion_net.h, a model built from the library's layers; towerlab.h does
// not include it.
//
//   stem     conv 3x3 C->W (no bias), BN + ReLU                      [N,W,28,28]
//   stage1   B basic blocks, W channels                              [N,W,28,28]
//   stage2   B basic blocks, 2W channels, the first with stride 2    [N,2W,14,14]
//   stage3   B basic blocks, 4W channels, the first with stride 2    [N,4W,7,7]
//   global average pooling, linear 4W -> classes                     [N,classes]
//
// With the defaults (W = 16, B = 3) that is ResNet-20: 19 convolutions and the
// linear layer, 272 thousand parameters. Each block is a Residual
// (autograd/layers.h): conv 3x3 (stride) BN + ReLU, conv 3x3 BN, plus the input, or
// where the shape changes a projection (conv 1x1 with the stride, BN), then ReLU,
// the sum and the ReLU one fused op (ag::add_relu).
//
//   VariableSet vars;
//   Sequential net = models::resnet(vars);                  // ResNet-20
//   Sequential small = models::resnet(vars2, {.width = 4, .blocks_per_stage = 1});
#pragma once

#include <string>

#include "../autograd/layers.h"

namespace towerlab::models {

struct ResNetOptions {
  std::int64_t in_channels = 1;
  std::int64_t width = 16;   // stage 1's channels; stages 2 and 3 have twice and four times
  int blocks_per_stage = 3;  // 3: ResNet-20 (6 B + 2 layers with weights)
  std::int64_t classes = 10;
};

// One basic block named `name` ("stage2/block1"): declares <name>/conv1/weight
// [out,in,3,3], <name>/bn1/{gamma,beta,moving_mean,moving_variance}, <name>/conv2,
// <name>/bn2 and, when stride > 1 or in != out, the projection <name>/shortcut/conv
// [out,in,1,1] and <name>/shortcut/bn. Convolutions have no bias (batch norm
// follows each); batch norm has TensorFlow's constants, as FashionNet's.
Residual basic_block(VariableSet& vars, const std::string& name, std::int64_t in, std::int64_t out,
                     std::int64_t stride);

// Input [N,in_channels,H,W] (H and W any size the strides leave at least 1), output
// logits [N,classes]. Declares stem/conv, stem/bn, stage<s>/block<b>/... (above) and
// fc/weight [classes,4W], fc/bias.
Sequential resnet(VariableSet& vars, const ResNetOptions& options = {});

}  // namespace towerlab::models
