// Command-line and YAML options of the fashion_mnist sample. A YAML file given with
// --config sets the same keys as the flags (and the seeds' n_gpus); flags given on
// the command line override it.
//
// Bad input stops the sample before any work with exit code 2 and one line on
// stderr that names the flag (or the config file and key), the value and what is
// allowed: "fashion_mnist: --batch must be a positive integer, got '0'". Checked at
// once: every value, the combinations of options and the paths (check_paths). Checked
// after loading the data set, before training: the batch and --test-samples against
// the sets' sizes (check_against_data).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/fashion_net.h"  // kFashionMnistDir

namespace sample {

struct Options {
  std::string model = "fashion_net";  // fashion_net | mlp | resnet | vit (docs/models.md)
  std::string devices;                // "cpu,cpu", "cuda:0,cuda:1"; empty = the default
  std::optional<int> n_gpus;          // the seeds' key: towers on cuda:0 .. cuda:n-1
  std::string master;               // empty: the first tower's device; "sharded": across the towers
  std::string batchnorm = "local";  // local | sync
  std::string precision = "fp32";   // fp32 | tf32 | bf16 | fp16 (TrainerOptions::precision)
  std::string reduce_dtype = "fp32";        // fp32 | bf16 (TrainerOptions::reduce_dtype)
  std::string batchnorm_stats = "average";  // average | tower0
  int epochs = 5;                           // positive: --eval-only is the way to train nothing
  std::int64_t batch = 128;
  std::string optimizer = "adam";
  double lr = 1e-3;
  std::string schedule = "cosine";  // cosine (from lr to 0 over every step of the run) | constant
  std::int64_t warmup = 0;          // steps of linear warmup before the schedule (LearningRate)
  double weight_decay = 0.0;     // L2 regularization coefficient (seed 000's regularization losses)
  double clip_grad_norm = 0.0;   // clipping by the global norm; 0: off (TrainerOptions)
  double label_smoothing = 0.0;  // the cross-entropy's (kernels/loss.h); 0: one-hot targets
  std::uint64_t seed = 1;
  std::string numeric_guard = "stop";  // stop | skip | off (parallel/trainer.h NumericGuard)
  std::int64_t steps = 0;              // cap on steps per epoch; 0 = the whole epoch
  // Evaluate only the first N test images (each epoch's accuracy, --eval-only and
  // --predictions); unset: the whole test set. Slow backends (the emulated GPUs)
  // need it to finish a run.
  std::optional<std::int64_t> test_samples;
  std::string data = towerlab::models::kFashionMnistDir;
  std::string save, load, metrics, trace, summaries;
  // Resumable training (resume.h): the directory of the training-state checkpoints,
  // the steps between two of them (0: at the end of every epoch; the run's last
  // step always writes one) and how many are kept.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  int keep = 2;
  std::string predictions;    // safetensors file of the test set's final logits [N,10] and labels
  bool load_partial = false;  // --load may lack variables and hold others (both reported)
  // --trace-steps FIRST:LAST (or one step N): the steps --trace records, counted
  // from 1 across epochs. Unset: the second step (the first warms the caches and
  // the allocator), or the first when the run has one step.
  std::optional<std::pair<std::int64_t, std::int64_t>> trace_steps;
  bool eval_only = false;  // needs --load; excludes the training outputs (--save, --trace, ...)
  bool log_placement = false;
  bool soft_placement = false;
  int progress_every = 50;
  // Gradient buckets of at least this many MiB (TrainerOptions::bucket_bytes); 0: one
  // bucket, reduced after the backward; unset: the trainer's default. The same bits
  // either way; every process of a job must pass the same value.
  std::optional<std::int64_t> bucket_mib;
  // How gradients move between processes (TrainerOptions::cross_process):
  // auto | host-staged | nccl.
  std::string cross_process = "auto";
};

// Parses argv (and the --config file) and checks the values, their combinations and
// the paths. Returns the exit code to stop with (0 for --help, 2 for bad input after
// printing one line to stderr) or nothing to go on.
std::optional<int> parse_options(int argc, char** argv, Options& options);

// Checks the files before any work: --load names a regular file, and every output
// (--save, --metrics, --trace, --summaries, --predictions) names a file, not a directory, in an
// existing directory the sample may write in, and no two outputs name the same file.
// Creates and truncates nothing: --save, --trace and --metrics are later replaced
// whole (AtomicFile), so a file there before survives a run that fails. Throws
// towerlab::IoError naming the flag and the path. parse_options calls it.
void check_paths(const Options& options);

// Checks the options against the training set once it is loaded: a batch larger
// than the set is refused (towerlab::InvalidArgument naming both sizes) rather than
// cut to the set's size, because a cut batch changes the steps per epoch and the
// learning rate schedule behind the user's back, and such a batch is most often a
// typo (an extra zero, 1e12) whose memory would not fit anyway. --trace-steps
// beyond the run's last step is refused (the trace would not be written), and so is
// a --test-samples larger than the test set (evaluating fewer images than asked for
// would report an accuracy over another set than the user named).
void check_against_data(const Options& options, std::int64_t train_size, std::int64_t test_size);

// The steps of one epoch: the batches that cover the training set, capped by --steps.
std::int64_t steps_per_epoch(const Options& options, std::int64_t train_size);

// The first and last step --trace records (see Options::trace_steps).
std::pair<std::int64_t, std::int64_t> trace_range(const Options& options, std::int64_t train_size);

}  // namespace sample
