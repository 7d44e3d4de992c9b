#include "models/fashion_net.h"

namespace towerlab::models {

Sequential fashion_net(VariableSet& vars) {
  Sequential net;
  const Conv2dParams same{.pad_h = 1, .pad_w = 1};
  // No conv bias before batch norm: its mean subtraction would cancel it.
  const double momentum = 0.99, eps = 1e-3;  // BatchNorm's defaults (TensorFlow's)
  const Pool2dParams pool = Pool2dParams::square(2, 2);
  net.add<Conv2d>(vars, "conv1", 1, 32, 3, same, false);
  net.add<BatchNorm>(vars, "bn1", 32, momentum, eps, Activation::ReLU, pool);
  net.add<Conv2d>(vars, "conv2", 32, 64, 3, same, false);
  net.add<BatchNorm>(vars, "bn2", 64, momentum, eps, Activation::ReLU, pool);
  net.add<Flatten>();
  net.add<Linear>(vars, "fc1", 3136, 128, true, Activation::ReLU);
  net.add<Linear>(vars, "fc2", 128, 10);
  return net;
}

}  // namespace towerlab::models
