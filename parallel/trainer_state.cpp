// Trainer::save_state and Trainer::restore_state (parallel/trainer.h): a training
// checkpoint is an ordinary checkpoint (autograd/checkpoint.h) whose metadata also
// holds the trainer's counters and its fingerprint, so it loads as weights anywhere
// and resumes a run only where the steps would be the same.
#include <algorithm>
#include <sstream>
#include <string_view>

#include "engine/error.h"
#include "engine/safetensors.h"
#include "parallel/collective_checkpoint.h"
#include "parallel/fingerprint.h"
#include "parallel/process_group.h"
#include "parallel/trainer.h"

namespace towerlab {
namespace {

constexpr const char* kFingerprintKey = "trainer/fingerprint";
constexpr const char* kSkippedKey = "trainer/skipped_steps";
constexpr const char* kChecksumKey = "trainer/checksum";
// Fp16 only (LossScale): the next step's scale, and the clean steps since it changed.
constexpr const char* kLossScaleKey = "trainer/loss_scale";
constexpr const char* kCleanStepsKey = "trainer/loss_scale_clean_steps";

// FNV-1a (64 bits) of the state's bits: the variables, the moving statistics and
// every slot, in a fixed order. The safetensors header checks the file's size, not
// its data; this finds a flipped bit in the data too.
std::string checksum(const VariableStore& store, const Optimizer& optimizer, const Stream& stream) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  const auto add = [&](const Tensor& t) {
    const std::vector<float> host = t.to_host<float>(stream);
    const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
    for (std::size_t i = 0; i < host.size() * sizeof(float); ++i) {
      hash = (hash ^ bytes[i]) * 0x100000001b3ull;
    }
  };
  add(store.flat_values());
  if (store.flat_state().defined()) add(store.flat_state());
  for (const auto& [name, slot] : optimizer.slots()) add(slot);
  return std::to_string(hash);
}

// Fingerprint lines that a change of layout changes, the step count, which a
// resume changes by definition, and the precision with fp16's loss-scale interval
// and the gradient's reduce dtype (the master is float32 under each): the steps
// stay the same up to rounding.
bool layout_line(std::string_view line) {
  for (std::string_view key :
       {"optimizer steps\t", "towers per process\t", "master\t", "reduction\t", "bucket_bytes\t",
        "precision\t", "loss_scale_growth_interval\t", "reduce_dtype\t"}) {
    if (line.starts_with(key)) return true;
  }
  return false;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    for (char& c : line) c = c == '\t' ? ' ' : c;
    lines.push_back(line);
  }
  return lines;
}

// The first line where `file` and `here` differ: "<file's line> in the file, <ours>
// here"; "" when equal.
std::string first_difference(const std::string& file, const std::string& here) {
  const std::vector<std::string> a = lines_of(file), b = lines_of(here);
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string theirs = i < a.size() ? a[i] : "(nothing more)";
    const std::string ours = i < b.size() ? b[i] : "(nothing more)";
    if (theirs != ours) return "'" + theirs + "' in the file, '" + ours + "' in this run";
  }
  return {};
}

// Rank 0 reads the file's metadata (no tensor data) and compares it; every rank
// throws the same error or returns.
void check_resumable(ProcessGroup* group, const std::string& path, const std::string& fingerprint,
                     const std::map<std::string, std::string>& expected) {
  const auto check = [&] {
    const SafetensorsHeader header = read_safetensors_header(path);
    const auto found = header.metadata.find(kFingerprintKey);
    TL_CHECK(
        found != header.metadata.end() && header.metadata.count(kSkippedKey) > 0, InvalidArgument,
        "cannot resume from " << path << ": not a training state (Trainer::save_state writes one)");
    const std::string difference = first_difference(found->second, fingerprint);
    TL_CHECK(difference.empty(), InvalidArgument,
             "cannot resume from " << path << ": another model or other step options ("
                                   << difference << ")");
    for (const auto& [key, value] : expected) {
      const auto it = header.metadata.find(key);
      const std::string theirs = it == header.metadata.end() ? "(none)" : it->second;
      TL_CHECK(theirs == value, InvalidArgument,
               "cannot resume from " << path << ": another run (" << key << " " << theirs
                                     << " in the file, " << value << " in this run)");
    }
    return std::string();
  };
  if (group != nullptr) {
    on_rank0(*group, "restore_state " + path + ": check", check);
  } else {
    check();
  }
}

}  // namespace

std::string Trainer::state_fingerprint() const {
  std::istringstream in(trainer_fingerprint(variables_, DType::Float32, optimizer_, options_));
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    if (!layout_line(line)) kept += line + "\n";
  }
  // With local batch norm each tower normalizes its own slice: another tower count
  // is another step, not another rounding.
  const auto& specs = variables_.specs();
  const bool has_state =
      std::any_of(specs.begin(), specs.end(), [](const VariableSpec& v) { return !v.trainable; });
  if (has_state && options_.batchnorm == BatchNormMode::Local) {
    kept += "towers in the job (local batch norm)\t" +
            std::to_string(std::size_t(ranks_) * devices_.size()) + "\n";
  }
  return kept;
}

void Trainer::save_state(const std::string& path,
                         const std::map<std::string, std::string>& metadata) {
  // A sharded master is written whole, as any other: its slices gathered first.
  master();
  optimizer();
  std::map<std::string, std::string> all = metadata;
  all[kFingerprintKey] = state_fingerprint();
  all[kSkippedKey] = std::to_string(skipped_steps_);
  if (loss_scale_.enabled()) {
    std::ostringstream scale;
    scale.precision(17);  // a double round-trips through 17 digits
    scale << loss_scale_.scale();
    all[kLossScaleKey] = scale.str();
    all[kCleanStepsKey] = std::to_string(loss_scale_.clean_steps());
  }
  all[kChecksumKey] = checksum(*master_, optimizer_, default_stream(master_device_));
  if (options_.process_group != nullptr) {
    save_checkpoint(*options_.process_group, path, *master_, &optimizer_, all);
  } else {
    save_checkpoint(path, *master_, &optimizer_, all);
  }
}

CheckpointInfo Trainer::restore_state(const std::string& path,
                                      const std::map<std::string, std::string>& expected) {
  ProcessGroup* group = options_.process_group;
  check_resumable(group, path, state_fingerprint(), expected);
  // Sharded: the host copy made whole before the load writes it (a load refused
  // part way leaves the slices as they were until broadcast()).
  master();
  optimizer();
  const Stream& stream = default_stream(master_device_);
  CheckpointInfo info = group != nullptr
                            ? load_checkpoint(*group, path, *master_, &optimizer_, stream)
                            : load_checkpoint(path, *master_, &optimizer_, stream);
  TL_CHECK(info.optimizer_state == CheckpointInfo::OptimizerState::Restored, InvalidArgument,
           "cannot resume from " << path << ": it holds no optimizer state");
  // Every rank holds rank 0's bits now, so every rank reaches the same verdict.
  const auto expected_sum = info.metadata.find(kChecksumKey);
  TL_CHECK(expected_sum != info.metadata.end() &&
               expected_sum->second == checksum(*master_, optimizer_, stream),
           IoError,
           "cannot resume from " << path
                                 << ": its data does not match its checksum (a corrupt file); the "
                                    "trainer's state is undefined until another restore");
  skipped_steps_ = std::stoll(info.metadata.at(kSkippedKey));
  // A state saved under another precision (or before fp16 existed) has no loss
  // scale: an fp16 run then starts from GradScaler's initial scale.
  loss_scale_ = LossScale(loss_scale_.enabled(), loss_scale_.growth_interval());
  const auto scale = info.metadata.find(kLossScaleKey);
  const auto clean = info.metadata.find(kCleanStepsKey);
  if (loss_scale_.enabled() && scale != info.metadata.end() && clean != info.metadata.end()) {
    try {
      loss_scale_.restore(std::stod(scale->second), std::stoll(clean->second));
    } catch (const std::exception&) {  // std::stod's, std::stoll's, restore's
      TL_THROW(IoError, "cannot resume from "
                            << path << ": its loss scale '" << scale->second << "' after '"
                            << clean->second
                            << "' clean steps is not a positive power of two after a count "
                               ">= 0 (a corrupt file); the trainer's state is undefined until "
                               "another restore");
    }
  }
  broadcast();
  return info;
}

}  // namespace towerlab
