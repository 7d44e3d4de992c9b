#include "autograd/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <vector>

#include "engine/error.h"
#include "engine/safetensors.h"

namespace towerlab {

namespace {

constexpr const char* kFormat = "towerlab-checkpoint-1";

std::string slot_key(const std::string& slot, const std::string& variable) {
  return "optimizer/" + slot + "/" + variable;
}

std::vector<TensorSpec> expected_entries(const VariableSet& set,
                                         const std::vector<std::string>& slots) {
  std::vector<TensorSpec> specs;
  for (const VariableSpec& v : set.specs()) specs.push_back({v.name, v.shape, DType::Float32});
  for (const std::string& slot : slots) {
    for (const VariableSpec& v : set.specs()) {
      if (v.trainable) specs.push_back({slot_key(slot, v.name), v.shape, DType::Float32});
    }
  }
  return specs;
}

}  // namespace

void save_checkpoint(const std::string& path, const VariableStore& store,
                     const Optimizer* optimizer,
                     const std::map<std::string, std::string>& metadata) {
  TL_CHECK(store.flat_values().dtype() == DType::Float32, NotSupported,
           "save_checkpoint: checkpoints hold float32 variables, the store is "
               << store.flat_values().describe());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const VariableSpec& v : store.set().specs())
    tensors.emplace_back(v.name, store.value(v.name));
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = kFormat;
  meta["optimizer"] = optimizer != nullptr ? optimizer->name() : "none";
  meta["step"] = std::to_string(optimizer != nullptr ? optimizer->steps() : 0);
  const bool with_slots = optimizer != nullptr && !optimizer->slots().empty();
  meta["optimizer_slots"] = with_slots ? "1" : "0";
  if (with_slots) {
    for (const auto& [slot, flat] : optimizer->slots()) {
      for (const VariableSpec& v : store.set().specs()) {
        if (v.trainable) tensors.emplace_back(slot_key(slot, v.name), flat.view(v.offset, v.shape));
      }
    }
  }
  save_safetensors(path, tensors, meta);
}

CheckpointInfo load_checkpoint(const std::string& path, VariableStore& store, Optimizer* optimizer,
                               const Stream& stream) {
  const SafetensorsHeader header = read_safetensors_header(path);
  CheckpointInfo info;
  info.metadata = header.metadata;
  auto meta = [&](const char* key) {
    auto it = header.metadata.find(key);
    return it == header.metadata.end() ? std::string() : it->second;
  };
  TL_CHECK(meta("format") == kFormat, IoError,
           "checkpoint " << path << " is not a towerlab checkpoint (format '" << meta("format")
                         << "', expected '" << kFormat << "')");
  info.optimizer = meta("optimizer");
  const std::string step = meta("step");
  auto [end, ec] = std::from_chars(step.data(), step.data() + step.size(), info.step);
  TL_CHECK(ec == std::errc() && end == step.data() + step.size() && info.step >= 0, IoError,
           "checkpoint " << path << " has a malformed step count '" << step << "'");

  const bool file_has_slots = meta("optimizer_slots") == "1";
  std::vector<std::string> slots;
  if (optimizer != nullptr) {
    TL_CHECK(info.optimizer == optimizer->name() || !file_has_slots, InvalidArgument,
             "checkpoint " << path << " holds the state of a " << info.optimizer
                           << " optimizer, not of " << optimizer->name());
    if (file_has_slots) slots = optimizer->slot_names();
  } else if (file_has_slots) {
    // Loading weights only: the slots in the file are expected, and ignored.
    for (const auto& e : header.entries) {
      const auto name = e.name;
      if (name.starts_with("optimizer/")) {
        const std::string slot = name.substr(10, name.find('/', 10) - 10);
        if (std::find(slots.begin(), slots.end(), slot) == slots.end()) slots.push_back(slot);
      }
    }
  }
  check_checkpoint(path, expected_entries(store.set(), slots), header.entries);

  const std::map<std::string, Tensor> tensors = load_safetensors(path, Device::cpu());
  for (const VariableSpec& v : store.set().specs()) {
    copy_tensor(store.value(v.name), tensors.at(v.name), stream);
  }
  if (optimizer != nullptr) {
    std::map<std::string, Tensor> flat_slots;
    for (const std::string& slot : slots) {
      Tensor flat = Tensor::empty(store.flat_values().shape(), Device::cpu());
      for (const VariableSpec& v : store.set().specs()) {
        if (v.trainable)
          copy_tensor(flat.view(v.offset, v.shape), tensors.at(slot_key(slot, v.name)),
                      default_stream(Device::cpu()));
      }
      flat_slots[slot] = flat;
    }
    if (file_has_slots) {
      optimizer->restore(flat_slots, info.step, store, stream);
    } else {
      optimizer->restore({}, 0, store, stream);  // fresh state: no slots saved yet
    }
  }
  stream.synchronize();
  return info;
}

}  // namespace towerlab
