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
//
// A safetensors file without that "format" is read as plain weights: float32
// tensors named like the model's variables (what tools/torch_convert.py writes
// from a PyTorch state_dict, or numpy's or the safetensors library's output). It
// carries no step and no optimizer state, so an optimizer loaded from it starts
// fresh, and CheckpointInfo says so.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "optimizer.h"
#include "variables.h"

namespace towerlab {

// How closely a file must match the model.
enum class CheckpointMatch {
  // The file holds every variable of the model and nothing else (a checkpoint's
  // optimizer slots aside); anything else is CheckpointMismatch listing it all.
  Exact,
  // Variables the file lacks keep their values and entries the model does not use
  // are skipped; both are named in CheckpointInfo. A tensor the model has under the
  // same name but with another shape or dtype is still CheckpointMismatch.
  Partial,
};

// What a load found and did.
struct CheckpointInfo {
  std::string optimizer;  // the file's optimizer; "none" for one saved without it or plain weights
  std::int64_t step = 0;  // the file's step count; 0 for plain weights
  std::map<std::string, std::string> metadata;  // everything in the file's metadata
  bool plain_weights = false;  // the file is not a towerlab checkpoint (no "format")
  // What happened to the optimizer given to load_checkpoint. Fresh (no slots, step
  // 0) when the file is plain weights, holds no state for this kind of optimizer, or
  // (Partial) lacks some of its slots.
  enum class OptimizerState { NotGiven, Restored, Fresh };
  OptimizerState optimizer_state = OptimizerState::NotGiven;
  std::vector<std::string> missing;  // model variables not in the file, unchanged (Partial)
  std::vector<std::string> unused;   // file entries the model does not use (Partial)

  // One line for a log: "checkpoint model.safetensors (adam, step 1200)", or
  // "plain weights w.safetensors (no step, no optimizer state); the optimizer starts
  // fresh; not in the file, kept: fc2/bias; unused in the file: extra/x".
  std::string summary(const std::string& path) const;
};

// Saves `store` (and `optimizer`'s slots and step count, when given) to `path`.
// They are read on their device's default stream: work that wrote them on another
// stream must have finished (a Trainer's calls return with theirs finished).
void save_checkpoint(const std::string& path, const VariableStore& store,
                     const Optimizer* optimizer = nullptr,
                     const std::map<std::string, std::string>& metadata = {});

// Loads `path` (a checkpoint or plain weights) into `store` (any device) and, when
// `optimizer` is given, restores its slots and step count from a checkpoint of the
// same optimizer kind (another kind's slots are InvalidArgument). A file that does
// not match the model under `match` is rejected before anything is changed, with one
// message listing what is missing, unexpected, mis-shaped and of the wrong dtype
// (CheckpointMismatch); a malformed file or an unknown towerlab format version is
// an IoError. The copy runs on `stream` and has finished when the call returns;
// work on other streams that uses the store must have finished before the call (a
// Trainer's calls return with theirs finished).
CheckpointInfo load_checkpoint(const std::string& path, VariableStore& store, Optimizer* optimizer,
                               const Stream& stream,
                               CheckpointMatch match = CheckpointMatch::Exact);

}  // namespace towerlab
