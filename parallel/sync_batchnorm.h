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
//
// With a ProcessGroup (a trainer across processes), each call then goes on across
// the processes: once the rank's towers are merged, its first participant (one
// thread per rank) makes one collective, and the rank's other towers wait for its
// result. merge_stats gathers every rank's (count, mean, M2) with one
// allreduce_sum of a [ranks x (1 + 2C)] buffer in which each rank fills its own
// row, and merges the rows in rank order (Chan et al., as across towers), so
// unequal counts are exact and every rank computes the same bits; sum is one
// allreduce_sum of the rank's sums. Every rank must make the same calls: a rank
// without samples makes them through a stand-in tower whose partials count as none.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../autograd/nn.h"
#include "process_group.h"

namespace towerlab {

class TowerBatchNormSync final : public BatchNormSync {
 public:
  // `participants`: the towers with samples this step, in tower order. `group`
  // (optional): the processes to synchronize with after the towers; `step` names
  // the step in its calls' error messages.
  // `stand_in` (or -1): a participant whose partials count as none (zeros with
  // count 0), the trainer's way for a process without samples to make the calls.
  explicit TowerBatchNormSync(std::vector<int> participants, ProcessGroup* group = nullptr,
                              std::string step = {}, int stand_in = -1);

  std::int64_t merge_stats(int tower, const Tensor& mean, const Tensor& m2, std::int64_t count,
                           const Stream& stream) override;
  void sum(int tower, const Tensor& a, const Tensor& b, const Stream& stream) override;

  // Marks `tower` as done with the step: a participant still waiting for it in a
  // call it never made gets an error. Call it when a tower's work ends, failed or not.
  void finish(int tower, bool failed);

 private:
  // One participant and no other process: every call leaves its tensors as they
  // are (the same bits the exchange would give, without its copies and waits).
  bool alone() const { return participants_.size() == 1 && group_ == nullptr; }
  struct Published {
    Tensor a, b;
    std::int64_t count = 0;
    std::shared_ptr<Event> ready;
  };
  struct Call {
    std::map<int, Published> by_tower;
    // Across processes: the result of the rank's collective, on the host.
    bool reduced = false;
    std::vector<float> a, b;
    std::int64_t count = 0;
  };
  // Publishes, waits for every participant, returns the call's entries in tower
  // order; `index` receives the call's index.
  std::vector<Published> exchange(bool stats, int tower, const Tensor& a, const Tensor& b,
                                  std::int64_t count, const Stream& stream, std::size_t& index);
  // The rank's merged a, b (and count) replaced by every rank's, as the class
  // comment says; returns the total count.
  std::int64_t across_processes(bool stats, std::size_t index, int tower, const Tensor& a,
                                const Tensor& b, std::int64_t count, const Stream& stream);
  // The first participant's part: the collective itself, on host copies.
  void reduce_on_host(bool stats, std::vector<float>& a, std::vector<float>& b, std::int64_t& count,
                      std::size_t index);

  std::vector<int> participants_;
  int stand_in_ = -1;
  ProcessGroup* group_ = nullptr;
  std::string step_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<int, std::size_t> next_stats_, next_sums_;    // per tower: its next call index
  std::map<std::size_t, Call> stats_calls_, sum_calls_;  // by call index
  std::map<int, bool> finished_;
  bool failed_ = false;
};

}  // namespace towerlab
