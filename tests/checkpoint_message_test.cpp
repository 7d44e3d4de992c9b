// The message for another model's checkpoint loaded without an optimizer: a count
// summary, then the variables' problems; the optimizer slots (two per variable for
// Adam) are counted, not listed before the variables.
#include <gtest/gtest.h>

#include "file_test_util.h"
#include "test_util.h"
#include "towerlab.h"

namespace towerlab::testing {
namespace {

TEST(CheckpointMessage, AnotherModelLeadsWithCountsAndVariables) {
  VariableSet saved_set;
  for (const char* name : {"conv1/weight", "conv2/weight", "fc/weight", "fc/bias"}) {
    saved_set.get(name, {3, 4}, Initializer::ones());
  }
  VariableStore saved(saved_set, cpu());
  saved.initialize(1, cpu());
  Optimizer adam = Optimizer::adam({}, LearningRate::constant(1e-3));
  fill(saved.flat_grads(), 0.5, cpu());
  adam.step(saved, saved.flat_grads(), cpu());
  ASSERT_EQ(adam.slots().size(), 2u);  // m and v: 8 slot entries in the file
  ScratchDir dir;
  save_checkpoint(dir.file("other.safetensors"), saved, &adam);

  VariableSet model;
  model.get("conv1/weight", {3, 4}, Initializer::ones());
  model.get("head/weight", {3, 4}, Initializer::ones());
  VariableStore store(model, cpu(), /*with_grads=*/false);
  try {
    load_checkpoint(dir.file("other.safetensors"), store, nullptr, cpu());
    ADD_FAILURE() << "expected CheckpointMismatch";
  } catch (const CheckpointMismatch& e) {
    const std::string msg = e.what();
    // Variables: head/weight missing; conv2/weight, fc/weight, fc/bias unexpected.
    // Slots: the file's 8 are unexpected save the 2 of conv1/weight; the model's 2
    // for head/weight are missing.
    const std::string lead = "checkpoint " + dir.file("other.safetensors") +
                             " does not match the model (4 variable problems, 8 optimizer-slot "
                             "problems): missing head/weight [3,4]; unexpected ";
    EXPECT_EQ(msg.substr(0, lead.size()), lead) << msg;
    EXPECT_NE(msg.find("unexpected fc/bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("; and 8 optimizer-slot entries"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("optimizer/m/"), std::string::npos) << msg;
  }
}

// With the variables matching, the slots' problems are the message, listed.
TEST(CheckpointMessage, SlotProblemsAreListedWhenTheVariablesMatch) {
  VariableSet set;
  set.get("fc/weight", {2, 2}, Initializer::ones());
  VariableStore store(set, cpu());
  store.initialize(1, cpu());
  Optimizer adam = Optimizer::adam({}, LearningRate::constant(1e-3));
  adam.step(store, store.flat_grads(), cpu());
  ScratchDir dir;
  save_checkpoint(dir.file("full.safetensors"), store, &adam);
  SafetensorsFile file = load_safetensors(dir.file("full.safetensors"), Device::cpu());
  std::vector<std::pair<std::string, Tensor>> kept;
  for (const auto& [name, t] : file.tensors) {
    if (name != "optimizer/v/fc/weight") kept.emplace_back(name, t);
  }
  save_safetensors(dir.file("gap.safetensors"), kept, file.metadata);
  Optimizer fresh = Optimizer::adam({}, LearningRate::constant(1e-3));
  EXPECT_THROW_WITH(load_checkpoint(dir.file("gap.safetensors"), store, &fresh, cpu()),
                    CheckpointMismatch,
                    "(0 variable problems, 1 optimizer-slot problem): missing "
                    "optimizer/v/fc/weight [2,2]");
}

}  // namespace
}  // namespace towerlab::testing
