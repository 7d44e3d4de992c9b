// Where a Trainer puts its work (parallel/trainer.h): a requested device placed
// (soft placement), the processes' agreement on the model checked at construction,
// and the placement log (TrainerOptions::log_placement).
#include <iostream>
#include <string>
#include <vector>

#include "engine/error.h"
#include "parallel/buckets.h"
#include "parallel/fingerprint.h"
#include "parallel/process_group.h"
#include "parallel/sharded_master.h"
#include "parallel/trainer.h"

namespace towerlab {

Device place_device(Device requested, bool soft_placement, std::ostream& log) {
  try {
    check_available(requested);
    return requested;
  } catch (const DeviceError& e) {
    if (!soft_placement) throw;
    const Device fallback =
        requested.is_cuda() && cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu();
    log << "towerlab: warning: " << requested.str() << " is not available; placing its work on "
        << fallback.str() << " (soft placement)\n";
    return fallback;
  }
}

std::ostream& Trainer::log() const {
  return options_.log != nullptr ? *options_.log : std::clog;
}

void Trainer::check_processes_agree() const {
  // The devices as placed: soft placement may have moved a tower to another kind.
  TrainerOptions placed = options_;
  placed.devices = devices_;
  placed.master = master_device_;
  const std::vector<std::string> all = options_.process_group->allgather(
      trainer_fingerprint(variables_, DType::Float32, optimizer_, placed),
      "trainer startup: fingerprints");
  const std::string difference = first_fingerprint_difference(all);
  TL_CHECK(difference.empty(), InvalidArgument,
           "Trainer: the " << ranks_ << " processes do not train the same model the same way ("
                           << difference
                           << "); every process must declare the same variables in the same "
                              "order and use the same optimizer and step options");
}

void Trainer::log_placement() const {
  std::ostream& log = this->log();
  if (options_.process_group != nullptr) {
    log << "placement: process " << rank_ << " of " << ranks_ << " (local rank "
        << options_.process_group->local_rank() << ")\n";
    log << "placement: across processes, gradients and moving statistics by "
        << (nccl_processes_ != nullptr ? "NCCL on " + devices_[0].str() : "the process group")
        << " (" << cross_process_path_ << ")\n";
  }
  // devices_: each tower's device, as placed.
  if (sharded()) {
    log << "placement: master variables and optimizer slots sharded across the " << devices_.size()
        << " tower(s) (a host copy for master() on " << master_device_.str()
        << ", gathered on demand)\n";
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      const RingRange r = shards_->slice(i);
      log << "placement: tower " << i << " owns and updates elements [" << r.begin << ", " << r.end
          << ") of the flat master on " << devices_[i].str() << "\n";
    }
  } else {
    log << "placement: master variables on " << master_device_.str() << "; " << devices_.size()
        << " tower(s)\n";
  }
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    log << "placement: tower " << i << " runs forward and backward on " << devices_[i].str()
        << " (its own " << (devices_[i].is_cpu() ? "host thread" : "CUDA stream and host thread")
        << ")\n";
  }
  for (const VariableSpec& v : variables_.specs()) {
    log << "placement: variable " << v.name << " " << to_string(v.shape)
        << (v.trainable ? "" : " (state)") << ": master "
        << (sharded() && v.trainable
                ? "sharded (elements [" + std::to_string(v.offset) + ", " +
                      std::to_string(v.offset + v.numel()) + ") of the flat master)"
                : "on " + master_device_.str())
        << ", replicas on";
    for (Device d : devices_) log << " " << d.str();
    log << "\n";
  }
  log << "placement: gradients all-reduced by "
      << (options_.reduction == AllReduce::Ring          ? "ring"
          : options_.reduction == AllReduce::ReduceToOne ? "reduction to one device"
                                                         : "NCCL")
      << (sharded() ? " (reduce-scatter and all-gather around the update)" : "") << "; optimizer "
      << optimizer_.name() << " runs on "
      << (sharded() ? "every tower, on its slice" : master_device_.str()) << "\n";
  if (bucketed()) {
    log << "placement: the gradient is reduced in " << buckets_->buckets().size()
        << " buckets (bucket_bytes " << options_.bucket_bytes
        << ") while the backward runs, on a reducer thread";
    if (options_.process_group != nullptr) {
      log << (buckets_across_processes_ ? " that also makes each bucket's cross-process call"
              : nccl_processes_ != nullptr
                  ? "; across processes in the step's NCCL call"
                  : "; across processes in the step's one call (synchronized batch norm makes "
                    "collectives during the backward)");
    }
    log << "\n";
  }
}

}  // namespace towerlab
