// The Trainer (parallel/trainer.h): its construction, then one step as its phases,
// a section each, in the order Trainer::run calls them. Where the work is placed and
// the placement log: trainer_placement.cpp; save_state and restore_state:
// trainer_state.cpp.
#include "parallel/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <sstream>

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
#include "parallel/sync_batchnorm.h"
#include "parallel/thread_team.h"
#include "parallel/trace.h"
#include "parallel/trainer_phases.h"
#include "parallel/transfer.h"

namespace towerlab {

struct Trainer::TowerState {
  Device device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Tape> tape;
  std::unique_ptr<VariableStore> store;
  // Results of the last step, on the tower's device.
  Tensor loss;
  std::vector<Tensor> outputs;
  std::map<std::string, Tensor> logs;
};

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
  // Across processes the slices' sums travel through the host (sharded_master.h).
  TL_CHECK(options.process_group == nullptr || options.process_group->size() == 1 ||
               options.cross_process != CrossProcessPath::Nccl,
           NotSupported,
           "Trainer: MasterPlacement::Sharded across processes takes the host-staged path only; "
           "CrossProcessPath::Nccl (ncclReduceScatter and ncclAllGather on the towers' buffers) "
           "is not supported yet; use CrossProcessPath::Auto or HostStaged, or "
           "MasterPlacement::OneDevice with NCCL");
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

  // Checked on the request, as the tower kinds are.
  const DType compute = compute_dtype(options_.precision, options_.devices);
  std::vector<const Stream*> streams;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    auto t = std::make_unique<TowerState>();
    t->device = devices_[i];
    t->stream = std::make_unique<Stream>(t->device);
    t->tape = std::make_unique<Tape>(*t->stream,
                                     "tower " + std::to_string(i) + " (" + t->device.str() + ")");
    t->store = std::make_unique<VariableStore>(variables_, *t->stream);
    t->tape->set_compute_dtype(compute);
    t->store->set_working_dtype(compute, *t->stream);
    streams.push_back(t->stream.get());
    towers_.push_back(std::move(t));
  }
  ring_ = std::make_unique<Ring>(streams);
  if (options_.reduction == AllReduce::Nccl) nccl_ = std::make_unique<NcclAllReduce>(streams);
  if (options_.reduction == AllReduce::Ring) {
    std::vector<Bucket> buckets = make_buckets(variables_, options_.bucket_bytes);
    if (buckets.size() > 1) {
      buckets_ = std::make_unique<BucketReducer>(
          std::move(buckets), streams,
          sharded_master ? BucketReduction::ReduceScatter : BucketReduction::AllReduce);
    }
  }
  if (options_.process_group != nullptr) {
    const NcclChoice choice =
        sharded_master
            ? NcclChoice{false, "host staging (a sharded master across processes)"}
            : choose_cross_process_path(*options_.process_group, options_.cross_process, devices_);
    if (choice.nccl) {
      nccl_processes_ = std::make_unique<NcclCommunicator>(*options_.process_group, devices_[0]);
    }
    cross_process_path_ = choice.reason;
    // NCCL's call carries the whole gradient after the host call (phase 5).
    // Sharded, phase 5 reduce-scatters the gradient instead.
    buckets_across_processes_ = bucketed() && options_.batchnorm != BatchNormMode::Sync &&
                                nccl_processes_ == nullptr && !sharded_master;
    const ExchangeContents training{.training = true,
                                    .through_host = nccl_processes_ == nullptr,
                                    .buckets_sum_gradient = buckets_across_processes_,
                                    .gradient = variables_.trainable_numel(),
                                    .statistics = variables_.state_numel(),
                                    .ranks = ranks_,
                                    .towers = std::int64_t(towers_.size())};
    ExchangeContents evaluation = training;
    evaluation.training = false;
    exchange_ = std::make_unique<ProcessExchange>(training, evaluation);
  }
  if (sharded_master) {
    const std::int64_t length = variables_.trainable_numel();
    shards_ = std::make_unique<ShardedMaster>(
        variables_,
        sharded_slices(length, std::int64_t(towers_.size()), ranks_, rank_,
                       exchange_ ? exchange_->layout(true).total() : 0),
        optimizer_, streams);
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
  if (training && guard(result)) {        // 6
    result.grad_norm = clip_gradients();  // 7, which begins with the clipping
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
  if (training) t.store->zero_grad(*t.stream);
  if (slice.size() == 0) return;  // sits this step out (its weight is 0)
  // A mixed-precision tower's 16-bit working copy: its replica rounded once, from
  // the values the last broadcast wrote (parallel/precision.h).
  t.store->round_working(*t.stream);

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
    t.tape->backward(r.loss, slice.weight);
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
  for (const Var& o : r.outputs) t.outputs.push_back(o.value());
  for (const auto& [name, v] : r.logs) t.logs[name] = v.value();
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
  switch (options_.reduction) {
    case AllReduce::Ring:
      // Sharded: each tower needs the sum of its own slice only (phase 7).
      if (sharded()) {
        ring_->reduce_scatter_range(grads, 0, grads[0].numel(), trace_, 0);
      } else {
        ring_->allreduce(grads, trace_, 0);
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

// --- 5. reduce across processes ----------------------------------------------

void Trainer::reduce_across_processes(const StepResult& result, bool training) {
  // Every rank sums one host buffer laid out by exchange_ (parallel/process_exchange.h);
  // when NCCL carries the gradient and statistics, it sums tower 0's device buffers
  // after that call. After phases 3 and 4 every tower holds the same, so tower 0's
  // values stand for the rank's.
  const ExchangeLayout& layout = exchange_->layout(training);
  const Tensor buffer = exchange_->buffer(training);
  TowerState& first = *towers_[0];
  const Tensor& grads = first.store->flat_grads();
  const Tensor& stats = first.store->flat_state();
  // BatchNormStats::Tower0 takes rank 0's tower 0: the other ranks add zeros.
  if (training && variables_.state_numel() > 0 &&
      options_.batchnorm_stats == BatchNormStats::Tower0 && rank_ > 0) {
    fill(stats, 0.0, *first.stream);
  }
  // Sharded: each tower holds the sum of its ring chunk only (phase 3), and the
  // processes reduce-scatter the gradient (parallel/sharded_master.h).
  const bool slices = training && sharded();
  const ExchangeRange grads_here = slices ? ExchangeRange{} : layout.gradient_summed();
  if (!grads_here.empty()) copy_tensor(grads_here.of(buffer), grads, *first.stream);
  if (slices) stage_ring_chunks(layout.gradient.of(buffer));
  if (!layout.statistics.empty()) copy_tensor(layout.statistics.of(buffer), stats, *first.stream);
  first.stream->synchronize();
  const std::span<float> values(buffer.data<float>(), std::size_t(layout.total()));
  const auto at = [&values](ExchangeRange r) {
    return values.subspan(std::size_t(r.begin), std::size_t(r.size()));
  };
  std::ranges::copy(losses_, at(layout.losses).begin());
  const std::span<float> sizes = at(layout.batch_sizes);
  std::ranges::fill(sizes, 0.0f);
  sizes[std::size_t(rank_)] = float(result.samples);

  const std::string step =
      training ? "step " + std::to_string(steps_taken()) : std::string("evaluation");
  const auto start = Clock::now();
  const auto frame = [&layout](ExchangeRange r) {
    return ReduceFrame{std::size_t(r.begin), std::size_t(layout.total())};
  };
  if (slices) {
    // The one call's two parts, each framed by the whole buffer: the same bits.
    const ExchangeRange rest{layout.gradient.end, layout.total()};
    options_.process_group->reduce_scatter_sum(
        at(layout.gradient), step + ": gradient (reduce-scatter)", frame(layout.gradient));
    options_.process_group->allreduce_sum(
        at(rest), step + ": " + layout.carries + " (the gradient reduce-scattered)", frame(rest));
  } else {
    options_.process_group->allreduce_sum(at(layout.summed), step + ": " + layout.carries,
                                          frame(layout.summed));
  }
  if (trace_ != nullptr && ranks_ > 1) {
    trace_->span(int(towers_.size()) + 2,
                 (slices ? "reduce-scatter + all-reduce: " : "all-reduce: ") + layout.carries,
                 start, "processes",
                 {{"bytes", layout.summed.size() * std::int64_t(sizeof(float))},
                  {"processes", ranks_},
                  {"phase", phase_label(Phase::ReduceAcrossProcesses)}});
  }
  for (int r = 1; r < ranks_; ++r) {
    if (sizes[std::size_t(r)] == sizes[0]) continue;
    if (training) broadcast();  // the replicas' moving statistics back to the master's
    TL_THROW(InvalidArgument, "Trainer: the processes' batches differ: rank 0 has a batch of "
                                  << std::int64_t(sizes[0]) << " samples, rank " << r << " of "
                                  << std::int64_t(sizes[std::size_t(r)])
                                  << "; every process's step() and evaluate() must receive the "
                                     "same global batch (nothing was updated)");
  }
  if (training && nccl_processes_ != nullptr) {
    std::vector<Tensor> buffers{grads};
    if (variables_.state_numel() > 0) buffers.push_back(stats);
    nccl_processes_->allreduce_sum(buffers, *first.stream,
                                   step + ": gradients, moving statistics (NCCL)");
  }
  std::ranges::copy(at(layout.losses), losses_.begin());
  if (!grads_here.empty()) copy_tensor(grads, grads_here.of(buffer), *first.stream);
  if (slices) {
    // Each tower reads the sums of the slice it owns.
    for (std::size_t i = 0; i < towers_.size(); ++i) {
      const RingRange r = shards_->slice(i);
      copy_tensor(towers_[i]->store->flat_grads().slice(r.begin, r.end),
                  layout.gradient.of(buffer).slice(r.begin, r.end), *towers_[i]->stream);
    }
  }
  if (!layout.statistics.empty()) copy_tensor(stats, layout.statistics.of(buffer), *first.stream);
}

void Trainer::stage_ring_chunks(const Tensor& gradient) const {
  // Tower i holds the complete sum of the ring's chunk summed_at(i): together, the
  // all-reduced gradient, bit for bit.
  const RingSchedule schedule(std::int64_t(towers_.size()), gradient.numel());
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    const RingRange r = schedule.chunk(schedule.summed_at(std::int64_t(i)));
    copy_tensor(gradient.slice(r.begin, r.end),
                towers_[i]->store->flat_grads().slice(r.begin, r.end), *towers_[i]->stream);
  }
  for (const auto& t : towers_) t->stream->synchronize();
}

// --- 6. guard, after the mean loss it checks ---------------------------------

double Trainer::mean_loss(std::int64_t samples) const {
  const std::size_t towers = towers_.size();
  double loss = 0.0;
  for (int r = 0; r < ranks_; ++r) {
    const auto slices = split_batch(samples, ranks_, r, std::int64_t(towers));
    for (std::size_t i = 0; i < towers; ++i) {
      if (slices[i].size() == 0) continue;
      loss += slices[i].weight * double(losses_[std::size_t(r) * towers + i]);
    }
  }
  return loss;
}

bool Trainer::guard(StepResult& result) {
  if (options_.numeric_guard == NumericGuard::Off) return true;
  const std::string problem = find_nonfinite(result);
  if (problem.empty()) return true;
  // The towers' moving statistics moved in the forward pass and were averaged;
  // the master's did not. Put every replica back to the master's state.
  broadcast();
  const std::string what =
      "non-finite values at global step " + std::to_string(steps_taken()) + ": " + problem;
  if (options_.numeric_guard == NumericGuard::Stop) {
    TL_THROW(NumericError, "Trainer: " << what
                                       << "; nothing was updated (NumericGuard::Stop; "
                                          "NumericGuard::Skip would skip the step)");
  }
  ++skipped_steps_;
  result.skipped = true;
  log() << "towerlab: warning: skipped the step: " << what << " (NumericGuard::Skip, "
        << skipped_steps_ << " skipped so far)\n";
  return false;
}

std::string Trainer::find_nonfinite(const StepResult& result) const {
  std::ostringstream problem;
  if (!std::isfinite(result.loss)) {
    problem << "the loss is " << result.loss << " (";
    const std::size_t towers = towers_.size();
    for (int r = 0; r < ranks_; ++r) {
      const auto slices = split_batch(result.samples, ranks_, r, std::int64_t(towers));
      for (std::size_t i = 0; i < towers; ++i) {
        if (r > 0 || i > 0) problem << ", ";
        if (options_.process_group != nullptr) {
          problem << "rank " << r << " tower " << i << ": ";
        } else {
          problem << "tower " << i << " on " << towers_[i]->device.str() << ": ";
        }
        if (slices[i].size() == 0) {
          problem << "no samples";
        } else {
          problem << losses_[std::size_t(r) * towers + i];
        }
      }
    }
    problem << "; the usual causes: NaN or infinite inputs, labels outside the classes on CUDA "
               "(whose loss kernels do not stop to check them), a learning rate too high)";
  }
  const auto [at, value] = first_nonfinite_gradient();
  if (at >= 0) {
    for (const VariableSpec& v : variables_.specs()) {
      if (!v.trainable || at < v.offset || at >= v.offset + v.numel()) continue;
      if (problem.tellp() > 0) problem << "; ";
      problem << "the averaged gradient of " << v.name << " " << to_string(v.shape) << " is "
              << value << " at element " << at - v.offset
              << " (the first non-finite value of the flat gradient)";
      break;
    }
  }
  return problem.str();
}

std::pair<std::int64_t, float> Trainer::first_nonfinite_gradient() const {
  if (!sharded()) {
    // After the all-reduce (or the reduction to one device) tower 0 holds the sum
    // (over the processes too, after phase 5).
    const TowerState& first = *towers_[0];
    const Tensor& grads = first.store->flat_grads();
    const std::int64_t at = first_nonfinite(grads, *first.stream);
    if (at < 0) return {-1, 0.0f};
    return {at, grads.slice(at, at + 1).to_host<float>(*first.stream)[0]};
  }
  // Each tower checks the slice it alone holds the sum of, on its own thread; the
  // smallest index found is the whole gradient's first, so every tower's update
  // waits for one verdict and the message is the one-device master's.
  std::vector<std::int64_t> found(towers_.size(), -1);
  workers_->run([&](std::size_t i) {
    if (i < towers_.size()) found[i] = shards_->first_nonfinite(i, towers_[i]->store->flat_grads());
  });
  std::size_t owner = towers_.size();
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    if (found[i] >= 0 && (owner == towers_.size() || found[i] < found[owner])) owner = i;
  }
  std::pair<std::int64_t, float> first{-1, 0.0f};
  if (owner < towers_.size()) {
    const std::int64_t at = found[owner];
    const TowerState& t = *towers_[owner];
    first = {at, t.store->flat_grads().slice(at, at + 1).to_host<float>(*t.stream)[0]};
  }
  if (ranks_ == 1) return first;
  // Every process's first, and the smallest of all: one verdict for the job.
  std::ostringstream mine;
  std::uint32_t value_bits = 0;
  std::memcpy(&value_bits, &first.second, sizeof value_bits);
  mine << first.first << ' ' << value_bits;
  for (const std::string& theirs : options_.process_group->allgather(
           mine.str(), "step " + std::to_string(steps_taken()) + ": numeric guard")) {
    std::istringstream in(theirs);
    std::pair<std::int64_t, float> found_there{-1, 0.0f};
    in >> found_there.first >> value_bits;
    std::memcpy(&found_there.second, &value_bits, sizeof value_bits);
    if (found_there.first >= 0 && (first.first < 0 || found_there.first < first.first)) {
      first = found_there;
    }
  }
  return first;
}

// --- 7. update and broadcast -------------------------------------------------

double Trainer::clip_gradients() {
  const double limit = options_.clip_grad_norm;
  if (limit == 0.0) return 0.0;
  const auto start = Clock::now();
  // The norm's parts are the sharded master's slices of every process
  // (sharded_slices, [rank * towers + k]), whatever the placement: their sums of
  // squares, added in the order of the slices' positions, give every placement and
  // every process the same bits. A part's averaged gradient is held by tower 0, or
  // (sharded) by the tower that owns it, on its process.
  const auto towers = std::int64_t(towers_.size());
  const std::int64_t length = variables_.trainable_numel();
  const std::int64_t exchange_length = exchange_ ? exchange_->layout(true).total() : 0;
  std::vector<RingRange> parts;
  for (int r = 0; r < ranks_; ++r) {
    for (const RingRange& slice : sharded_slices(length, towers, ranks_, r, exchange_length)) {
      parts.push_back(slice);
    }
  }
  // The tower holding part p on this process, or -1 (another process's).
  auto holder = [&](std::size_t part) -> std::int64_t {
    if (!sharded()) return 0;
    return std::int64_t(part) / towers == rank_ ? std::int64_t(part) % towers : -1;
  };
  // Each holding tower writes its parts' sums into one buffer, read back once.
  std::vector<Tensor> sums(towers_.size());
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const std::int64_t i = holder(p);
    if (i < 0) continue;
    TowerState& t = *towers_[std::size_t(i)];
    Tensor& on_tower = sums[std::size_t(i)];
    if (!on_tower.defined()) on_tower = Tensor::empty({std::int64_t(parts.size())}, *t.stream);
    sum_squares(on_tower.slice(std::int64_t(p), std::int64_t(p) + 1),
                t.store->flat_grads().slice(parts[p].begin, parts[p].end), *t.stream);
  }
  std::vector<float> squares(parts.size(), 0.0f);
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    if (!sums[i].defined()) continue;
    const std::vector<float> held = sums[i].to_host<float>(*towers_[i]->stream);
    for (std::size_t p = 0; p < parts.size(); ++p) {
      if (holder(p) == std::int64_t(i)) squares[p] = held[p];
    }
  }
  if (sharded() && ranks_ > 1) {  // each part from its process; adding zeros keeps its bits
    options_.process_group->allreduce_sum(
        squares, "step " + std::to_string(steps_taken()) + ": the gradient norm's parts");
  }
  std::vector<std::size_t> order(parts.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::ranges::sort(order, {}, [&](std::size_t p) { return parts[p].begin; });
  double total = 0.0;
  for (std::size_t p : order) total += double(squares[p]);
  const double norm = std::sqrt(total);
  if (norm > limit) {
    const double coefficient = limit / (norm + 1e-6);
    if (!sharded()) {
      const Tensor& grads = towers_[0]->store->flat_grads();
      scale(grads, grads, coefficient, *towers_[0]->stream);
    }
    for (std::size_t p = 0; sharded() && p < parts.size(); ++p) {
      const std::int64_t i = holder(p);
      if (i < 0) continue;
      TowerState& t = *towers_[std::size_t(i)];
      const Tensor slice = t.store->flat_grads().slice(parts[p].begin, parts[p].end);
      scale(slice, slice, coefficient, *t.stream);
    }
  }
  if (trace_ != nullptr) {
    trace_->span(int(towers_.size()), "clip", start, "master",
                 {{"phase", phase_label(Phase::UpdateAndBroadcast)}});
  }
  return norm;
}

void Trainer::update_and_broadcast() {
  if (sharded()) {
    update_slices_and_gather();
    return;
  }
  const auto start = Clock::now();
  TowerState& first = *towers_[0];
  transfer(master_->flat_grads(), *master_stream_, first.store->flat_grads(), *first.stream);
  transfer(master_->flat_state(), *master_stream_, first.store->flat_state(), *first.stream);
  optimizer_.step(*master_, master_->flat_grads(), *master_stream_);
  broadcast();  // returns with the master stream finished
  if (trace_ != nullptr) {
    trace_->span(int(towers_.size()), "update + broadcast", start, "master",
                 {{"phase", phase_label(Phase::UpdateAndBroadcast)}});
  }
}

void Trainer::update_slices_and_gather() {
  TowerState& first = *towers_[0];
  // The moving statistics keep a whole master on the host (the guard puts the
  // replicas back to it), and every replica takes it, as broadcast() gives it.
  transfer(master_->flat_state(), *master_stream_, first.store->flat_state(), *first.stream);
  for (auto& t : towers_) {
    transfer(t->store->flat_state(), *t->stream, master_->flat_state(), *master_stream_);
  }
  const std::string phase = phase_label(Phase::UpdateAndBroadcast);
  workers_->run([&](std::size_t i) {
    if (i >= towers_.size()) return;
    TowerState& t = *towers_[i];
    const auto start = Clock::now();
    shards_->update(i, t.store->flat_grads(), t.store->flat_values());
    if (trace_ != nullptr) {
      t.stream->synchronize();
      const RingRange slice = shards_->slice(i);
      trace_->span(int(i), "update slice", start, "master",
                   {{"phase", phase}, {"begin", slice.begin}, {"end", slice.end}});
    }
  });
  if (ranks_ > 1) {
    gather_across_processes();
  } else {
    std::vector<Tensor> values;
    for (auto& t : towers_) values.push_back(t->store->flat_values());
    ring_->all_gather(values, trace_, 0);
  }
  // As broadcast(): the step returns with the new values in every replica (the
  // all-gather's end makes tower 0's stream wait for every member).
  master_stream_->synchronize();
  first.stream->synchronize();
  values_gathered_ = false;
  slots_gathered_ = false;
  // The host copy's slots (after an optimizer() call) would now be stale: freed.
  optimizer_.restore({}, 0, *master_, *master_stream_);
}

void Trainer::gather_across_processes() {
  // Every process's slices meet in the host copy, framed as phase 5's gradient
  // (parallel/sharded_master.h), and go from there to every replica.
  const auto start = Clock::now();
  const Tensor& values = master_->flat_values();
  shards_->gather_values(values, *master_stream_);
  options_.process_group->allgather_chunks(
      std::span<float>(values.data<float>(), std::size_t(values.numel())),
      "step " + std::to_string(steps_taken()) + ": new values (all-gather)",
      ReduceFrame{0, std::size_t(exchange_->layout(true).total())});
  for (auto& t : towers_) {
    transfer(t->store->flat_values(), *t->stream, values, *master_stream_);
  }
  if (trace_ != nullptr) {
    master_stream_->synchronize();
    trace_->span(int(towers_.size()) + 2, "all-gather: new values", start, "processes",
                 {{"bytes", values.numel() * std::int64_t(sizeof(float))},
                  {"processes", ranks_},
                  {"phase", phase_label(Phase::UpdateAndBroadcast)}});
  }
}

void Trainer::broadcast() {
  if (sharded()) {
    // The host copy, up to date or written by the caller since, into the slices.
    gather_values();
    gather_slots();
    shards_->scatter(master_->flat_values(), optimizer_, *master_stream_);
  }
  for (auto& t : towers_) {
    transfer(t->store->flat_values(), *t->stream, master_->flat_values(), *master_stream_);
    transfer(t->store->flat_state(), *t->stream, master_->flat_state(), *master_stream_);
  }
  // The one host wait of a step, and the reason a caller may read or write the
  // master (to_host on any stream, save_checkpoint, load_checkpoint) without
  // knowing master_stream_: the master stream has waited for every replica's copy,
  // so this also covers the update, the initialization and the copies themselves.
  master_stream_->synchronize();
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
        "optimizer slot " + name + " (all-gather)",
        ReduceFrame{0, std::size_t(exchange_->layout(true).total())});
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
