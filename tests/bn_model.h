// A small model with batch norm after a convolution and after a fully connected
// layer, for the tests that compare synchronized batch norm across towers and
// ranks with one device.
#pragma once

#include <vector>

#include "towerlab.h"

namespace towerlab::testing {

struct BnModel {
  VariableSet vars;
  Sequential net;
  BnModel() {
    net.add<Conv2d>(vars, "conv1", 1, 4, 3, Conv2dParams{.pad_h = 1, .pad_w = 1}, false);
    net.add<BatchNorm>(vars, "bn1", 4, 0.9);
    net.add<ReLU>();
    net.add<MaxPool2d>(Pool2dParams::square(2, 2));
    net.add<Flatten>();
    // No bias before batch norm: its gradient is zero up to rounding noise, which
    // Adam would blow up into full-size steps in different directions.
    net.add<Linear>(vars, "fc1", 4 * 4 * 4, 6, false);
    net.add<BatchNorm>(vars, "bn2", 6, 0.9);  // over N only: a fully connected layer
    net.add<ReLU>();
    net.add<Linear>(vars, "fc2", 6, 3);
  }
  TowerFn tower_fn() const {
    return [this](const Tower& tower, const std::vector<Tensor>& batch) {
      Var logits = net(tower.context(), tower.input(batch[0], "images"));
      return TowerResult{
          ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels")), {logits}, {}};
    };
  }
};

}  // namespace towerlab::testing
