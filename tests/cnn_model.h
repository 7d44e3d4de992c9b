// A small CNN without batch norm (conv, ReLU, max pool, fully connected) on [N,1,8,8]
// images and 3 classes, for the tests that compare towers with one device: without
// batch norm, N towers on any devices take one device's steps.
#pragma once

#include "towerlab.h"

namespace towerlab::testing {

struct CnnModel {
  VariableSet vars;
  Sequential net;
  CnnModel() {
    net.add<Conv2d>(vars, "conv1", 1, 4, 3, Conv2dParams{.pad_h = 1, .pad_w = 1});
    net.add<ReLU>();
    net.add<MaxPool2d>(Pool2dParams::square(2, 2));
    net.add<Flatten>();
    net.add<Linear>(vars, "fc", 4 * 4 * 4, 3);
  }
};

}  // namespace towerlab::testing
