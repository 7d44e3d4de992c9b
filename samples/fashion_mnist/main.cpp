// fashion_mnist: trains a model on Fashion-MNIST with tower parallelism: FashionNet
// (the default), an MLP with dropout, ResNet-20 or a small vision transformer (--model;
// models/, docs/models.md).
//
//   fashion_mnist --devices cpu,cpu --epochs 5 --batch 128 --optimizer adam --lr 1e-3
//   fashion_mnist --model resnet --batchnorm sync --epochs 10
//
// Each step splits the batch among the towers, runs every tower's forward and
// backward on its own thread and stream, averages the gradients with the ring
// all-reduce and updates the master variables (parallel/trainer.h). It prints
// progress, a summary per epoch, and exits non-zero when training diverges (3) or
// the input is bad (2, with one line that says what; options.h lists what is
// checked before any work).
//
// Under mpirun every rank runs this program on the same global batches and the
// ranks train one model (parallel/cluster.h): `mpirun -np 4 fashion_mnist
// --devices cpu,cpu`. Rank 0 alone prints and writes summaries, metrics,
// checkpoints and the trace (which holds every rank's rows); a checkpoint loads
// through rank 0. Errors come from every rank.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "engine/atomic_file.h"
#include "models/fashion_net.h"
#include "models/mlp.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "options.h"
#include "resume.h"
#include "towerlab.h"

using namespace towerlab;

namespace {

std::vector<Device> choose_devices(const sample::Options& o, const Cluster& cluster) {
  if (o.n_gpus) {  // checked positive by parse_options
    std::vector<Device> devices;
    for (int i = 0; i < *o.n_gpus; ++i) devices.push_back(Device::cuda(i));
    return devices;
  }
  if (!o.devices.empty()) return parse_device_list(o.devices);
  if (cluster.size() > 1 && cuda_device_count() > 0) return {cluster.default_device()};
  if (cuda_device_count() > 0) {
    std::vector<Device> devices;
    for (int i = 0; i < cuda_device_count(); ++i) devices.push_back(Device::cuda(i));
    return devices;
  }
  return {Device::cpu(), Device::cpu()};
}

std::string join(const std::vector<Device>& devices) {
  std::string s;
  for (const Device& d : devices) s += (s.empty() ? "" : ",") + d.str();
  return s;
}

// The shortest text that reads back as the same double.
std::string exact(double v) {
  char buffer[32];
  return std::string(buffer, std::to_chars(buffer, buffer + sizeof buffer, v).ptr);
}

// The resume tests' controls (resume.h): forget a part of the restored state, so
// that the test can show that the result then differs.
void forget_for_a_control(Trainer& trainer, sample::Position& at) {
  const std::string part = sample::resume_without();
  if (part == "data_position") {
    at.epoch_step = 0;
    at.epoch_loss_sum = 0.0;
    at.epoch_images = 0;
  } else if (part == "optimizer_step") {
    Optimizer& optimizer = trainer.optimizer();
    const std::map<std::string, Tensor> slots = optimizer.slots();  // restore() replaces them
    optimizer.restore(slots, 0, trainer.master(), default_stream(trainer.master().device()));
    trainer.broadcast();  // a sharded master's slices take it from the host copy
  }
}

// The model --model names (options.h checked the name), declaring its variables in
// `vars`, and its name in messages and checkpoints.
struct Model {
  Sequential net;
  std::string title;
};
Model make_model(const std::string& name, VariableSet& vars) {
  if (name == "mlp") return {models::mlp(vars), "MLP"};
  if (name == "resnet") return {models::resnet(vars), "ResNet-20"};
  if (name == "vit") return {models::vit(vars), "ViT"};
  return {models::fashion_net(vars), "FashionNet"};
}

// The first n images of a data set (--test-samples), sharing its storage.
FashionMnist first_images(const FashionMnist& data, std::int64_t n) {
  return {data.images.slice(0, n), data.labels.slice(0, n),
          std::vector<std::uint8_t>(data.raw_labels.begin(), data.raw_labels.begin() + n)};
}

// Accuracy of the model on a dataset, in inference mode, batch by batch. Each rank
// counts its own rows of every batch; the counts are summed over the ranks. With
// `predictions` (one process only), also writes the logits [N,10] and labels [N]
// there (safetensors), for comparing with another framework's model on the same images.
double accuracy(Trainer& trainer, const FashionMnist& data, std::int64_t batch_size,
                ProcessGroup& group, const std::string& model,
                const std::string& predictions = "") {
  Batcher batcher(data.images, data.labels, batch_size, 0, Order::Sequential);
  Batch batch;
  std::int64_t correct = 0;
  std::vector<float> all_logits;
  while (batcher.next(batch)) {
    const StepResult r = trainer.evaluate({batch.images, batch.labels});
    if (r.outputs.empty() || r.slices.empty()) continue;  // a rank without rows
    const auto logits = r.outputs[0].to_host<float>();    // [rows of this rank, 10]
    const auto labels = batch.labels.to_host<float>();
    const std::int64_t first = r.slices.front().begin;
    for (std::int64_t i = 0; i < std::int64_t(logits.size() / 10); ++i) {
      const float* row = logits.data() + i * 10;
      const auto best = std::max_element(row, row + 10) - row;
      correct += best == static_cast<std::int64_t>(labels[std::size_t(first + i)]);
    }
    if (!predictions.empty()) all_logits.insert(all_logits.end(), logits.begin(), logits.end());
  }
  if (!predictions.empty()) {
    const Stream& cpu = default_stream(Device::cpu());
    save_safetensors(predictions,
                     {{"logits", Tensor::from_host<float>(all_logits, {data.size(), 10}, cpu)},
                      {"labels", data.labels}},
                     {{"model", model}});
  }
  double total = double(correct);
  group.allreduce_sum(std::span<double>(&total, 1), "test accuracy: correct predictions");
  return total / double(data.size());
}

int run(const sample::Options& o) {
  if (!o.checkpoint_dir.empty()) sample::stop_on_sigterm();  // before the Cluster: see resume.h
  Cluster cluster;
  TL_CHECK(o.predictions.empty() || cluster.size() == 1, InvalidArgument,
           "--predictions " << o.predictions << ": needs one process (this job has "
                            << cluster.size() << " ranks, each holding only its own rows)");
  // The other ranks take the same steps; their progress would repeat rank 0's.
  const bool reporting = cluster.rank() == 0;
  if (!reporting) std::freopen("/dev/null", "w", stdout);
  TrainerOptions options;
  options.devices = choose_devices(o, cluster);
  options.process_group = &cluster;
  if (o.master == "sharded") {
    options.master_placement = MasterPlacement::Sharded;
  } else if (!o.master.empty()) {
    options.master = Device::parse(o.master);
  }
  options.batchnorm_stats =
      o.batchnorm_stats == "tower0" ? BatchNormStats::Tower0 : BatchNormStats::Average;
  options.batchnorm = o.batchnorm == "sync" ? BatchNormMode::Sync : BatchNormMode::Local;
  options.precision = o.precision == "bf16"   ? Precision::Bf16
                      : o.precision == "fp16" ? Precision::Fp16
                      : o.precision == "tf32" ? Precision::Tf32
                                              : Precision::Fp32;
  options.reduce_dtype = o.reduce_dtype == "bf16" ? DType::BFloat16 : DType::Float32;
  options.soft_placement = o.soft_placement;
  options.log_placement = o.log_placement;
  options.seed = o.seed;
  options.clip_grad_norm = o.clip_grad_norm;
  options.numeric_guard = o.numeric_guard == "skip"  ? NumericGuard::Skip
                          : o.numeric_guard == "off" ? NumericGuard::Off
                                                     : NumericGuard::Stop;
  if (o.bucket_mib) options.bucket_bytes = *o.bucket_mib << 20;
  options.cross_process = o.cross_process == "nccl"          ? CrossProcessPath::Nccl
                          : o.cross_process == "host-staged" ? CrossProcessPath::HostStaged
                                                             : CrossProcessPath::Auto;

  const FashionMnist train = load_fashion_mnist(o.data, Split::Train);
  FashionMnist test = load_fashion_mnist(o.data, Split::Test);
  sample::check_against_data(o, train.size(), test.size());
  if (o.test_samples) test = first_images(test, *o.test_samples);

  VariableSet vars;
  const Model model = make_model(o.model, vars);
  const Sequential& net = model.net;
  const double weight_decay = o.weight_decay, label_smoothing = o.label_smoothing;
  TowerFn tower_fn = [&net, weight_decay, label_smoothing](const Tower& tower,
                                                           const std::vector<Tensor>& batch) {
    Context ctx = tower.context();
    Var logits = net(ctx, tower.input(batch[0], "images"));
    Var loss = ag::softmax_cross_entropy(logits, tower.input(batch[1], "labels"), Reduction::Mean,
                                         nullptr, label_smoothing);
    Var reg = l2_regularization(ctx, weight_decay);
    Var total = reg.defined() ? ag::add_n({loss, reg}) : loss;
    return TowerResult{total, {logits}, {{"cross_entropy", loss}}};
  };
  Batcher batcher(train.images, train.labels, o.batch, o.seed);
  const std::int64_t steps_per_epoch = sample::steps_per_epoch(o, train.size());
  const auto [trace_first, trace_last] = sample::trace_range(o, train.size());
  // The cosine ends at 0 with the run: it counts the steps after the warmup.
  const std::int64_t after_warmup =
      std::max<std::int64_t>(steps_per_epoch * o.epochs - o.warmup, 1);
  const LearningRate lr = (o.schedule == "cosine" ? LearningRate::cosine(o.lr, after_warmup)
                                                  : LearningRate::constant(o.lr))
                              .with_warmup(o.warmup);
  Trainer trainer(vars, tower_fn, Optimizer::by_name(o.optimizer, lr), options);
  std::printf("%s: %lld parameters; %zu tower(s) on %s; master on %s; batch %lld\n",
              model.title.c_str(), static_cast<long long>(vars.trainable_numel()),
              trainer.num_towers(), join(trainer.devices()).c_str(),
              trainer.master_placement() == MasterPlacement::Sharded
                  ? "every tower (sharded)"
                  : trainer.master().device().str().c_str(),
              static_cast<long long>(o.batch));
  if (o.precision == "tf32") {
    const std::vector<Device>& devices = trainer.devices();
    if (std::any_of(devices.begin(), devices.end(), [](Device d) { return d.is_cuda(); })) {
      std::printf(
          "precision tf32: matmul, linear and convolutions on TF32 tensor cores on the CUDA "
          "towers (operands rounded to 10 mantissa bits, float32 sums); CPU towers fp32\n");
    } else {
      std::printf("precision tf32: the CPU has no TF32 arithmetic, so these CPU towers run fp32\n");
    }
  } else if (o.precision == "bf16") {
    std::printf(
        "precision bf16: bfloat16 GEMMs and convolutions; float32 sums, master and "
        "gradients (docs/precision.md)\n");
  } else if (o.precision == "fp16") {
    std::printf(
        "precision fp16: float16 GEMMs and convolutions with dynamic loss scaling; float32 "
        "sums, master and gradients (docs/precision.md)\n");
  }
  if (!o.load.empty()) {
    const CheckpointInfo info = load_checkpoint(
        cluster, o.load, trainer.master(), o.eval_only ? nullptr : &trainer.optimizer(),
        default_stream(trainer.master().device()),
        o.load_partial ? CheckpointMatch::Partial : CheckpointMatch::Exact);
    trainer.broadcast();
    std::printf("loaded %s\n", info.summary(o.load).c_str());
  }

  nlohmann::json metrics{
      {"model", o.model},      {"devices", join(trainer.devices())}, {"epochs", 0},
      {"batch", o.batch},      {"optimizer", o.optimizer},           {"lr", o.lr},
      {"schedule", o.schedule}};
  metrics["precision"] = o.precision;
  metrics["reduce_dtype"] = o.reduce_dtype;
  if (o.eval_only) {
    const double acc = accuracy(trainer, test, 1000, cluster, model.title, o.predictions);
    std::printf("test accuracy %.4f\n", acc);
    metrics["test_accuracy"] = acc;
  } else {
    // Where training starts: the newest checkpoint of --checkpoint-dir, if any.
    sample::Position at;
    std::unique_ptr<sample::CheckpointDir> checkpoints;
    // What changes a step beyond the trainer's fingerprint: a checkpoint of a run
    // that differs in them is refused.
    const std::map<std::string, std::string> run_keys{
        {"run/batch", std::to_string(o.batch)},
        {"run/steps_per_epoch", std::to_string(steps_per_epoch)},
        {"run/weight_decay", exact(o.weight_decay)},
        {"run/data", std::to_string(train.size()) + " training images"},
        {"model", model.title}};
    if (!o.checkpoint_dir.empty()) {
      checkpoints = std::make_unique<sample::CheckpointDir>(o.checkpoint_dir, o.keep, cluster);
      sample::pause_saves_if_asked(*checkpoints);
      if (auto restored = checkpoints->restore_newest(trainer, run_keys)) {
        at = restored->position;
        if (at.epoch >= o.epochs) {
          std::printf("%s: the run has finished (%d epochs, %lld steps); nothing to do\n",
                      restored->path.c_str(), o.epochs, static_cast<long long>(at.global_step));
          return 0;
        }
        std::printf("resuming from %s (epoch %lld, step %lld of %lld)\n", restored->path.c_str(),
                    static_cast<long long>(at.epoch + 1), static_cast<long long>(at.epoch_step),
                    static_cast<long long>(steps_per_epoch));
        forget_for_a_control(trainer, at);
      }
    }
    std::unique_ptr<SummaryWriter> summaries;
    if (!o.summaries.empty() && reporting) {
      summaries = std::make_unique<SummaryWriter>(o.summaries, at.summaries_bytes);
    }
    // Saves `here` (collective) when --checkpoint-dir is given and `due`, or when a
    // SIGTERM asked to stop; true when the run must then stop.
    const auto checkpoint = [&](sample::Position here, bool due) {
      if (!checkpoints) return false;
      const bool stop = sample::stop_requested(cluster);
      if (!due && !stop) return false;
      here.summaries_bytes = summaries ? summaries->bytes() : 0;
      const std::string path = checkpoints->save(trainer, here, run_keys);
      if (stop) {
        std::fprintf(stderr,
                     "fashion_mnist: preempted (SIGTERM) after step %lld: checkpoint %s; run the "
                     "same command to resume\n",
                     static_cast<long long>(here.global_step), path.c_str());
        sample::bound_the_exit();
      }
      return stop;
    };
    const auto due = [&](std::int64_t global_step) {
      return o.checkpoint_every > 0 && global_step % o.checkpoint_every == 0;
    };
    Trace trace;
    double images_per_second = 0.0, train_loss = at.train_loss, test_acc = at.test_accuracy;
    for (auto epoch = at.epoch; epoch < o.epochs; ++epoch) {
      batcher.start_epoch(std::uint64_t(epoch));
      Batch batch;
      const bool resumed = epoch == at.epoch;
      std::int64_t step = resumed ? at.epoch_step : 0;
      double loss_sum = resumed ? at.epoch_loss_sum : 0.0;
      std::int64_t images = resumed ? at.epoch_images : 0;
      for (std::int64_t done = 0; done < step; ++done) batcher.next(batch);  // taken before
      const auto start = std::chrono::steady_clock::now();
      auto window = start;
      std::int64_t window_images = 0, epoch_images = 0;
      while (step < steps_per_epoch && batcher.next(batch)) {
        const std::int64_t global_step = epoch * steps_per_epoch + step + 1;
        const bool tracing =
            !o.trace.empty() && global_step >= trace_first && global_step <= trace_last;
        if (tracing) {
          trace.set_step(global_step);
          trainer.set_trace(&trace);
        }
        const StepResult r = trainer.step({batch.images, batch.labels});
        if (tracing) {
          trainer.set_trace(nullptr);  // the test-set evaluation between epochs is not traced
          if (global_step == trace_last) trace.write(o.trace, cluster);  // every rank's rows
        }
        if (!std::isfinite(r.loss) && !r.skipped) {  // reached with --numeric-guard off
          std::fprintf(stderr,
                       "fashion_mnist: training diverged at epoch %lld step %lld (loss %g)\n",
                       static_cast<long long>(epoch + 1), static_cast<long long>(step), r.loss);
          return 3;
        }
        ++step;
        sample::kill_if_asked(global_step, cluster.rank());
        sample::pause_if_asked(global_step, cluster.rank());
        // --numeric-guard skip (the trainer logged why), or fp16's overflow.
        if (!r.skipped) {
          loss_sum += r.loss * double(r.samples);
          images += r.samples;
          epoch_images += r.samples;
          window_images += r.samples;
          if (summaries) {
            // Rank 0 alone: steps() and learning_rate() gather nothing (optimizer()
            // across processes with a sharded master would).
            summaries->write(trainer.steps(), {{"loss", r.loss},
                                               {"cross_entropy", r.logs.at("cross_entropy")},
                                               {"lr", trainer.learning_rate()}});
          }
        }
        if (o.progress_every > 0 && step % o.progress_every == 0) {
          const auto now = std::chrono::steady_clock::now();
          const double secs = std::chrono::duration<double>(now - window).count();
          std::printf("  epoch %lld step %lld/%lld  loss %.4f  %.0f images/s",
                      static_cast<long long>(epoch + 1), static_cast<long long>(step),
                      static_cast<long long>(steps_per_epoch), r.loss,
                      double(window_images) / secs);
          if (o.precision == "fp16") {  // the scale this step used
            std::printf("  loss scale %g%s", r.loss_scale,
                        r.overflow ? " (overflow: skipped)" : "");
          }
          std::printf("\n");
          std::fflush(stdout);
          window = now;
          window_images = 0;
        }
        if (step < steps_per_epoch) {  // the epoch's last step checkpoints after its evaluation
          sample::Position mid{epoch, step, loss_sum, images, 0, train_loss, test_acc, global_step};
          if (checkpoint(mid, due(global_step))) return sample::kPreempted;
        }
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      images_per_second = double(epoch_images) / secs;
      train_loss = loss_sum / double(std::max<std::int64_t>(images, 1));
      const bool last_epoch = epoch + 1 == o.epochs;
      test_acc =
          accuracy(trainer, test, 1000, cluster, model.title, last_epoch ? o.predictions : "");
      std::printf(
          "epoch %lld: train loss %.4f, test accuracy %.4f, %.0f images/s (%lld steps, %.1f s)\n",
          static_cast<long long>(epoch + 1), train_loss, test_acc, images_per_second,
          static_cast<long long>(step), secs);
      std::fflush(stdout);
      if (!o.save.empty()) {
        save_checkpoint(cluster, o.save, trainer.master(), &trainer.optimizer(),
                        {{"epoch", std::to_string(epoch + 1)}, {"model", model.title}});
      }
      const std::int64_t global_step = (epoch + 1) * steps_per_epoch;
      sample::Position end{epoch + 1, 0, 0.0, 0, 0, train_loss, test_acc, global_step};
      if (checkpoint(end, o.checkpoint_every == 0 || due(global_step) || last_epoch) &&
          !last_epoch) {
        return sample::kPreempted;
      }
    }
    metrics["epochs"] = o.epochs;
    metrics["skipped_steps"] = trainer.skipped_steps();
    // The next step's loss scale: in the training state, so a resumed run's is the same.
    if (o.precision == "fp16") metrics["loss_scale"] = trainer.loss_scale().scale();
    metrics["train_loss"] = train_loss;
    metrics["test_accuracy"] = test_acc;
    metrics["images_per_second"] = images_per_second;
    // What holds the master's values and the optimizer's slots (docs/master_placement.md).
    for (const Trainer::MasterMemory& m : trainer.master_memory()) {
      std::printf("master memory: %s on %s: %lld bytes of values, %lld bytes of slots\n",
                  m.holder.c_str(), m.device.str().c_str(), static_cast<long long>(m.value_bytes),
                  static_cast<long long>(m.slot_bytes));
    }
  }
  if (!o.metrics.empty() && reporting) {
    const std::string text = metrics.dump(2) + "\n";
    AtomicFile file(o.metrics);
    file.write(text.data(), text.size());
    file.commit();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sample::Options options;
  if (auto code = sample::parse_options(argc, argv, options)) return *code;
  try {
    return run(options);
  } catch (const NumericError& e) {
    std::fprintf(stderr, "fashion_mnist: training diverged: %s\n", e.what());
    return 3;
  } catch (const Error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 2;
  }
}
