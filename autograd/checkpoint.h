// Checkpoints: a model's variables, batch-norm moving statistics, optimizer slots
// and step count in one safetensors file, keyed by variable name. The file knows
// nothing of towers or devices: a model trained on four GPUs loads on one GPU or
// on the CPU. Writes are atomic (engine/safetensors.h): a crash or a full disk
// never leaves a broken file where a good one was.
//
// Keys: every variable under its own name ("conv1/weight", "bn1/moving_mean"), and
// each optimizer slot as "optimizer/<slot>/<variable>" ("optimizer/m/conv1/weight").
// Metadata: "format" = "towerlab-checkpoint-1", "optimizer" (its name, or "none"),
// "step" (updates applied), "optimizer_slots" ("1" when the slots are in the file),
// plus whatever the caller adds (epoch, seed...).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "autograd/optimizer.h"
#include "autograd/variables.h"

namespace towerlab {

struct CheckpointInfo {
  std::string optimizer;  // "none" for a checkpoint saved without one
  std::int64_t step = 0;
  std::map<std::string, std::string> metadata;  // everything in the file's metadata
};

// Saves `store` (and `optimizer`'s slots and step count, when given) to `path`.
// They are read on their device's default stream: work that wrote them on another
// stream must have finished (a Trainer's calls return with theirs finished).
void save_checkpoint(const std::string& path, const VariableStore& store,
                     const Optimizer* optimizer = nullptr,
                     const std::map<std::string, std::string>& metadata = {});

// Loads `path` into `store` (any device) and, when `optimizer` is given, restores
// its slots and step count (the file's optimizer must be of the same kind). A file
// that does not match the model is rejected before anything is changed, with one
// message listing what is missing, unexpected and mis-shaped (CheckpointMismatch);
// a malformed file is an IoError. The copy runs on `stream` and has finished when
// the call returns; work on other streams that uses the store must have finished
// before the call (a Trainer's calls return with theirs finished).
CheckpointInfo load_checkpoint(const std::string& path, VariableStore& store, Optimizer* optimizer,
                               const Stream& stream);

}  // namespace towerlab
