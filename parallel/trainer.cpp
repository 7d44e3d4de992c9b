// The Trainer (parallel/trainer.h): its construction, then one step as its phases,
// a section each, in the order Trainer::run calls them: phases 1 to 4 and 8 here,
// 5 to 7 (across processes, the guard, the update) in trainer_update.cpp. Where the
// work is placed and the placement log: trainer_placement.cpp; save_state and
// restore_state: trainer_state.cpp.
#include "parallel/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <sstream>

#include "autograd/mixed_precision.h"
#include "engine/clock.h"
#include "engine/error.h"
#include "engine/scope_exit.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "parallel/buckets.h"
#include "parallel/nccl_allreduce.h"
#include "parallel/nccl_communicator.h"
#include "parallel/process_exchange.h"
#include "parallel/process_group.h"
#include "parallel/ring_allreduce.h"
#include "parallel/sharded_master.h"
#include "parallel/sharded_nccl.h"
#include "parallel/sync_batchnorm.h"
#include "parallel/thread_team.h"
#include "parallel/trace.h"
#include "parallel/trainer_phases.h"
#include "parallel/trainer_tower.h"
#include "parallel/transfer.h"

namespace towerlab {

namespace {

// Refuses towers on the host and on GPUs together. The ring copies between
// neighbouring towers on one tower's stream, and a host tower's stream cannot issue
// a GPU copy. Checked on the request, not on the devices placed, so that a program
// is refused alike on machines with and without a GPU (soft placement would turn
// the GPU towers into host ones on the latter).
void check_tower_kinds(const std::vector<Device>& requested) {
  const auto cpu =
      std::find_if(requested.begin(), requested.end(), [](Device d) { return d.is_cpu(); });
  const auto gpu =
      std::find_if(requested.begin(), requested.end(), [](Device d) { return d.is_cuda(); });
  if (cpu == requested.end() || gpu == requested.end()) return;
  std::ostringstream list;
  for (std::size_t i = 0; i < requested.size(); ++i) list << (i ? ", " : "") << requested[i].str();
  TL_THROW(NotSupported, "Trainer: towers on "
                             << cpu->str() << " and " << gpu->str()
                             << " cannot be mixed (towers requested: " << list.str()
                             << "); put every tower on the CPU or every tower "
                                "on GPUs (the master may be on either)");
}

// A sharded master is the ring's two halves around the update, in one process.
void check_sharding(const TrainerOptions& options) {
  TL_CHECK(!options.master.has_value(), InvalidArgument,
           "Trainer: MasterPlacement::Sharded puts the master on every tower, but "
           "TrainerOptions::master names "
               << options.master->str()
               << "; leave master unset, or use MasterPlacement::OneDevice");
  TL_CHECK(options.reduction == AllReduce::Ring, InvalidArgument,
           "Trainer: MasterPlacement::Sharded needs AllReduce::Ring (its reduce-scatter and "
           "all-gather are the ring's two halves); use AllReduce::Ring, or a master on one device");
}

// The gradient's reduce dtype: float32, or bfloat16 contributions, which the
// ring's reduce-scatter rounds once and sums in float32 in tower order
// (parallel/ring_contributions.h).
void check_reduce_dtype(const TrainerOptions& options) {
  const DType dtype = options.reduce_dtype;
  TL_CHECK(dtype == DType::Float32 || dtype == DType::BFloat16, NotSupported,
           "Trainer: reduce_dtype " << dtype_name(dtype)
                                    << "; the gradient is reduced in float32, or as bfloat16 "
                                       "contributions (DType::BFloat16)");
  if (dtype == DType::Float32) return;
  TL_CHECK(options.reduction == AllReduce::Ring, NotSupported,
           "Trainer: reduce_dtype bfloat16 with "
               << (options.reduction == AllReduce::Nccl
                       ? "AllReduce::Nccl: NCCL's all-reduce of bfloat16 sums partial sums in "
                         "bfloat16, in an order of its own"
                       : "AllReduce::ReduceToOne: the reduction to one device sums float32 "
                         "buffers")
               << "; bfloat16 contributions (each tower's gradient rounded once, summed in "
                  "float32 in tower order) are the ring's: use AllReduce::Ring, or reduce_dtype "
                  "float32");
}

}  // namespace

Trainer::Trainer(const VariableSet& variables, TowerFn tower_fn, Optimizer optimizer,
                 TrainerOptions options)
    : variables_(variables),
      tower_fn_(std::move(tower_fn)),
      optimizer_(std::move(optimizer)),
      options_(std::move(options)) {
  TL_CHECK(!options_.devices.empty(), InvalidArgument,
           "Trainer: the device list is empty (give at least one device, e.g. cpu or cuda:0)");
  TL_CHECK(tower_fn_ != nullptr, InvalidArgument, "Trainer: no tower function");
  TL_CHECK(variables_.trainable_numel() > 0, InvalidArgument,
           "Trainer: the model declares no trainable variables");
  for (Device d : options_.devices)
    devices_.push_back(place_device(d, options_.soft_placement, log()));
  check_tower_kinds(options_.devices);
  const bool sharded_master = options_.master_placement == MasterPlacement::Sharded;
  if (sharded_master) check_sharding(options_);
  check_reduce_dtype(options_);
  const bool contributions = options_.reduce_dtype == DType::BFloat16;
  TL_CHECK(std::isfinite(options_.clip_grad_norm) && options_.clip_grad_norm >= 0.0,
           InvalidArgument,
           "Trainer: clip_grad_norm must be a finite number >= 0 (0 turns clipping off), got "
               << options_.clip_grad_norm);
  // Sharded, the master is a host copy that the towers' slices are gathered into.
  master_device_ = sharded_master ? Device::cpu()
                   : options_.master
                       ? place_device(*options_.master, options_.soft_placement, log())
                       : devices_.front();
  // What the fingerprints and the placement log say.
  if (!sharded_master) options_.master = master_device_;
  if (options_.process_group != nullptr) {
    rank_ = options_.process_group->rank();
    ranks_ = options_.process_group->size();
    check_processes_agree();
  }

  master_stream_ = std::make_unique<Stream>(master_device_);
  master_ = std::make_unique<VariableStore>(variables_, *master_stream_);
  master_->initialize(options_.seed, *master_stream_);

  const DType compute = compute_dtype(options_.precision);
  loss_scale_ =
      LossScale(options_.precision == Precision::Fp16, options_.loss_scale_growth_interval);
  std::vector<const Stream*> streams;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    auto t = std::make_unique<TowerState>();
    t->device = devices_[i];
    t->stream = std::make_unique<Stream>(t->device);
    t->tape = std::make_unique<Tape>(*t->stream,
                                     "tower " + std::to_string(i) + " (" + t->device.str() + ")");
    t->store = std::make_unique<VariableStore>(variables_, *t->stream);
    // The backward's first write to each variable's gradient assigns: no zero-fill
    // of the flat gradient before it (run_tower).
    t->tape->set_variable_grads(Tape::VariableGrads::Unwritten);
    t->tape->set_compute_dtype(compute);
    t->tape->set_float32_math(float32_math(options_.precision));
    t->store->set_working_dtype(compute, *t->stream);
    streams.push_back(t->stream.get());
    towers_.push_back(std::move(t));
  }
  // One memory: every replica reads the master's values, and tower 0's working
  // copy, in place (one_memory_).
  one_memory_ = !sharded_master && master_device_.is_cpu() && devices_.front().is_cpu();
  if (one_memory_) {
    TowerState& first = *towers_.front();
    first.store->share_values(*master_);
    for (std::size_t i = 1; i < towers_.size(); ++i) towers_[i]->store->share_values(*first.store);
  }
  ring_ = std::make_unique<Ring>(streams);
  if (contributions) {
    contribution_ring_ = std::make_unique<Ring>(streams, RingReads::InPlace,
                                                RingOnOneGpu::OneLaunch, DType::BFloat16);
  }
  if (options_.reduction == AllReduce::Nccl) nccl_ = std::make_unique<NcclAllReduce>(streams);
  if (options_.reduction == AllReduce::Ring) {
    std::vector<Bucket> buckets = make_buckets(variables_, options_.bucket_bytes);
    if (buckets.size() > 1) {
      buckets_ = std::make_unique<BucketReducer>(
          std::move(buckets), streams,
          sharded_master ? BucketReduction::ReduceScatter : BucketReduction::AllReduce,
          options_.reduce_dtype);
    }
  }
  if (options_.process_group != nullptr) {
    const NcclChoice choice =
        choose_cross_process_path(*options_.process_group, options_.cross_process, devices_);
    if (choice.nccl) {
      nccl_processes_ = std::make_unique<NcclCommunicator>(*options_.process_group, devices_[0]);
    }
    cross_process_path_ = choice.reason;
    // NCCL's call carries the whole gradient after the host call (phase 5).
    // Sharded, phase 5 reduce-scatters the gradient instead.
    // Bfloat16 contributions cross the processes in a call of their own (phase 5's
    // host call, or on NCCL an all-gather).
    buckets_across_processes_ = bucketed() && options_.batchnorm != BatchNormMode::Sync &&
                                nccl_processes_ == nullptr && !sharded_master && !contributions;
    const ExchangeContents training{
        .training = true,
        .through_host = nccl_processes_ == nullptr,
        // The gradient summed by another call: the buckets', or allreduce_contributions.
        .buckets_sum_gradient = buckets_across_processes_ || contributions,
        .gradient = variables_.trainable_numel(),
        .statistics = variables_.state_numel(),
        .ranks = ranks_,
        .towers = std::int64_t(towers_.size())};
    ExchangeContents evaluation = training;
    evaluation.training = false;
    exchange_ = std::make_unique<ProcessExchange>(training, evaluation);
    // The slices follow the host-staged buffer's ring on either path.
    ExchangeContents staged = training;
    staged.through_host = true;
    slices_frame_ = exchange_layout(staged).total();
  }
  if (sharded_master) {
    const std::int64_t length = variables_.trainable_numel();
    shards_ = std::make_unique<ShardedMaster>(
        variables_,
        sharded_slices(length, std::int64_t(towers_.size()), ranks_, rank_, slices_frame_),
        optimizer_, streams);
    if (nccl_processes_ != nullptr) {
      shards_nccl_ = std::make_unique<ShardedNccl>(
          process_slices(length, std::int64_t(towers_.size()), ranks_, slices_frame_), rank_,
          *towers_[0]->stream);
    }
  }
  // One thread per tower, and the reducer's when bucketed.
  workers_ = std::make_unique<ThreadTeam>(towers_.size() + (bucketed() ? 1 : 0), towers_.size());
  broadcast();
  if (options_.log_placement) log_placement();
}

Trainer::~Trainer() = default;

// --- one step: the phases of parallel/trainer_phases.h, in order -------------

StepResult Trainer::step(const std::vector<Tensor>& batch) {
  return run(batch, true);
}

StepResult Trainer::evaluate(const std::vector<Tensor>& batch) {
  return run(batch, false);
}

StepResult Trainer::run(const std::vector<Tensor>& batch, bool training) {
  StepResult result = split(batch);            // 1
  run_towers(batch, result.slices, training);  // 2
  if (training) {
    reduce_gradients();                 // 3
    average_moving_statistics(result);  // 4
  }
  read_losses(result.slices);  // the end of 2, read once 3 and 4 are queued behind it
  if (options_.process_group != nullptr) reduce_across_processes(result, training);  // 5
  result.loss = mean_loss(result.samples);
  if (training && guard(result)) {                    // 6
    result.grad_norm = unscale_and_clip_gradients();  // 7, which begins with these
    update_and_broadcast();
  }
  gather_outputs(result);  // 8
  last_loss_ = result.loss;
  last_logs_ = result.logs;
  return result;
}

// --- 1. split ----------------------------------------------------------------

void Trainer::check_batch(const std::vector<Tensor>& batch) const {
  TL_CHECK(!batch.empty(), InvalidArgument, "Trainer: the batch holds no tensors");
  for (std::size_t k = 0; k < batch.size(); ++k) {
    TL_CHECK(batch[k].defined() && batch[k].dim() >= 1, ShapeError,
             "Trainer: batch tensor " << k << " is " << batch[k].describe()
                                      << "; every batch tensor needs a first (sample) dimension");
    TL_CHECK(batch[k].size(0) == batch[0].size(0), ShapeError,
             "Trainer: batch tensor " << k << " is " << batch[k].describe() << " but tensor 0 is "
                                      << batch[0].describe() << ": their first dimensions differ");
  }
  TL_CHECK(batch[0].size(0) > 0, InvalidArgument,
           "Trainer: the batch is empty (0 samples); there is nothing to train on");
}

StepResult Trainer::split(const std::vector<Tensor>& batch) const {
  check_batch(batch);
  StepResult result;
  result.samples = batch[0].size(0);
  // Phase 5 carries batch sizes as floats, exact up to 2^24.
  TL_CHECK(options_.process_group == nullptr || result.samples <= (std::int64_t(1) << 24),
           InvalidArgument,
           "Trainer: a batch of " << result.samples
                                  << " samples; across processes a step takes at most 2^24");
  result.slices = split_batch(result.samples, ranks_, rank_, std::int64_t(towers_.size()));
  return result;
}

// --- 2. run towers -----------------------------------------------------------

void Trainer::run_towers(const std::vector<Tensor>& batch, const std::vector<TowerSlice>& slices,
                         bool training) {
  std::unique_ptr<TowerBatchNormSync> sync;
  // Every rank makes the same batch-norm collectives. A rank without samples makes
  // them through a stand-in: its tower 0 runs the batch's first row with weight 0
  // (no gradient, no loss, no output) and joins the statistics with a zero count,
  // as an empty tower would.
  bool needs_stand_in = false;
  if (training && options_.batchnorm == BatchNormMode::Sync) {
    std::vector<int> participants;
    for (std::size_t i = 0; i < slices.size(); ++i) {
      if (slices[i].size() > 0) participants.push_back(int(i));
    }
    needs_stand_in = participants.empty() && ranks_ > 1;
    if (needs_stand_in) participants.push_back(0);
    sync = std::make_unique<TowerBatchNormSync>(participants, options_.process_group,
                                                "step " + std::to_string(steps_taken()),
                                                needs_stand_in ? 0 : -1);
  }
  const TowerSlice stand_in_slice{0, 1, 0.0};
  const bool bucketed_step = training && bucketed();
  if (bucketed_step) buckets_->start_step();
  // One host thread per tower: a tower's forward and backward run on its own
  // thread, which on the CPU is also its stream. The last thread of a bucketed
  // trainer is the reducer.
  auto job = [&](std::size_t i) {
    if (i == towers_.size()) {
      if (bucketed_step) reduce_buckets();
      return;
    }
    const bool is_stand_in = needs_stand_in && i == 0;
    const TowerSlice& slice = is_stand_in ? stand_in_slice : slices[i];
    try {
      run_tower(i, batch, slice, training, sync.get(), is_stand_in);
      if (bucketed_step) buckets_->tower_done(i);
      if (sync != nullptr) sync->finish(int(i), false);
    } catch (...) {
      if (bucketed_step) buckets_->tower_failed();  // the reducer stops waiting for this tower
      if (sync != nullptr) sync->finish(int(i), true);
      // An error about one sample names its row of the batch, not of the slice.
      rethrow_with_context(
          "Trainer: tower " + std::to_string(i) + " on " + towers_[i]->device.str() +
              (is_stand_in ? std::string(" (standing in for a process without samples "
                                         "in synchronized batch norm): ")
                           : " (samples " + std::to_string(slice.begin) + " to " +
                                 std::to_string(slice.end - 1) + " of the batch): "),
          slice.begin);
    }
  };
  // Whatever happened, the towers' streams go on only after the buckets' streams.
  ScopeExit join_buckets([&] {
    if (bucketed_step) buckets_->join();
  });
  workers_->run(job);
  if (needs_stand_in) {
    towers_[0]->outputs.clear();
    towers_[0]->logs.clear();
  }
}

// Reading a loss waits for its tower's stream. run() calls this after phases 3 and
// 4 are queued on those streams, so that on GPUs the host waits once the ring's
// launches are already in line behind the backward, not before: the GPU goes from
// the backward to the ring without waiting for the host to issue it.
void Trainer::read_losses(const std::vector<TowerSlice>& slices) {
  const std::size_t first = std::size_t(rank_) * towers_.size();
  losses_.assign(std::size_t(ranks_) * towers_.size(), 0.0f);
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    if (slices[i].size() == 0) continue;
    losses_[first + i] = towers_[i]->loss.to_host<float>(*towers_[i]->stream)[0];
  }
}

void Trainer::run_tower(std::size_t i, const std::vector<Tensor>& batch, const TowerSlice& slice,
                        bool training, BatchNormSync* sync, bool is_stand_in) {
  TowerState& t = *towers_[i];
  t.loss = Tensor();
  t.outputs.clear();
  t.logs.clear();
  t.tape->reset();
  if (slice.size() == 0) {  // sits this step out (its weight is 0)
    if (training) t.store->zero_grad(*t.stream);
    return;
  }
  // A mixed-precision tower's 16-bit working copy: its replica rounded once, from
  // the values the last broadcast wrote (parallel/precision.h); in one memory, the
  // update (or broadcast(), after anything else that writes the master) rounded the
  // one copy every tower reads.
  if (!one_memory_) t.store->round_working(*t.stream);

  auto start = Clock::now();
  std::vector<Tensor> feeds;
  for (const Tensor& b : batch) {
    Tensor rows = b.slice(slice.begin, slice.end);
    Tensor local = Tensor::empty(rows.shape(), *t.stream, rows.dtype());
    copy_tensor(local, rows,
                b.device().is_cuda() && t.device.is_cpu() ? default_stream(b.device()) : *t.stream);
    feeds.push_back(local);
  }
  std::optional<NoGradGuard> no_grad;
  if (!training) no_grad.emplace(*t.tape);
  // Each layer's forward and backward on the tower's row, while tracing.
  std::optional<TraceProfiler> profiler;
  if (trace_ != nullptr) profiler.emplace(*trace_, int(i), *t.stream, slice.size());
  t.tape->set_profiler(profiler ? &*profiler : nullptr);
  // The tape keeps neither the profiler nor the buckets' listener past this step,
  // even on a throw.
  ScopeExit tape_off([&t] {
    t.tape->set_gradient_listener(nullptr);
    t.tape->set_profiler(nullptr);
  });
  const std::vector<TraceArg> args{{"samples", slice.size()},
                                   {"phase", phase_label(Phase::RunTowers)}};
  const Tower tower{int(i),       t.device, *t.stream,   *t.tape,       *t.store,     training,
                    slice.size(), sync,     slice.begin, steps_taken(), options_.seed};
  TowerResult r = tower_fn_(tower, feeds);
  // The backward assigns each variable's gradient at its first write, or zero-fills
  // it (Tape::VariableGrads::Unwritten); a variable the forward never made on the
  // tape gets its zeros here.
  if (training) {
    for (const VariableSpec& v : variables_.specs()) {
      if (v.trainable && !t.tape->has_variable(v.name)) fill(t.store->grad(v.name), 0.0, *t.stream);
    }
  }
  // Each bucket reported ready as the backward completes it. A stand-in is not
  // watched: its gradient is discarded below, and its buckets complete when it is
  // done.
  if (training && bucketed() && !is_stand_in) buckets_->watch(i, *t.tape);
  // Errors from here on get the tower and its samples put before them (run()).
  TL_CHECK(r.loss.defined(), InvalidArgument, "the tower function returned no loss");
  TL_CHECK(r.loss.value().numel() == 1, ShapeError,
           "the tower function's loss " << r.loss.describe() << " must have one element");
  if (trace_ != nullptr) {
    t.stream->synchronize();
    trace_->span(int(i), "forward", start, "tower", args);
  }
  if (training) {
    start = Clock::now();
    // Under fp16 the seed carries the loss scale (phase 7 divides it out).
    t.tape->backward(r.loss, slice.weight * loss_scale_.scale());
    // Synchronized batch norm gives the stand-in's rows, which are not in the batch,
    // a gradient through the batch's sums: it must not count.
    if (is_stand_in) t.store->zero_grad(*t.stream);
    if (trace_ != nullptr) {
      t.stream->synchronize();
      trace_->span(int(i), "backward", start, "tower", args);
    }
  }
  t.tape->reset();
  t.loss = r.loss.value();
  // Outputs and logs are float32 whatever the working dtype (a bf16 tower's logits
  // are bfloat16).
  for (const Var& o : r.outputs) t.outputs.push_back(ag::widened(o.value(), *t.stream));
  for (const auto& [name, v] : r.logs) t.logs[name] = ag::widened(v.value(), *t.stream);
}

// --- 3. reduce gradients -----------------------------------------------------

void Trainer::reduce_gradients() {
  if (bucketed()) return;  // the reducer did it during the backward (run_towers)
  std::vector<Tensor> grads;
  std::vector<const Stream*> streams;
  for (auto& t : towers_) {
    grads.push_back(t->store->flat_grads());
    streams.push_back(t->stream.get());
  }
  Ring& ring = contribution_ring_ != nullptr ? *contribution_ring_ : *ring_;
  switch (options_.reduction) {
    case AllReduce::Ring:
      // Sharded: each tower needs the sum of its own slice only (phase 7). In one
      // memory only tower 0's whole sum is read (phases 5 to 7): the ring lands it
      // there and skips the all-gather (Ring::reduce).
      if (sharded()) {
        ring.reduce_scatter_range(grads, 0, grads[0].numel(), trace_, 0);
      } else if (one_memory_) {
        ring.reduce(grads, trace_, 0);
      } else {
        ring.allreduce(grads, trace_, 0);
      }
      break;
    case AllReduce::ReduceToOne:
      reduce_and_broadcast(streams, grads, 0);
      break;
    case AllReduce::Nccl:
      nccl_->allreduce(grads);
      break;
  }
}

void Trainer::reduce_buckets() {
  std::vector<Tensor> grads;
  for (const auto& t : towers_) grads.push_back(t->store->flat_grads());
  ProcessGroup* group = buckets_across_processes_ ? options_.process_group : nullptr;
  buckets_->reduce(grads, "step " + std::to_string(steps_taken()), group,
                   group != nullptr ? exchange_->buffer(true) : Tensor(), trace_,
                   int(towers_.size()) + 1);
}

// --- 4. average moving statistics --------------------------------------------

void Trainer::average_moving_statistics(const StepResult& result) {
  if (variables_.state_numel() == 0) return;
  const auto& slices = result.slices;
  if (options_.batchnorm_stats == BatchNormStats::Average) {
    // The sample-weighted average of the towers' (empty towers weigh 0); after the
    // all-reduce every tower holds it.
    std::vector<Tensor> states;
    for (std::size_t i = 0; i < towers_.size(); ++i) {
      scale(towers_[i]->store->flat_state(), towers_[i]->store->flat_state(), slices[i].weight,
            *towers_[i]->stream);
      states.push_back(towers_[i]->store->flat_state());
    }
    ring_->allreduce(states);
  } else {
    TL_CHECK(rank_ > 0 || slices[0].size() > 0 || towers_.size() == 1, InvalidArgument,
             "Trainer: batch-norm statistics come from tower 0, which has no samples in a batch of "
                 << result.samples << " over " << towers_.size()
                 << " towers (use BatchNormStats::Average or a larger batch)");
  }
}

// --- 8. gather outputs -------------------------------------------------------

void Trainer::gather_outputs(StepResult& result) const {
  const auto& slices = result.slices;
  // This process's rows of the batch.
  const std::int64_t first = slices.front().begin, rows = slices.back().end - first;
  // The logs and the outputs' shapes come from the last non-empty tower.
  std::size_t last = 0;
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    if (slices[i].size() > 0) last = i;
  }
  const std::size_t num_outputs = towers_[last]->outputs.size();
  for (std::size_t k = 0; k < num_outputs; ++k) {
    Shape shape = towers_[last]->outputs[k].shape();
    TL_CHECK(!shape.empty(), ShapeError, "Trainer: output " << k << " has no sample dimension");
    shape[0] = rows;
    Tensor all = Tensor::empty(shape, Device::cpu());
    for (std::size_t i = 0; i < towers_.size(); ++i) {
      if (slices[i].size() == 0) continue;
      const Tensor& part = towers_[i]->outputs.at(k);
      TL_CHECK(
          part.dim() == all.dim() && part.size(0) == slices[i].size() &&
              part.numel() == slices[i].size() * (all.numel() / std::max<std::int64_t>(1, rows)),
          ShapeError,
          "Trainer: output " << k << " of tower " << i << " is " << part.describe() << " for "
                             << slices[i].size() << " samples; expected rows of "
                             << to_string(shape));
      copy_tensor(all.slice(slices[i].begin - first, slices[i].end - first), part,
                  *towers_[i]->stream);
    }
    result.outputs.push_back(all);
  }
  for (const auto& [name, value] : towers_[last]->logs) {
    result.logs[name] = double(value.to_host<float>(*towers_[last]->stream)[0]);
  }
}

// --- what the last step left, and tracing ------------------------------------

const VariableStore& Trainer::replica(std::size_t i) const {
  TL_CHECK(i < towers_.size(), InvalidArgument,
           "Trainer::replica: tower " << i << " of " << towers_.size());
  return *towers_[i]->store;
}

const Tensor& Trainer::gradients() const {
  return master().flat_grads();
}

Tensor Trainer::gradient(const std::string& name) const {
  return master().grad(name);
}

VariableStore& Trainer::master() {
  gather_values();
  return *master_;
}

const VariableStore& Trainer::master() const {
  gather_values();
  return *master_;
}

Optimizer& Trainer::optimizer() {
  gather_slots();
  return optimizer_;
}

double Trainer::learning_rate() const {
  return sharded() ? shards_->current_lr() : optimizer_.current_lr();
}

std::int64_t Trainer::steps_taken() const {
  return sharded() ? shards_->steps() : optimizer_.steps();
}

void Trainer::gather_values() const {
  if (!sharded() || values_gathered_) return;
  // On NCCL the other processes' slices reached tower 0's replica, not the host copy.
  if (shards_nccl_ != nullptr) {
    const TowerState& first = *towers_[0];
    transfer(master_->flat_values(), *master_stream_, first.store->flat_values(), *first.stream);
  }
  shards_->gather_values(master_->flat_values(), *master_stream_);
  // Tower k's flat gradient holds the sum of its slice (phase 3's reduce-scatter).
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    const RingRange r = shards_->slice(i);
    transfer(master_->flat_grads().slice(r.begin, r.end), *master_stream_,
             towers_[i]->store->flat_grads().slice(r.begin, r.end), *towers_[i]->stream);
  }
  master_stream_->synchronize();
  values_gathered_ = true;
}

void Trainer::gather_slots() {
  if (!sharded() || slots_gathered_) return;
  std::map<std::string, Tensor> slots = shards_->gather_slots(*master_stream_);
  // Across processes each holds its slices: every process's, framed as the values.
  for (auto& [name, slot] : slots) {
    if (ranks_ == 1) break;
    options_.process_group->allgather_chunks(
        std::span<float>(slot.data<float>(), std::size_t(slot.numel())),
        "optimizer slot " + name + " (all-gather)", ReduceFrame{0, std::size_t(slices_frame_)});
  }
  optimizer_.restore(slots, shards_->steps(), *master_, *master_stream_);
  master_stream_->synchronize();
  slots_gathered_ = true;
}

std::vector<Trainer::MasterMemory> Trainer::master_memory() const {
  const auto slot_bytes = [](const Optimizer& o) {
    std::int64_t bytes = 0;
    for (const auto& [name, slot] : o.slots()) bytes += std::int64_t(slot.nbytes());
    return bytes;
  };
  const std::int64_t values = master_->flat_values().numel() * std::int64_t(sizeof(float));
  if (!sharded()) return {{"master", master_device_, values, slot_bytes(optimizer_)}};
  std::vector<MasterMemory> all;
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    all.push_back({"tower " + std::to_string(i), towers_[i]->device, shards_->value_bytes(i),
                   shards_->slot_bytes(i)});
  }
  // The copy that master() and optimizer() read: values always, slots only from
  // an optimizer() call to the next step.
  all.push_back({"host copy", master_device_, values, slot_bytes(optimizer_)});
  return all;
}

std::vector<std::string> Trainer::updated_variables() const {
  std::vector<std::string> names;
  for (const VariableSpec& v : variables_.specs()) {
    if (!v.trainable) names.push_back(v.name);
  }
  return names;
}

void Trainer::set_trace(Trace* trace) {
  trace_ = trace;
  if (trace_ == nullptr) return;
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    trace_->name_row(int(i), "tower " + std::to_string(i) + " (" + towers_[i]->device.str() + ")");
  }
  trace_->name_row(int(towers_.size()), "master (" + master_device_.str() + ")");
  if (bucketed()) trace_->name_row(int(towers_.size()) + 1, "gradient buckets");
  if (ranks_ > 1) trace_->name_row(int(towers_.size()) + 2, "processes");
}

}  // namespace towerlab
