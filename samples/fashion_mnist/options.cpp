#include "options.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <initializer_list>
#include <iostream>

namespace sample {

namespace {

// Applies the keys of a YAML config to `options`, except those given as flags.
void apply_config(const std::string& path, const CLI::App& app, Options& o) {
  YAML::Node config = YAML::LoadFile(path);
  if (!config.IsMap()) throw std::runtime_error("config " + path + ": expected a mapping of keys");
  // A key without a flag of its name is reported as unknown below, not here.
  auto flag_given = [&](const std::string& flag) {
    const CLI::Option* option = app.get_option_no_throw("--" + flag);
    return option != nullptr && option->count() > 0;
  };
  for (const auto& item : config) {
    const std::string key = item.first.as<std::string>();
    const YAML::Node& v = item.second;
    std::string flag = key;
    for (char& c : flag) c = c == '_' ? '-' : c;
    if (flag_given(flag)) continue;
    if (key == "devices") {
      if (v.IsSequence()) {
        o.devices.clear();
        for (const auto& d : v) o.devices += (o.devices.empty() ? "" : ",") + d.as<std::string>();
      } else {
        o.devices = v.as<std::string>();
      }
    } else if (key == "n_gpus") {
      o.n_gpus = v.as<int>();
    } else if (key == "master") {
      o.master = v.as<std::string>();
    } else if (key == "batchnorm") {
      o.batchnorm = v.as<std::string>();
    } else if (key == "batchnorm_stats") {
      o.batchnorm_stats = v.as<std::string>();
    } else if (key == "epochs") {
      o.epochs = v.as<int>();
    } else if (key == "batch") {
      o.batch = v.as<std::int64_t>();
    } else if (key == "optimizer") {
      o.optimizer = v.as<std::string>();
    } else if (key == "lr") {
      o.lr = v.as<double>();
    } else if (key == "schedule") {
      o.schedule = v.as<std::string>();
    } else if (key == "weight_decay") {
      o.weight_decay = v.as<double>();
    } else if (key == "numeric_guard") {
      o.numeric_guard = v.as<std::string>();
    } else if (key == "seed") {
      o.seed = v.as<std::uint64_t>();
    } else if (key == "steps") {
      o.steps = v.as<std::int64_t>();
    } else if (key == "data") {
      o.data = v.as<std::string>();
    } else if (key == "save") {
      o.save = v.as<std::string>();
    } else if (key == "load") {
      o.load = v.as<std::string>();
    } else if (key == "metrics") {
      o.metrics = v.as<std::string>();
    } else if (key == "trace") {
      o.trace = v.as<std::string>();
    } else if (key == "summaries") {
      o.summaries = v.as<std::string>();
    } else if (key == "eval_only") {
      o.eval_only = v.as<bool>();
    } else if (key == "log_placement") {
      o.log_placement = v.as<bool>();
    } else if (key == "soft_placement") {
      o.soft_placement = v.as<bool>();
    } else if (key == "progress_every") {
      o.progress_every = v.as<int>();
    } else {
      throw std::runtime_error("config " + path + ": unknown key '" + key + "'");
    }
  }
}

// The ranges the flags check with CLI11 validators, checked again after the YAML
// config (which bypasses them), plus the choices among names.
void check_values(const Options& o) {
  auto fail = [](const std::string& message) { throw std::runtime_error(message); };
  auto one_of = [&](const std::string& key, const std::string& value,
                    std::initializer_list<const char*> choices) {
    std::string list;
    for (const char* c : choices) {
      if (value == c) return;
      list += (list.empty() ? "" : ", ") + std::string(c);
    }
    fail(key + " must be one of " + list + ", got '" + value + "'");
  };
  if (o.n_gpus && *o.n_gpus <= 0) fail("n_gpus must be positive, got " + std::to_string(*o.n_gpus));
  if (o.epochs < 0) fail("epochs must not be negative, got " + std::to_string(o.epochs));
  if (o.batch <= 0) fail("batch must be positive, got " + std::to_string(o.batch));
  if (!(o.lr > 0.0 && std::isfinite(o.lr)))
    fail("lr must be positive, got " + std::to_string(o.lr));
  if (!(o.weight_decay >= 0.0 && std::isfinite(o.weight_decay))) {
    fail("weight_decay must be a non-negative number, got " + std::to_string(o.weight_decay));
  }
  if (o.steps < 0) fail("steps must not be negative, got " + std::to_string(o.steps));
  if (o.progress_every < 0) {
    fail("progress_every must not be negative, got " + std::to_string(o.progress_every));
  }
  one_of("batchnorm", o.batchnorm, {"local", "sync"});
  one_of("batchnorm_stats", o.batchnorm_stats, {"average", "tower0"});
  one_of("schedule", o.schedule, {"constant", "cosine"});
  one_of("numeric_guard", o.numeric_guard, {"stop", "skip", "off"});
  one_of("optimizer", o.optimizer, {"adam", "adamw", "sgd", "momentum", "rmsprop"});
}

}  // namespace

std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{"Trains FashionNet on Fashion-MNIST with tower parallelism."};
  std::string config;
  app.add_option("--config", config,
                 "YAML file setting any of the options below (flags override it)");
  app.add_option(
      "--devices", o.devices,
      "Towers, comma-separated: cpu,cpu or cuda:0,cuda:1 (default: every GPU, else cpu,cpu)");
  app.add_option("--n-gpus", o.n_gpus, "Towers on cuda:0 .. cuda:N-1 (the seeds' n_gpus)");
  app.add_option("--master", o.master, "Device of the master variables")->capture_default_str();
  app.add_option("--batchnorm", o.batchnorm, "Batch norm across towers: local or sync")
      ->capture_default_str();
  app.add_option("--batchnorm-stats", o.batchnorm_stats,
                 "Moving statistics: average (sample-weighted) or tower0")
      ->capture_default_str();
  app.add_option("--epochs", o.epochs)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--batch", o.batch, "Batch size (split among the towers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--optimizer", o.optimizer, "adam, adamw, sgd, momentum or rmsprop")
      ->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--schedule", o.schedule,
                 "Learning rate: constant, or cosine from --lr down to 0 over the whole run")
      ->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "L2 regularization coefficient")
      ->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--numeric-guard", o.numeric_guard,
                 "NaN or infinity in the loss or gradient: stop (exit 3 naming the step and "
                 "variable), skip the step, or off")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Cap on steps per epoch (0: whole epochs)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--data", o.data, "Fashion-MNIST directory")->capture_default_str();
  app.add_option("--save", o.save, "Checkpoint to write after each epoch (safetensors)");
  app.add_option("--load", o.load, "Checkpoint to start from");
  app.add_flag("--eval-only", o.eval_only, "Only evaluate (with --load) on the test set");
  app.add_option("--metrics", o.metrics, "JSON file for the final metrics");
  app.add_option("--trace", o.trace, "Chrome trace JSON of the second training step (Perfetto)");
  app.add_option("--summaries", o.summaries, "Scalar summaries per step: .csv or .jsonl");
  app.add_flag("--log-placement", o.log_placement, "Print where variables and towers run");
  app.add_flag("--soft-placement", o.soft_placement,
               "Fall back to a present device with a warning");
  app.add_option("--progress-every", o.progress_every, "Steps between progress lines")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
    if (!config.empty()) apply_config(config, app, o);
    check_values(o);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace sample
