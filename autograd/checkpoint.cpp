#include "autograd/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>
#include <vector>

#include "engine/error.h"
#include "engine/safetensors.h"

namespace towerlab {

namespace {

constexpr const char* kFormat = "towerlab-checkpoint-1";
constexpr const char* kFormatFamily = "towerlab-checkpoint-";

std::string slot_key(const std::string& slot, const std::string& variable) {
  return "optimizer/" + slot + "/" + variable;
}

std::vector<TensorSpec> variable_specs(const VariableSet& set) {
  std::vector<TensorSpec> specs;
  for (const VariableSpec& v : set.specs()) specs.push_back({v.name, v.shape, DType::Float32});
  return specs;
}

std::vector<TensorSpec> slot_specs(const VariableSet& set, const std::vector<std::string>& slots) {
  std::vector<TensorSpec> specs;
  for (const std::string& slot : slots) {
    for (const VariableSpec& v : set.specs()) {
      if (v.trainable) specs.push_back({slot_key(slot, v.name), v.shape, DType::Float32});
    }
  }
  return specs;
}

// The slot names of the "optimizer/<slot>/<variable>" entries, in file order.
std::vector<std::string> slots_in_file(const SafetensorsHeader& header) {
  std::vector<std::string> slots;
  for (const SafetensorsEntry& e : header.entries) {
    if (!e.name.starts_with("optimizer/")) continue;
    const std::string slot = e.name.substr(10, e.name.find('/', 10) - 10);
    if (std::find(slots.begin(), slots.end(), slot) == slots.end()) slots.push_back(slot);
  }
  return slots;
}

void join_names(std::ostringstream& os, const char* label, const std::vector<std::string>& names) {
  if (names.empty()) return;
  os << "; " << label << ": ";
  for (std::size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << names[i];
}

// checkpoint_mismatch()'s problems without its "checkpoint <path> ... model: "
// prefix, and how many there are.
std::pair<std::string, std::size_t> problems_of(const std::string& path,
                                                const std::vector<TensorSpec>& expected,
                                                const std::vector<SafetensorsEntry>& entries) {
  const std::string message = checkpoint_mismatch(path, expected, entries);
  if (message.empty()) return {"", 0};
  const std::string list = message.substr(message.find(": ", path.size()) + 2);
  std::size_t count = 1;
  for (std::size_t at = list.find("; "); at != std::string::npos; at = list.find("; ", at + 2)) {
    ++count;
  }
  return {list, count};
}

// What does not match, led by a count summary and the variables' problems. The
// optimizer slots repeat every variable once per slot, so when the variables differ
// (another model's file) the slots' problems are only counted: listed, they would
// bury the variables under two or three times as many lines. "" when all match.
std::string mismatch_message(const std::string& path, const std::vector<TensorSpec>& variables,
                             const std::vector<TensorSpec>& slots,
                             const std::vector<SafetensorsEntry>& entries) {
  std::vector<SafetensorsEntry> variable_entries, slot_entries;
  for (const SafetensorsEntry& e : entries) {
    (e.name.starts_with("optimizer/") ? slot_entries : variable_entries).push_back(e);
  }
  const auto [variable_list, variable_count] = problems_of(path, variables, variable_entries);
  const auto [slot_list, slot_count] = problems_of(path, slots, slot_entries);
  if (variable_count + slot_count == 0) return "";
  std::ostringstream os;
  os << "checkpoint " << path << " does not match the model (" << variable_count
     << " variable problem" << (variable_count == 1 ? "" : "s") << ", " << slot_count
     << " optimizer-slot problem" << (slot_count == 1 ? "" : "s") << "): ";
  if (variable_count > 0) {
    os << variable_list;
    if (slot_count > 0) {
      os << "; and " << slot_count
         << " optimizer-slot entries (optimizer/<slot>/<variable>), which differ as the "
            "variables do";
    }
  } else {
    os << slot_list;
  }
  return os.str();
}

}  // namespace

std::string CheckpointInfo::summary(const std::string& path) const {
  std::ostringstream os;
  if (plain_weights) {
    os << "plain weights " << path << " (no step, no optimizer state)";
  } else {
    os << "checkpoint " << path << " (" << optimizer << ", step " << step << ")";
  }
  if (optimizer_state == OptimizerState::Fresh) os << "; the optimizer starts fresh";
  join_names(os, "not in the file, kept", missing);
  join_names(os, "unused in the file", unused);
  return os.str();
}

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
                               const Stream& stream, CheckpointMatch match) {
  const SafetensorsHeader header = read_safetensors_header(path);
  CheckpointInfo info;
  info.metadata = header.metadata;
  auto meta = [&](const char* key) {
    auto it = header.metadata.find(key);
    return it == header.metadata.end() ? std::string() : it->second;
  };

  // 1. What the file is: a checkpoint (its optimizer and step) or plain weights.
  const std::string format = meta("format");
  info.plain_weights = !format.starts_with(kFormatFamily);
  if (info.plain_weights) {
    info.optimizer = "none";
  } else {
    TL_CHECK(format == kFormat, IoError,
             "checkpoint " << path << " has format '" << format
                           << "', which this towerlab does not read (it reads '" << kFormat
                           << "')");
    info.optimizer = meta("optimizer");
    const std::string step = meta("step");
    auto [end, ec] = std::from_chars(step.data(), step.data() + step.size(), info.step);
    TL_CHECK(ec == std::errc() && end == step.data() + step.size() && info.step >= 0, IoError,
             "checkpoint " << path << " has a malformed step count '" << step << "'");
  }

  // 2. The entries the model reads: every variable, and the optimizer slots of a
  // checkpoint that has them (read into `optimizer`, or expected and skipped
  // when loading weights only).
  const bool file_has_slots = !info.plain_weights && meta("optimizer_slots") == "1";
  std::vector<std::string> slots;
  if (file_has_slots && optimizer != nullptr) {
    TL_CHECK(info.optimizer == optimizer->name(), InvalidArgument,
             "checkpoint " << path << " holds the state of a " << info.optimizer
                           << " optimizer, not of " << optimizer->name());
    slots = optimizer->slot_names();
  } else if (file_has_slots) {
    slots = slots_in_file(header);
  }
  const std::vector<TensorSpec> variable_entries = variable_specs(store.set());
  std::vector<TensorSpec> wanted = variable_entries;
  const std::vector<TensorSpec> slot_entries = slot_specs(store.set(), slots);
  wanted.insert(wanted.end(), slot_entries.begin(), slot_entries.end());

  // 3. Check the file against them before anything changes.
  std::set<std::string> in_file;
  for (const SafetensorsEntry& e : header.entries) in_file.insert(e.name);
  const auto has = [&](const TensorSpec& spec) { return in_file.count(spec.name) > 0; };
  if (match == CheckpointMatch::Exact) {
    const std::string problems =
        mismatch_message(path, variable_entries, slot_entries, header.entries);
    if (!problems.empty() && info.plain_weights) {
      const std::string why = format.empty() ? "has no towerlab format metadata"
                                             : "has format '" + format + "', not towerlab's";
      throw CheckpointMismatch(problems + " (the file " + why +
                               ", so it was read as plain weights under the model's variable "
                               "names; tools/torch_convert.py converts a PyTorch state_dict)");
    }
    if (!problems.empty()) throw CheckpointMismatch(problems);
  } else {
    std::vector<TensorSpec> present;
    std::set<std::string> known;
    for (const TensorSpec& spec : wanted) {
      known.insert(spec.name);
      if (has(spec)) {
        present.push_back(spec);
      } else if (!spec.name.starts_with("optimizer/")) {
        info.missing.push_back(spec.name);
      }
    }
    std::vector<SafetensorsEntry> used;
    for (const SafetensorsEntry& e : header.entries) {
      if (known.count(e.name)) {
        used.push_back(e);
      } else {
        info.unused.push_back(e.name);
      }
    }
    check_checkpoint(path, present, used);  // what is there has the model's shapes and dtypes
  }

  // 4. Copy the variables, then the optimizer's state.
  const SafetensorsFile file = load_safetensors(path, Device::cpu());
  for (const VariableSpec& v : store.set().specs()) {
    auto it = file.tensors.find(v.name);
    if (it != file.tensors.end()) copy_tensor(store.value(v.name), it->second, stream);
  }
  if (optimizer != nullptr) {
    const bool slots_complete = std::all_of(slot_entries.begin(), slot_entries.end(), has);
    // A file of this optimizer without slots is one saved before its first step, or
    // of an optimizer that keeps none (plain SGD): its step count still counts.
    const bool restorable = file_has_slots
                                ? slots_complete
                                : !info.plain_weights && info.optimizer == optimizer->name();
    std::map<std::string, Tensor> flat_slots;
    if (restorable) {
      for (const std::string& slot : slots) {
        Tensor flat = Tensor::empty(store.flat_values().shape(), Device::cpu());
        for (const VariableSpec& v : store.set().specs()) {
          if (v.trainable)
            copy_tensor(flat.view(v.offset, v.shape), file.tensors.at(slot_key(slot, v.name)),
                        default_stream(Device::cpu()));
        }
        flat_slots[slot] = flat;
      }
    }
    optimizer->restore(flat_slots, restorable ? info.step : 0, store, stream);
    info.optimizer_state = restorable ? CheckpointInfo::OptimizerState::Restored
                                      : CheckpointInfo::OptimizerState::Fresh;
  }
  stream.synchronize();
  return info;
}

}  // namespace towerlab
