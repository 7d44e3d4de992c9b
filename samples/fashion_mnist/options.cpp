#include "options.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>
#include <type_traits>
#include <utility>

#include "engine/atomic_file.h"
#include "engine/device.h"
#include "engine/error.h"

namespace sample {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFooter =
    "Exit codes: 0 done; 2 bad input, with one line on stderr that names the flag (or the config "
    "key), the value and what is allowed; 3 training diverged (--numeric-guard); 4 preempted "
    "(SIGTERM): a checkpoint is in --checkpoint-dir, run the same command to resume.\n"
    "Checked before any work: every value; --eval-only needs --load and excludes --save, --trace "
    "and --summaries; --load names a readable file; each output names a file in an existing "
    "directory the sample may write in. Checked once the data is loaded, before training: the "
    "batch is at most the training set, --test-samples at most the test set. --save, --trace and "
    "--metrics are replaced whole, so a "
    "file there before survives a run that fails.";

// A value as a message quotes it: on one line, and cut short when long.
std::string quoted(const std::string& text) {
  constexpr std::size_t kShown = 32;
  std::string shown;
  for (char c : text.substr(0, kShown))
    shown += std::iscntrl(static_cast<unsigned char>(c)) ? '?' : c;
  return "'" + shown + (text.size() > kShown ? "...'" : "'");
}

// What a numeric option accepts, as a test and in words, shared by its flag and
// its config key.
template <class T>
struct Rule {
  bool (*accepts)(T);
  const char* allowed;
};

constexpr Rule<int> kPositiveInt{[](int v) { return v > 0; }, "a positive integer"};
constexpr Rule<int> kEpochs{[](int v) { return v > 0; },
                            "a positive integer (to train nothing, use --eval-only --load FILE)"};
constexpr Rule<int> kProgressEvery{[](int v) { return v >= 0; },
                                   "a non-negative integer (0: no progress lines)"};
constexpr Rule<std::int64_t> kBatch{[](std::int64_t v) { return v > 0; }, "a positive integer"};
constexpr Rule<std::int64_t> kTestSamples{[](std::int64_t v) { return v > 0; },
                                          "a positive integer (default: the whole test set)"};
constexpr Rule<std::int64_t> kSteps{[](std::int64_t v) { return v >= 0; },
                                    "a non-negative integer (0: whole epochs)"};
constexpr Rule<std::int64_t> kWarmup{[](std::int64_t v) { return v >= 0; },
                                     "a non-negative integer"};
// Bytes are MiB << 20: the bound keeps them far inside int64.
constexpr Rule<std::int64_t> kBucketMib{
    [](std::int64_t v) { return v >= 0 && v <= (std::int64_t(1) << 20); },
    "an integer from 0 (one bucket) to 1048576"};
constexpr Rule<std::int64_t> kCheckpointEvery{[](std::int64_t v) { return v >= 0; },
                                              "a non-negative integer (0: every epoch)"};
constexpr Rule<std::uint64_t> kSeed{[](std::uint64_t) { return true; }, "a non-negative integer"};
constexpr Rule<double> kLr{[](double v) { return v > 0.0 && std::isfinite(v); },
                           "a positive number"};
constexpr Rule<double> kWeightDecay{[](double v) { return v >= 0.0 && std::isfinite(v); },
                                    "a non-negative number"};
constexpr Rule<double> kLabelSmoothing{[](double v) { return v >= 0.0 && v <= 1.0; },
                                       "a number from 0 to 1"};

// The whole of `text` as a T, or nothing. An integer may be written with an
// exponent when its value is whole ("1e3"); nothing else is accepted, not even
// spaces, and a value outside T is not cut to fit.
template <class T>
std::optional<T> to_number(const std::string& text) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  T value{};
  const auto [ptr, error] = std::from_chars(begin, end, value);
  if (error == std::errc() && ptr == end) return value;
  if constexpr (std::is_integral_v<T>) {
    double real = 0.0;
    const auto [real_ptr, real_error] = std::from_chars(begin, end, real);
    const double lowest = double(std::numeric_limits<T>::lowest());
    const double beyond = std::ldexp(1.0, std::numeric_limits<T>::digits);  // max + 1, exactly
    if (real_error == std::errc() && real_ptr == end && real == std::floor(real) &&
        real >= lowest && real < beyond) {
      return static_cast<T>(real);
    }
  }
  return std::nullopt;
}

// The one message of a bad value; `name` is the flag or the config key.
[[noreturn]] void refuse(const std::string& name, const std::string& allowed,
                         const std::string& got) {
  TL_THROW(InvalidArgument, name << " must be " << allowed << ", got " << got);
}

template <class T>
T parse_number(const std::string& name, const std::string& text, const Rule<T>& rule) {
  const std::optional<T> value = to_number<T>(text);
  if (!value || !rule.accepts(*value)) refuse(name, rule.allowed, quoted(text));
  return *value;
}

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string joined;
  for (const std::string& part : parts) joined += (joined.empty() ? "" : separator) + part;
  return joined;
}

// One option: its config key (the flag is "--" and the key with '-' for '_'), and
// how it sets Options from text, checking it. The flags and the config file share
// it, so a value is read and checked the same way wherever it comes from, and the
// message names the flag or the key it came from.
struct Field {
  std::string key;
  std::string help;
  std::string type;          // shown by --help; empty for a switch (a flag without a value)
  std::string allowed;       // in words, for a config value that is not a plain value
  std::string default_text;  // shown by --help; empty: none
  std::function<void(const std::string& name, const std::string& text)> set;
};

std::string flag_of(const std::string& key) {
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

template <class T>
std::string text_of(const T& value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

template <class T>
std::string text_of(const std::optional<T>& value) {
  return value ? text_of(*value) : std::string();
}

template <class T, class Target>
Field number(std::string key, Target& target, const Rule<T>& rule, std::string help) {
  return {std::move(key),
          std::move(help),
          std::is_integral_v<T> ? "INT" : "NUMBER",
          rule.allowed,
          text_of(target),
          [&target, rule](const std::string& name, const std::string& text) {
            target = parse_number(name, text, rule);
          }};
}

Field choice(std::string key, std::string& target, std::vector<std::string> choices,
             std::string help) {
  std::string allowed = "one of " + join(choices, ", ");
  std::string type = "{" + join(choices, ",") + "}";
  return {std::move(key),
          std::move(help),
          std::move(type),
          allowed,
          target,
          [&target, choices, allowed](const std::string& name, const std::string& text) {
            if (std::find(choices.begin(), choices.end(), text) == choices.end()) {
              refuse(name, allowed, quoted(text));
            }
            target = text;
          }};
}

Field path(std::string key, std::string& target, std::string type, std::string help) {
  std::string allowed = type == "DIR" ? "a directory" : "a file name";
  return {
      std::move(key),  std::move(help),
      std::move(type), std::move(allowed),
      target,          [&target](const std::string&, const std::string& text) { target = text; }};
}

// Device lists are checked for their form here; whether the devices are present is
// the trainer's check, once it starts.
Field devices(std::string key, std::string& target, std::string type, std::string help, bool list) {
  return {std::move(key),
          std::move(help),
          std::move(type),
          "a device name",
          target,
          [&target, list](const std::string& name, const std::string& text) {
            try {
              if (list) {
                towerlab::parse_device_list(text);
              } else {
                towerlab::Device::parse(text);
              }
            } catch (const towerlab::Error&) {
              towerlab::rethrow_with_context(name + ": ");
            }
            target = text;
          }};
}

// A device, or "sharded": the master split across the towers (MasterPlacement::Sharded).
Field master(std::string& target) {
  return {"master",
          "Device of the master variables, or sharded: each tower holds and updates one slice "
          "of them and of the optimizer's slots (default: the first tower's device)",
          "DEVICE|sharded",
          "a device name or sharded",
          target,
          [&target](const std::string& name, const std::string& text) {
            if (text != "sharded") {
              try {
                towerlab::Device::parse(text);
              } catch (const towerlab::Error&) {
                towerlab::rethrow_with_context(name + ": ");
              }
            }
            target = text;
          }};
}

// The precision policy (parallel/precision.h): fp32, tf32, bf16 or fp16.
Field precision(std::string& target) {
  static const std::string allowed = "one of fp32, tf32, bf16, fp16";
  return {"precision",
          "Precision policy: fp32; bf16 (bfloat16 GEMMs and convolutions with float32 sums, "
          "float32 master and gradients; docs/precision.md); fp16 (the same in float16, with "
          "dynamic loss scaling); tf32 (float32 tensors, matmul, linear and convolutions on "
          "TF32 tensor cores on CUDA towers; fp32 on CPU towers)",
          "{fp32,tf32,bf16,fp16}",
          allowed,
          target,
          [&target](const std::string& name, const std::string& text) {
            if (text != "fp32" && text != "tf32" && text != "bf16" && text != "fp16") {
              refuse(name, allowed, quoted(text));
            }
            target = text;
          }};
}

// FIRST:LAST, or one step N (N:N); steps count from 1.
Field step_range(std::string key, std::optional<std::pair<std::int64_t, std::int64_t>>& target,
                 std::string help) {
  static const std::string allowed =
      "FIRST:LAST with 1 <= FIRST <= LAST (steps count from 1), or one step N";
  return {std::move(key),
          std::move(help),
          "FIRST:LAST",
          allowed,
          "",
          [&target](const std::string& name, const std::string& text) {
            const std::size_t colon = text.find(':');
            const std::string first_text = text.substr(0, colon);
            const std::string last_text =
                colon == std::string::npos ? first_text : text.substr(colon + 1);
            const auto first = to_number<std::int64_t>(first_text);
            const auto last = to_number<std::int64_t>(last_text);
            if (!first || !last || *first < 1 || *last < *first) {
              refuse(name, allowed, quoted(text));
            }
            target = std::pair{*first, *last};
          }};
}

Field on_off(std::string key, bool& target, std::string help) {
  return {std::move(key),
          std::move(help),
          "",
          "true or false",
          "",
          [&target](const std::string& name, const std::string& text) {
            std::string lower = text;
            for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
            if (lower == "true" || lower == "yes" || lower == "on") {
              target = true;
            } else if (lower == "false" || lower == "no" || lower == "off") {
              target = false;
            } else {
              refuse(name, "true or false", quoted(text));
            }
          }};
}

std::vector<Field> fields(Options& o) {
  return {
      choice("model", o.model, {"fashion_net", "mlp", "resnet", "vit"},
             "Model: FashionNet (the CNN), an MLP with dropout, ResNet-20 or a small vision "
             "transformer (docs/models.md)"),
      devices("devices", o.devices, "LIST",
              "Towers, comma-separated: cpu,cpu or cuda:0,cuda:1 (default: every GPU, else "
              "cpu,cpu)",
              true),
      number("n_gpus", o.n_gpus, kPositiveInt, "Towers on cuda:0 .. cuda:N-1 (the seeds' n_gpus)"),
      master(o.master),
      choice("batchnorm", o.batchnorm, {"local", "sync"}, "Batch norm across towers"),
      precision(o.precision),
      choice("reduce_dtype", o.reduce_dtype, {"fp32", "bf16"},
             "What the gradient's reduction carries between towers and processes: fp32, or "
             "bf16 (each tower's gradient rounded to bfloat16 once, summed in float32 in tower "
             "order: half the bytes of the reduce-scatter; docs/precision.md)"),
      choice("batchnorm_stats", o.batchnorm_stats, {"average", "tower0"},
             "Moving statistics: average (sample-weighted) or tower0"),
      number("epochs", o.epochs, kEpochs, "Passes over the training set"),
      number("batch", o.batch, kBatch,
             "Batch size, split among the towers; at most the training set"),
      choice("optimizer", o.optimizer, {"adam", "adamw", "sgd", "momentum", "rmsprop"},
             "Optimizer"),
      number("lr", o.lr, kLr, "Learning rate"),
      choice("schedule", o.schedule, {"cosine", "constant"},
             "Learning rate: cosine from --lr down to 0 over the whole run, or constant"),
      number("warmup", o.warmup, kWarmup,
             "Steps of linear learning-rate warmup before the schedule (0: none)"),
      number("weight_decay", o.weight_decay, kWeightDecay, "L2 regularization coefficient"),
      number("clip_grad_norm", o.clip_grad_norm, kWeightDecay,
             "Clip the averaged gradient to this global norm (0: off)"),
      number("label_smoothing", o.label_smoothing, kLabelSmoothing,
             "Label smoothing E of the cross-entropy: targets (1-E) one-hot + E/10 (0: off)"),
      number("seed", o.seed, kSeed, "Seed of the initial weights and the batch order"),
      choice("numeric_guard", o.numeric_guard, {"stop", "skip", "off"},
             "NaN or infinity in the loss or gradient: stop (exit 3 naming the step and "
             "variable), skip the step, or off"),
      number("steps", o.steps, kSteps, "Cap on steps per epoch (0: whole epochs)"),
      number("test_samples", o.test_samples, kTestSamples,
             "Evaluate only the first N test images (default: the whole test set)"),
      path("data", o.data, "DIR", "Fashion-MNIST directory"),
      path("save", o.save, "FILE", "Checkpoint to write after each epoch (safetensors)"),
      path("checkpoint_dir", o.checkpoint_dir, "DIR",
           "Training-state checkpoints: written there, and the same command resumes from the "
           "newest (exit 4 after SIGTERM: preempted, resumable)"),
      number("checkpoint_every", o.checkpoint_every, kCheckpointEvery,
             "Steps between checkpoints in --checkpoint-dir (0: every epoch); the last step "
             "always writes one"),
      number("keep", o.keep, kPositiveInt, "Checkpoints kept in --checkpoint-dir"),
      path("load", o.load, "FILE",
           "Checkpoint or plain weights (safetensors named like the variables) to start from"),
      on_off("load_partial", o.load_partial,
             "--load may lack variables (they keep their initial values) and hold others "
             "(skipped); both are listed"),
      path("predictions", o.predictions, "FILE",
           "Safetensors file of the final test-set logits [N,10] and labels (N: --test-samples)"),
      path("metrics", o.metrics, "FILE", "JSON file for the final metrics"),
      path("trace", o.trace, "FILE",
           "Chrome trace JSON of the --trace-steps (Perfetto; scripts/trace_png.py draws it)"),
      step_range("trace_steps", o.trace_steps,
                 "Steps --trace records, from 1 across epochs (default: the second, or the first "
                 "of a one-step run)"),
      path("summaries", o.summaries, "FILE", "Scalar summaries per step: .csv or .jsonl"),
      on_off("eval_only", o.eval_only, "Only evaluate the --load checkpoint on the test set"),
      on_off("log_placement", o.log_placement, "Print where variables and towers run"),
      on_off("soft_placement", o.soft_placement, "Fall back to a present device with a warning"),
      number("progress_every", o.progress_every, kProgressEvery, "Steps between progress lines"),
      number(
          "bucket_mib", o.bucket_mib, kBucketMib,
          "Gradient buckets of at least N MiB, each reduced while the backward goes on (0: "
          "one bucket after the backward; default: the trainer's, 25); the same bits either way"),
      choice("cross_process", o.cross_process, {"auto", "host-staged", "nccl"},
             "Gradients between processes: NCCL when every rank can (auto), always through the "
             "host (host-staged), or NCCL or an error (nccl)"),
  };
}

YAML::Node load_yaml(const std::string& path) {
  std::ifstream in(path);
  if (!in) TL_THROW(IoError, "cannot read the file: " << towerlab::os_error_text(errno));
  try {
    return YAML::Load(in);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) TL_THROW(IoError, "not YAML: " << e.msg);
    TL_THROW(IoError, "line " << e.mark.line + 1 << ", column " << e.mark.column + 1
                              << ": not YAML: " << e.msg);
  }
}

// The text of a config value: a scalar as written, or for the device list also a
// YAML list of names (the seeds write one). Anything else is refused, saying what
// it was.
std::string value_text(const Field& field, const YAML::Node& value) {
  if (value.IsScalar()) return value.Scalar();
  if (value.IsSequence() && field.key == "devices") {
    std::vector<std::string> names;
    for (const YAML::Node& name : value) {
      if (!name.IsScalar()) refuse(field.key, "a list of device names", "a nested list or mapping");
      names.push_back(name.Scalar());
    }
    return join(names, ",");
  }
  refuse(field.key, field.allowed,
         value.IsSequence() ? "a list"
         : value.IsMap()    ? "a mapping"
                            : "no value");
}

// Applies the keys of a YAML config, except those given as flags, which override
// them. Messages start with "config PATH: ".
void apply_config(const std::string& path, const CLI::App& app, const std::vector<Field>& fields) {
  try {
    const YAML::Node config = load_yaml(path);
    if (config.IsNull()) return;  // an empty file sets nothing
    TL_CHECK(config.IsMap(), InvalidArgument, "expected a mapping of keys to values");
    for (const auto& item : config) {
      TL_CHECK(item.first.IsScalar(), InvalidArgument, "expected keys that are option names");
      const std::string key = item.first.Scalar();
      const auto field =
          std::find_if(fields.begin(), fields.end(), [&](const Field& f) { return f.key == key; });
      TL_CHECK(field != fields.end(), InvalidArgument, "unknown key " << quoted(key));
      if (app.get_option(flag_of(key))->count() > 0) continue;
      field->set(key, value_text(*field, item.second));
    }
  } catch (const towerlab::Error&) {
    towerlab::rethrow_with_context("config " + path + ": ");
  }
}

// Options that make no sense together.
void check_combinations(const Options& o) {
  TL_CHECK(!o.load_partial || !o.load.empty(), InvalidArgument,
           "--load-partial needs --load FILE: it says how closely that file must match the model");
  TL_CHECK(!o.trace_steps || !o.trace.empty(), InvalidArgument,
           "--trace-steps needs --trace FILE to write the trace to");
  TL_CHECK(o.checkpoint_every == 0 || !o.checkpoint_dir.empty(), InvalidArgument,
           "--checkpoint-every needs --checkpoint-dir DIR to write the checkpoints in");
  TL_CHECK(o.keep == 2 || !o.checkpoint_dir.empty(), InvalidArgument,
           "--keep needs --checkpoint-dir DIR: it says how many checkpoints stay there");
  if (!o.eval_only) return;
  TL_CHECK(!o.load.empty(), InvalidArgument,
           "--eval-only needs --load FILE: without it the test set would be scored with the "
           "random initial weights");
  for (const auto& [flag, path] :
       {std::pair{"--save", &o.save}, std::pair{"--trace", &o.trace},
        std::pair{"--summaries", &o.summaries}, std::pair{"--checkpoint-dir", &o.checkpoint_dir}}) {
    TL_CHECK(path->empty(), InvalidArgument,
             "--eval-only trains nothing, so " << flag << " " << *path << " would not be written");
  }
}

void check_output(const std::string& flag, const std::string& path) {
  const fs::path target(path);
  std::error_code ignored;  // a status that cannot be read reads as "not found"
  const fs::file_status status = fs::status(target, ignored);
  TL_CHECK(target.has_filename() && !fs::is_directory(status), IoError,
           flag << " " << path << ": names a directory, not a file");
  TL_CHECK(!fs::exists(status) || fs::is_regular_file(status), IoError,
           flag << " " << path << ": is there and is not a regular file");
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::file_status dir_status = fs::status(dir, ignored);
  TL_CHECK(fs::is_directory(dir_status), IoError,
           flag << " " << path << ": "
                << (fs::exists(dir_status) ? "is not a directory: " : "no such directory: ")
                << dir.string());
  TL_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, IoError,
           flag << " " << path << ": cannot write in " << dir.string() << ": "
                << towerlab::os_error_text(errno));
}

}  // namespace

void check_paths(const Options& o) {
  if (!o.load.empty()) {
    std::error_code ignored;
    const fs::file_status status = fs::status(o.load, ignored);
    TL_CHECK(fs::is_regular_file(status), IoError,
             "--load " << o.load << ": " << (fs::exists(status) ? "not a file" : "no such file"));
    TL_CHECK(::access(o.load.c_str(), R_OK) == 0, IoError,
             "--load " << o.load << ": cannot read: " << towerlab::os_error_text(errno));
  }
  if (!o.checkpoint_dir.empty()) {  // created at start when missing, in an existing directory
    const fs::path dir(o.checkpoint_dir);
    std::error_code ignored;
    const fs::file_status status = fs::status(dir, ignored);
    const fs::path where = fs::exists(status)          ? dir
                           : dir.parent_path().empty() ? "."
                                                       : dir.parent_path();
    TL_CHECK(!fs::exists(status) || fs::is_directory(status), IoError,
             "--checkpoint-dir " << o.checkpoint_dir << ": is there and is not a directory");
    TL_CHECK(fs::is_directory(fs::status(where, ignored)), IoError,
             "--checkpoint-dir " << o.checkpoint_dir << ": no such directory: " << where.string());
    TL_CHECK(::access(where.c_str(), W_OK | X_OK) == 0, IoError,
             "--checkpoint-dir " << o.checkpoint_dir << ": cannot write in " << where.string()
                                 << ": " << towerlab::os_error_text(errno));
  }
  std::vector<std::pair<const char*, fs::path>> outputs;
  for (const auto& [flag, path] :
       {std::pair{"--save", &o.save}, std::pair{"--metrics", &o.metrics},
        std::pair{"--trace", &o.trace}, std::pair{"--summaries", &o.summaries},
        std::pair{"--predictions", &o.predictions}}) {
    if (path->empty()) continue;
    check_output(flag, *path);
    std::error_code error;
    fs::path same = fs::weakly_canonical(*path, error);
    if (error) same = fs::absolute(*path).lexically_normal();
    for (const auto& [other_flag, other] : outputs) {
      TL_CHECK(other != same, IoError,
               other_flag << " and " << flag << " name the same file " << *path);
    }
    outputs.emplace_back(flag, same);
  }
}

void check_against_data(const Options& o, std::int64_t train_size, std::int64_t test_size) {
  if (o.test_samples && *o.test_samples > test_size) {
    refuse("--test-samples", "at most the " + std::to_string(test_size) + " images of the test set",
           quoted(std::to_string(*o.test_samples)));
  }
  if (o.eval_only) return;
  if (o.batch > train_size) {
    refuse("--batch", "at most the " + std::to_string(train_size) + " images of the training set",
           quoted(std::to_string(o.batch)));
  }
  if (o.trace_steps) {
    const std::int64_t steps = std::int64_t(o.epochs) * steps_per_epoch(o, train_size);
    if (o.trace_steps->second > steps) {
      refuse("--trace-steps",
             "within the run's " + std::to_string(steps) + " steps (" + std::to_string(o.epochs) +
                 " epoch(s) of " + std::to_string(steps_per_epoch(o, train_size)) + ")",
             quoted(std::to_string(o.trace_steps->first) + ":" +
                    std::to_string(o.trace_steps->second)));
    }
  }
}

std::int64_t steps_per_epoch(const Options& o, std::int64_t train_size) {
  const std::int64_t batches = (train_size + o.batch - 1) / o.batch;
  return o.steps > 0 ? std::min(o.steps, batches) : batches;
}

std::pair<std::int64_t, std::int64_t> trace_range(const Options& o, std::int64_t train_size) {
  if (o.trace_steps) return *o.trace_steps;
  const std::int64_t step = std::int64_t(o.epochs) * steps_per_epoch(o, train_size) > 1 ? 2 : 1;
  return {step, step};
}

std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "Trains a model (FashionNet, an MLP, ResNet-20 or a ViT) on Fashion-MNIST with tower "
      "parallelism."};
  app.footer(kFooter);
  std::string config;
  app.add_option("--config", config,
                 "YAML file setting any of the options below (flags override it)")
      ->type_name("FILE");
  const std::vector<Field> all = fields(o);
  for (const Field& field : all) {
    const std::string flag = flag_of(field.key);
    if (field.type.empty()) {
      app.add_flag_function(
          flag,
          [&field, flag](std::int64_t count) { field.set(flag, count > 0 ? "true" : "false"); },
          field.help);
      continue;
    }
    CLI::Option* option = app.add_option_function<std::string>(
        flag, [&field, flag](const std::string& text) { field.set(flag, text); }, field.help);
    // The last of a repeated flag wins, so that a script can append an override.
    option->type_name(field.type)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    if (!field.default_text.empty()) option->default_str(field.default_text);
  }
  try {
    app.parse(argc, argv);
    if (!config.empty()) apply_config(config, app, all);
    check_combinations(o);
    check_paths(o);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "fashion_mnist: " << e.what() << " (--help lists the options)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace sample
