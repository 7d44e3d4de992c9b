// FashionNet, the reference model of samples/fashion_mnist, the benches and the
// PyTorch twin (tools/fashion_net_torch.py), and where its data set lives. A model
// built from the library's layers, not part of the library's surface: towerlab.h
// does not include it, and a program that wants it includes
// <towerlab/models/fashion_net.h> itself.
//
//   VariableSet vars;
//   Sequential net = models::fashion_net(vars);
//   FashionMnist train = load_fashion_mnist(models::kFashionMnistDir, Split::Train);
#pragma once

#include "../autograd/layers.h"

namespace towerlab::models {

// Where Debian's dataset-fashion-mnist package puts the files (load_fashion_mnist in
// engine/dataset.h reads them from any directory).
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// conv 1->32 3x3 pad 1 (no bias), BN, ReLU, maxpool 2; conv 32->64 3x3 pad 1 (no
// bias), BN, ReLU, maxpool 2; flatten 3136; linear 3136->128, ReLU; linear 128->10.
// Input [N,1,28,28], output logits [N,10]. Each ReLU is fused into the layer before
// it (BatchNorm, Linear), and each max pool into its BatchNorm. Declares its
// variables (conv1/weight, bn1/..., fc2/bias) in `vars`.
Sequential fashion_net(VariableSet& vars);

}  // namespace towerlab::models
