// The Trainer's phases 5 to 7 (parallel/trainer_phases.h), after every tower has
// its gradient: the sum across processes, the numeric guard and clipping, and the
// update with its broadcast (or, sharded, each tower's update of its slice and the
// all-gather). trainer.cpp holds the construction and the other phases.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <sstream>

#include "engine/clock.h"
#include "engine/error.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "parallel/nccl_allreduce.h"
#include "parallel/nccl_communicator.h"
#include "parallel/process_exchange.h"
#include "parallel/process_group.h"
#include "parallel/ring_allreduce.h"
#include "parallel/ring_contributions.h"
#include "parallel/sharded_master.h"
#include "parallel/sharded_nccl.h"
#include "parallel/thread_team.h"
#include "parallel/trace.h"
#include "parallel/trainer.h"
#include "parallel/trainer_phases.h"
#include "parallel/trainer_tower.h"
#include "parallel/transfer.h"

namespace towerlab {

// --- 5. reduce across processes ----------------------------------------------

void Trainer::reduce_across_processes(const StepResult& result, bool training) {
  // A group of one process (the sample's, run without mpirun) has no one to sum
  // with: the call would copy the gradient, the statistics and the losses out to
  // the exchange buffer and back unchanged, so it returns, as a trainer without a
  // group skips the phase. Two cases still change something and go on: bfloat16
  // contributions, which this call rounds once more as the process's contribution
  // (parallel/ring_contributions.h), and a sharded master, whose slices it hands
  // to the towers (framed by the exchange buffer: parallel/sharded_master.h).
  if (ranks_ == 1 && !(training && (sharded() || contribution_ring_ != nullptr))) return;
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
  // processes reduce-scatter the gradient (parallel/sharded_master.h), on the host
  // or, on NCCL, from tower 0's flat gradient (parallel/sharded_nccl.h).
  const bool slices = training && sharded();
  const bool host_slices = slices && shards_nccl_ == nullptr;
  // Bfloat16 contributions (reduce_dtype): the gradient staged in its range of the
  // buffer and summed there by a call of its own (parallel/ring_contributions.h),
  // the rest by the one allreduce_sum; on NCCL, reduce_on_nccl's.
  const bool contributions =
      training && contribution_ring_ != nullptr && nccl_processes_ == nullptr;
  const ExchangeRange grads_here = slices          ? ExchangeRange{}
                                   : contributions ? layout.gradient
                                                   : layout.gradient_summed();
  if (!grads_here.empty()) copy_tensor(grads_here.of(buffer), grads, *first.stream);
  if (slices) stage_ring_chunks(host_slices ? layout.gradient.of(buffer) : grads);
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
  if (contributions) {
    allreduce_contributions(*options_.process_group, at(layout.gradient),
                            step + ": gradient (bfloat16 contributions)");
    options_.process_group->allreduce_sum(at(layout.summed), step + ": " + layout.carries,
                                          frame(layout.summed));
  } else if (host_slices) {
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
                 (host_slices ? "reduce-scatter + all-reduce: " : "all-reduce: ") + layout.carries,
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
  if (training && nccl_processes_ != nullptr) reduce_on_nccl(step);
  std::ranges::copy(at(layout.losses), losses_.begin());
  if (!grads_here.empty()) copy_tensor(grads, grads_here.of(buffer), *first.stream);
  if (host_slices) {
    // Each tower reads the sums of the slice it owns.
    for (std::size_t i = 0; i < towers_.size(); ++i) {
      const RingRange r = shards_->slice(i);
      copy_tensor(towers_[i]->store->flat_grads().slice(r.begin, r.end),
                  layout.gradient.of(buffer).slice(r.begin, r.end), *towers_[i]->stream);
    }
  }
  if (!layout.statistics.empty()) copy_tensor(stats, layout.statistics.of(buffer), *first.stream);
}

void Trainer::reduce_on_nccl(const std::string& step) {
  // After the host call, as phase 5's contract has it (a rank that never reached the
  // step is named there). Sharded: tower 0's flat gradient holds the process's sum
  // (staged), the processes reduce-scatter it, and each tower reads its slice.
  // Bfloat16 contributions: the processes all-gather them and each sums the whole
  // gradient (parallel/ring_contributions.h); sharded, each tower reads its slice.
  TowerState& first = *towers_[0];
  const Tensor& grads = first.store->flat_grads();
  const Tensor& stats = first.store->flat_state();
  const bool contributions = contribution_ring_ != nullptr;
  std::vector<Tensor> buffers;
  if (shards_nccl_ == nullptr && !contributions) buffers.push_back(grads);
  if (variables_.state_numel() > 0) buffers.push_back(stats);
  if (contributions) {
    const auto start = Clock::now();
    allreduce_contributions(*nccl_processes_, grads, *first.stream,
                            step + ": gradient (bfloat16 contributions, NCCL all-gather)");
    if (shards_nccl_ != nullptr) {
      for (std::size_t i = 1; i < towers_.size(); ++i) {
        const RingRange r = shards_->slice(i);
        transfer(towers_[i]->store->flat_grads().slice(r.begin, r.end), *towers_[i]->stream,
                 grads.slice(r.begin, r.end), *first.stream);
      }
    }
    if (trace_ != nullptr) {
      trace_->span(int(towers_.size()) + 2, "all-gather (NCCL): bfloat16 contributions", start,
                   "processes",
                   {{"bytes", grads.numel() * ranks_ * std::int64_t(sizeof(std::uint16_t))},
                    {"processes", ranks_},
                    {"phase", phase_label(Phase::ReduceAcrossProcesses)}});
    }
  } else if (shards_nccl_ != nullptr) {
    const auto start = Clock::now();
    shards_nccl_->reduce_scatter(*nccl_processes_, grads, *first.stream,
                                 step + ": gradient (NCCL reduce-scatter)");
    for (std::size_t i = 0; i < towers_.size(); ++i) {
      const RingRange r = shards_->slice(i);
      transfer(towers_[i]->store->flat_grads().slice(r.begin, r.end), *towers_[i]->stream,
               shards_nccl_->mine(r), *first.stream);
    }
    if (trace_ != nullptr) {
      trace_->span(int(towers_.size()) + 2, "reduce-scatter (NCCL): gradient", start, "processes",
                   {{"bytes", shards_nccl_->block() * ranks_ * std::int64_t(sizeof(float))},
                    {"processes", ranks_},
                    {"phase", phase_label(Phase::ReduceAcrossProcesses)}});
    }
  }
  if (!buffers.empty()) {
    nccl_processes_->allreduce_sum(
        buffers, *first.stream,
        step + (shards_nccl_ == nullptr ? ": gradients, moving statistics (NCCL)"
                                        : ": moving statistics (NCCL)"));
  }
}

void Trainer::stage_ring_chunks(const Tensor& gradient) const {
  // Tower i holds the complete sum of the ring's chunk summed_at(i): together, the
  // all-reduced gradient, bit for bit. `gradient` may be tower 0's own, whose chunk
  // is already in place.
  const RingSchedule schedule(std::int64_t(towers_.size()), gradient.numel());
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    const RingRange r = schedule.chunk(schedule.summed_at(std::int64_t(i)));
    if (gradient.raw_data() == towers_[i]->store->flat_grads().raw_data()) continue;
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
  const bool scaled = loss_scale_.enabled();
  if (options_.numeric_guard == NumericGuard::Off && !scaled) return true;
  result.loss_scale = loss_scale_.scale();
  // The loss is float32 and computed before any scaling: a non-finite loss is the
  // numeric guard's to report, which a smaller scale would not cure. A non-finite
  // gradient under fp16 (with a finite loss, or with the loss unchecked) is the
  // scale's overflow: GradScaler's skip. Both verdicts read values summed over
  // every tower and process, so every tower and process reaches the same one.
  const std::string loss =
      options_.numeric_guard == NumericGuard::Off ? std::string() : nonfinite_loss(result);
  const std::string gradient = nonfinite_gradient();
  result.overflow = scaled && loss.empty() && !gradient.empty();
  if (scaled && loss.empty()) loss_scale_.update(result.overflow);
  if (loss.empty() && gradient.empty()) return true;
  // The towers' moving statistics moved in the forward pass and were averaged;
  // the master's did not. Put every replica back to the master's state.
  broadcast();
  result.skipped = true;
  if (result.overflow) return false;
  const std::string what = "non-finite values at global step " + std::to_string(steps_taken()) +
                           ": " + loss + (loss.empty() || gradient.empty() ? "" : "; ") + gradient;
  if (options_.numeric_guard == NumericGuard::Stop) {
    TL_THROW(NumericError, "Trainer: " << what
                                       << "; nothing was updated (NumericGuard::Stop; "
                                          "NumericGuard::Skip would skip the step)");
  }
  ++skipped_steps_;
  log() << "towerlab: warning: skipped the step: " << what << " (NumericGuard::Skip, "
        << skipped_steps_ << " skipped so far)\n";
  return false;
}

std::string Trainer::nonfinite_loss(const StepResult& result) const {
  if (std::isfinite(result.loss)) return {};
  std::ostringstream problem;
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
  return problem.str();
}

std::string Trainer::nonfinite_gradient() const {
  const auto [at, value] = first_nonfinite_gradient();
  if (at < 0) return {};
  std::ostringstream problem;
  for (const VariableSpec& v : variables_.specs()) {
    if (!v.trainable || at < v.offset || at >= v.offset + v.numel()) continue;
    problem << "the averaged gradient of " << v.name << " " << to_string(v.shape) << " is " << value
            << " at element " << at - v.offset
            << " (the first non-finite value of the flat gradient)";
    break;
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
  // waits for one verdict and the message is the one-device master's. A pass over
  // the slice and a hand-off to the towers' threads in every step: the trace shows
  // it as a "guard" span on each tower's row, between the reduce-scatter and the
  // update.
  std::vector<std::int64_t> found(towers_.size(), -1);
  workers_->run([&](std::size_t i) {
    if (i >= towers_.size()) return;
    const auto start = Clock::now();
    found[i] = shards_->first_nonfinite(i, towers_[i]->store->flat_grads());
    if (trace_ != nullptr) {
      const RingRange slice = shards_->slice(i);
      trace_->span(
          int(i), "guard", start, "guard",
          {{"phase", phase_label(Phase::Guard)}, {"begin", slice.begin}, {"end", slice.end}});
    }
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

double Trainer::unscale_and_clip_gradients() {
  // 1 / a power of two: exact, but where a value falls below float32's normal range.
  if (loss_scale_.enabled()) scale_gradients(1.0 / loss_scale_.scale());
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
  std::vector<RingRange> parts;
  for (int r = 0; r < ranks_; ++r) {
    for (const RingRange& slice : sharded_slices(length, towers, ranks_, r, slices_frame_)) {
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
  if (norm > limit) scale_gradients(limit / (norm + 1e-6));
  if (trace_ != nullptr) {
    trace_->span(int(towers_.size()), "clip", start, "master",
                 {{"phase", phase_label(Phase::UpdateAndBroadcast)}});
  }
  return norm;
}

void Trainer::scale_gradients(double coefficient) {
  if (!sharded()) {
    const Tensor& grads = towers_[0]->store->flat_grads();
    scale(grads, grads, coefficient, *towers_[0]->stream);
    return;
  }
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    TowerState& t = *towers_[i];
    const RingRange r = shards_->slice(i);
    const Tensor slice = t.store->flat_grads().slice(r.begin, r.end);
    scale(slice, slice, coefficient, *t.stream);
  }
}

void Trainer::update_and_broadcast() {
  if (sharded()) {
    update_slices_and_gather();
    return;
  }
  const auto start = Clock::now();
  TowerState& first = *towers_[0];
  if (one_memory_) {
    // The averaged gradient becomes the master's by trading the two buffers, not by a
    // copy: tower 0's backward assigns every value of the buffer it gets (run_tower).
    master_->swap_grads(*first.store);
  } else {
    transfer(master_->flat_grads(), *master_stream_, first.store->flat_grads(), *first.stream);
  }
  transfer(master_->flat_state(), *master_stream_, first.store->flat_state(), *first.stream);
  // In one memory the update writes the towers' one working copy too, each value
  // rounded as it is updated, where a pass of its own read them all again.
  const Tensor rounded = one_memory_ ? first.store->flat_working() : Tensor();
  optimizer_.step(*master_, master_->flat_grads(), *master_stream_, rounded);
  broadcast_values(rounded.defined());  // returns with the master stream finished
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
  if (shards_nccl_ != nullptr) {
    gather_on_nccl();
    return;
  }
  // Every process's slices meet in the host copy, framed as phase 5's gradient
  // (parallel/sharded_master.h), and go from there to every replica.
  const auto start = Clock::now();
  const Tensor& values = master_->flat_values();
  shards_->gather_values(values, *master_stream_);
  options_.process_group->allgather_chunks(
      std::span<float>(values.data<float>(), std::size_t(values.numel())),
      "step " + std::to_string(steps_taken()) + ": new values (all-gather)",
      ReduceFrame{0, std::size_t(slices_frame_)});
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

void Trainer::gather_on_nccl() {
  // Each tower's new slice into this process's block on tower 0's device, the
  // all-gather there (parallel/sharded_nccl.h), and tower 0's replica to the others.
  const auto start = Clock::now();
  TowerState& first = *towers_[0];
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    const RingRange r = shards_->slice(i);
    transfer(shards_nccl_->mine(r), *first.stream,
             towers_[i]->store->flat_values().slice(r.begin, r.end), *towers_[i]->stream);
  }
  shards_nccl_->all_gather(
      *nccl_processes_, first.store->flat_values(), *first.stream,
      "step " + std::to_string(steps_taken()) + ": new values (NCCL all-gather)");
  for (std::size_t i = 1; i < towers_.size(); ++i) {
    transfer(towers_[i]->store->flat_values(), *towers_[i]->stream, first.store->flat_values(),
             *first.stream);
  }
  if (trace_ != nullptr) {
    first.stream->synchronize();
    trace_->span(int(towers_.size()) + 2, "all-gather (NCCL): new values", start, "processes",
                 {{"bytes", shards_nccl_->block() * ranks_ * std::int64_t(sizeof(float))},
                  {"processes", ranks_},
                  {"phase", phase_label(Phase::UpdateAndBroadcast)}});
  }
}

void Trainer::broadcast() {
  broadcast_values(false);
}

void Trainer::broadcast_values(bool working_rounded) {
  if (sharded()) {
    // The host copy, up to date or written by the caller since, into the slices.
    gather_values();
    gather_slots();
    shards_->scatter(master_->flat_values(), optimizer_, *master_stream_);
  }
  for (auto& t : towers_) {
    if (!one_memory_) {
      transfer(t->store->flat_values(), *t->stream, master_->flat_values(), *master_stream_);
    }
    transfer(t->store->flat_state(), *t->stream, master_->flat_state(), *master_stream_);
  }
  // In one memory the replicas' values are the master's already; their one working
  // copy is rounded here, once, on every thread of the pool, unless the update did.
  if (one_memory_ && !working_rounded) towers_.front()->store->round_working(*master_stream_);
  // The one host wait of a step, and the reason a caller may read or write the
  // master (to_host on any stream, save_checkpoint, load_checkpoint) without
  // knowing master_stream_: the master stream has waited for every replica's copy,
  // so this also covers the update, the initialization and the copies themselves.
  master_stream_->synchronize();
}

}  // namespace towerlab
