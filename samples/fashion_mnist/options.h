// Command-line and YAML options of the fashion_mnist sample. A YAML file given with
// --config sets the same keys as the flags (and the seeds' n_gpus); flags given on
// the command line override it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sample {

struct Options {
  std::string devices;        // "cpu,cpu", "cuda:0,cuda:1"; empty = the default
  std::optional<int> n_gpus;  // the seeds' key: towers on cuda:0 .. cuda:n-1
  std::string master = "cpu";
  std::string batchnorm = "local";          // local | sync
  std::string batchnorm_stats = "average";  // average | tower0
  int epochs = 5;
  std::int64_t batch = 128;
  std::string optimizer = "adam";
  double lr = 1e-3;
  std::string schedule = "cosine";  // cosine (from lr to 0 over every step of the run) | constant
  double weight_decay = 0.0;  // L2 regularization coefficient (seed 000's regularization losses)
  std::uint64_t seed = 1;
  std::string numeric_guard = "stop";  // stop | skip | off (parallel/trainer.h NumericGuard)
  std::int64_t steps = 0;              // cap on steps per epoch; 0 = the whole epoch
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string save, load, metrics, trace, summaries;
  bool eval_only = false;
  bool log_placement = false;
  bool soft_placement = false;
  int progress_every = 50;
};

// Parses argv (and the --config file). Returns the exit code to stop with (0 for
// --help) or nothing to go on. Errors are printed to stderr.
std::optional<int> parse_options(int argc, char** argv, Options& options);

}  // namespace sample
