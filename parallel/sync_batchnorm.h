// The collective behind synchronized batch norm (autograd/nn.h BatchNormSync),
// for one training step of the trainer's towers.
//
// Each participating tower runs on its own thread. A call publishes a copy of the
// tower's per-channel partials (with an event on its stream), waits until every
// participant has published the same call, then gathers all partials onto its own
// device and combines them in tower order, so every tower computes the same bits.
// Published copies live until the step ends, so no tower overwrites what another
// may still be reading.
//
// A tower that fails (or finishes without making the same calls as the others)
// aborts the collective: the towers waiting in it throw instead of hanging.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "autograd/nn.h"

namespace towerlab {

class TowerBatchNormSync final : public BatchNormSync {
 public:
  // `participants`: the towers with samples this step, in tower order.
  explicit TowerBatchNormSync(std::vector<int> participants);

  std::int64_t merge_stats(int tower, const Tensor& mean, const Tensor& m2, std::int64_t count,
                           const Stream& stream) override;
  void sum(int tower, const Tensor& a, const Tensor& b, const Stream& stream) override;

  // Marks `tower` as done with the step: a participant still waiting for it in a
  // call it never made gets an error. Call it when a tower's work ends, failed or not.
  void finish(int tower, bool failed);

 private:
  struct Published {
    Tensor a, b;
    std::int64_t count = 0;
    std::shared_ptr<Event> ready;
  };
  struct Call {
    std::map<int, Published> by_tower;
  };
  // Publishes, waits for every participant, returns the call's entries in tower order.
  std::vector<Published> exchange(bool stats, int tower, const Tensor& a, const Tensor& b,
                                  std::int64_t count, const Stream& stream);

  std::vector<int> participants_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<int, std::size_t> next_stats_, next_sums_;  // per tower: its next call index
  std::vector<Call> stats_calls_, sum_calls_;
  std::map<int, bool> finished_;
  bool failed_ = false;
};

}  // namespace towerlab
