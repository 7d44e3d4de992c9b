// Internal (not installed): what the Trainer keeps per tower, shared by the files
// that hold its phases (parallel/trainer.cpp, parallel/trainer_update.cpp).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "autograd/variables.h"
#include "engine/device.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "parallel/trainer.h"

namespace towerlab {

struct Trainer::TowerState {
  Device device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Tape> tape;
  std::unique_ptr<VariableStore> store;
  // Results of the last step, on the tower's device.
  Tensor loss;
  std::vector<Tensor> outputs;
  std::map<std::string, Tensor> logs;
};

}  // namespace towerlab
